//! Just enough of the flatbuffers wire format to read Arrow's `Message`
//! and `Schema` tables, every read bounds-checked against the metadata.
//!
//! Every read is checked: a damaged or hostile buffer gives an error naming
//! the offset, never a panic (fuzzed: `fuzz/fuzz_targets/flatbuffers.rs`).

pub type Res<T> = std::result::Result<T, String>;

pub fn bytes<const N: usize>(buf: &[u8], at: usize) -> Res<[u8; N]> {
    at.checked_add(N)
        .and_then(|end| buf.get(at..end))
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| {
            format!(
                "flatbuffer read of {N} bytes at {at} is past the metadata's {} bytes",
                buf.len()
            )
        })
}

/// The target of the unsigned offset stored at `at`.
fn follow(buf: &[u8], at: usize) -> Res<usize> {
    let rel = u32::from_le_bytes(bytes(buf, at)?) as usize;
    at.checked_add(rel)
        .filter(|&t| t < buf.len())
        .ok_or_else(|| format!("flatbuffer offset at {at} points past the metadata"))
}

#[derive(Clone, Copy)]
pub struct Table<'a> {
    buf: &'a [u8],
    pos: usize,
    vtable: usize,
    vtable_len: usize,
}

impl<'a> Table<'a> {
    pub fn root(buf: &'a [u8]) -> Res<Self> {
        Self::at(buf, follow(buf, 0)?)
    }

    fn at(buf: &'a [u8], pos: usize) -> Res<Self> {
        let back = i64::from(i32::from_le_bytes(bytes(buf, pos)?));
        let vtable = i64::try_from(pos)
            .ok()
            .and_then(|p| p.checked_sub(back))
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| format!("flatbuffer table at {pos} has its vtable outside the metadata"))?;
        let vtable_len = u16::from_le_bytes(bytes(buf, vtable)?) as usize;
        if vtable_len < 4 || vtable.saturating_add(vtable_len) > buf.len() {
            return Err(format!(
                "flatbuffer vtable at {vtable} ({vtable_len} bytes) is malformed or past the metadata"
            ));
        }
        Ok(Table {
            buf,
            pos,
            vtable,
            vtable_len,
        })
    }

    /// Where field `id` is stored, if present.
    fn field(&self, id: usize) -> Res<Option<usize>> {
        let slot = 4 + 2 * id;
        if slot + 2 > self.vtable_len {
            return Ok(None);
        }
        let off = u16::from_le_bytes(bytes(self.buf, self.vtable + slot)?) as usize;
        Ok((off != 0).then(|| self.pos + off))
    }

    fn scalar<const N: usize>(&self, id: usize) -> Res<Option<[u8; N]>> {
        self.field(id)?.map(|at| bytes(self.buf, at)).transpose()
    }

    pub fn i64(&self, id: usize, default: i64) -> Res<i64> {
        Ok(self.scalar(id)?.map_or(default, i64::from_le_bytes))
    }

    pub fn i32(&self, id: usize, default: i32) -> Res<i32> {
        Ok(self.scalar(id)?.map_or(default, i32::from_le_bytes))
    }

    pub fn i16(&self, id: usize, default: i16) -> Res<i16> {
        Ok(self.scalar(id)?.map_or(default, i16::from_le_bytes))
    }

    pub fn u8(&self, id: usize, default: u8) -> Res<u8> {
        Ok(self.scalar::<1>(id)?.map_or(default, |[b]| b))
    }

    pub fn table(&self, id: usize) -> Res<Option<Table<'a>>> {
        match self.field(id)? {
            Some(at) => Ok(Some(Table::at(self.buf, follow(self.buf, at)?)?)),
            None => Ok(None),
        }
    }

    /// A vector's first element and length.
    fn vector(&self, id: usize) -> Res<Option<(usize, usize)>> {
        let Some(at) = self.field(id)? else {
            return Ok(None);
        };
        let target = follow(self.buf, at)?;
        let len = u32::from_le_bytes(bytes(self.buf, target)?) as usize;
        Ok(Some((target + 4, len)))
    }

    /// A vector of `size`-byte structs (or a string, size 1) as bytes.
    pub fn bytes(&self, id: usize, size: usize) -> Res<&'a [u8]> {
        let Some((start, len)) = self.vector(id)? else {
            return Ok(&[]);
        };
        len.checked_mul(size)
            .and_then(|n| start.checked_add(n))
            .and_then(|end| self.buf.get(start..end))
            .ok_or_else(|| format!("flatbuffer vector at {start} ({len} elements) runs past the metadata"))
    }

    pub fn string(&self, id: usize) -> Res<String> {
        Ok(String::from_utf8_lossy(self.bytes(id, 1)?).into_owned())
    }

    pub fn tables(&self, id: usize) -> Res<Vec<Table<'a>>> {
        let Some((start, len)) = self.vector(id)? else {
            return Ok(Vec::new());
        };
        if len.saturating_mul(4) > self.buf.len() {
            return Err(format!("flatbuffer vector at {start} claims {len} tables"));
        }
        (0..len)
            .map(|i| Table::at(self.buf, follow(self.buf, start + 4 * i)?))
            .collect()
    }
}
