//! A minimal protobuf wire-format reader for the importers: enough to pull a
//! label out of a `tf.train.Example` or a Caffe `Datum`. The bytes come from
//! user files, so every read is bounds-checked and malformed input is an
//! error value, never a panic.

/// The input is not valid protobuf wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

/// A field's payload, by wire type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    /// Length-delimited: bytes, strings, sub-messages, packed repeated fields.
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Longest valid varint: 64 bits at 7 bits per byte.
const MAX_VARINT_BYTES: usize = 10;

/// Largest field number protobuf allows (2^29 - 1).
const MAX_FIELD_NUMBER: u64 = (1 << 29) - 1;

/// Decode a varint at the start of `buf`: the value and the bytes it used.
fn read_varint(buf: &[u8]) -> Result<(u64, usize), Malformed> {
    let mut value = 0u64;
    for (i, &byte) in buf.iter().take(MAX_VARINT_BYTES).enumerate() {
        let bits = u64::from(byte & 0x7f);
        // The tenth byte holds only bit 63; anything more would overflow u64.
        if i == MAX_VARINT_BYTES - 1 && bits > 1 {
            return Err(Malformed);
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    // Either the input ended inside the varint or it ran past ten bytes.
    Err(Malformed)
}

/// Appends `v` as a varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends field `number` as length-delimited `payload` (bytes, a string, a
/// sub-message or a packed list).
pub(crate) fn put_bytes(out: &mut Vec<u8>, number: u32, payload: &[u8]) {
    put_varint(out, u64::from(number) << 3 | 2);
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// The fields of one message as (field number, value), in wire order.
/// Yields `Err(Malformed)` once and then stops if the message is cut short
/// or otherwise invalid.
pub(crate) fn fields(message: &[u8]) -> Fields<'_> {
    Fields {
        rest: message,
        failed: false,
    }
}

pub(crate) struct Fields<'a> {
    rest: &'a [u8],
    failed: bool,
}

impl<'a> Fields<'a> {
    fn next_field(&mut self) -> Result<(u32, Value<'a>), Malformed> {
        let (tag, used) = read_varint(self.rest)?;
        let mut rest = &self.rest[used..];
        let number = tag >> 3;
        if number == 0 || number > MAX_FIELD_NUMBER {
            return Err(Malformed);
        }
        let value = match tag & 7 {
            0 => {
                let (v, used) = read_varint(rest)?;
                rest = &rest[used..];
                Value::Varint(v)
            }
            1 => {
                let (bytes, tail) = rest.split_first_chunk::<8>().ok_or(Malformed)?;
                rest = tail;
                Value::Fixed64(u64::from_le_bytes(*bytes))
            }
            2 => {
                let (len, used) = read_varint(rest)?;
                rest = &rest[used..];
                let len = usize::try_from(len).map_err(|_| Malformed)?;
                if len > rest.len() {
                    return Err(Malformed);
                }
                let (bytes, tail) = rest.split_at(len);
                rest = tail;
                Value::Bytes(bytes)
            }
            5 => {
                let (bytes, tail) = rest.split_first_chunk::<4>().ok_or(Malformed)?;
                rest = tail;
                Value::Fixed32(u32::from_le_bytes(*bytes))
            }
            // Groups (3, 4) are deprecated and used by neither message we
            // read; 6 and 7 are not wire types at all.
            _ => return Err(Malformed),
        };
        self.rest = rest;
        // Fits: checked against MAX_FIELD_NUMBER above.
        Ok((number as u32, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let field = self.next_field();
        self.failed = field.is_err();
        Some(field)
    }
}

/// The first value of a packed repeated varint field (`[packed = true]`
/// payload); `Ok(None)` if the payload is empty. The rest is still checked,
/// since a malformed tail means the message is malformed.
pub(crate) fn first_packed_varint(payload: &[u8]) -> Result<Option<u64>, Malformed> {
    let mut first = None;
    let mut rest = payload;
    while !rest.is_empty() {
        let (value, used) = read_varint(rest)?;
        first.get_or_insert(value);
        rest = &rest[used..];
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    #[test]
    fn varints_round_trip() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let bytes = varint(v);
            assert_eq!(read_varint(&bytes), Ok((v, bytes.len())), "{v}");
        }
        assert_eq!(varint(u64::MAX).len(), 10);
        // Trailing bytes after the varint are not consumed.
        assert_eq!(read_varint(&[0x96, 0x01, 0xff]), Ok((150, 2)));
    }

    #[test]
    fn truncated_varint_is_malformed() {
        assert_eq!(read_varint(&[]), Err(Malformed));
        assert_eq!(read_varint(&[0x80]), Err(Malformed));
        assert_eq!(read_varint(&[0xff, 0xff, 0xff]), Err(Malformed));
    }

    #[test]
    fn varint_over_ten_bytes_is_malformed() {
        let mut eleven = vec![0x80; 10];
        eleven.push(0x00);
        assert_eq!(read_varint(&eleven), Err(Malformed));
        // Ten bytes whose last carries more than bit 63 overflow u64.
        let mut overflow = vec![0xff; 9];
        overflow.push(0x02);
        assert_eq!(read_varint(&overflow), Err(Malformed));
    }

    #[test]
    fn reads_every_wire_type() {
        let mut msg = Vec::new();
        msg.extend(varint(1 << 3)); // field 1, varint
        msg.extend(varint(150));
        msg.extend(varint((2 << 3) | 1)); // field 2, fixed64
        msg.extend(0x0102_0304_0506_0708u64.to_le_bytes());
        msg.extend(varint((3 << 3) | 2)); // field 3, bytes
        msg.extend(varint(3));
        msg.extend(b"abc");
        msg.extend(varint((4 << 3) | 5)); // field 4, fixed32
        msg.extend(0xdead_beefu32.to_le_bytes());
        msg.extend(varint((MAX_FIELD_NUMBER << 3) | 2)); // empty bytes
        msg.extend(varint(0));

        let got: Vec<_> = fields(&msg).collect();
        assert_eq!(
            got,
            vec![
                Ok((1, Value::Varint(150))),
                Ok((2, Value::Fixed64(0x0102_0304_0506_0708))),
                Ok((3, Value::Bytes(b"abc"))),
                Ok((4, Value::Fixed32(0xdead_beef))),
                Ok((MAX_FIELD_NUMBER as u32, Value::Bytes(b""))),
            ]
        );
    }

    /// Collect a message's fields, or the first error.
    fn parse(msg: &[u8]) -> Result<Vec<(u32, Value<'_>)>, Malformed> {
        fields(msg).collect()
    }

    #[test]
    fn empty_message_has_no_fields() {
        assert_eq!(parse(&[]), Ok(vec![]));
    }

    #[test]
    fn length_past_the_end_is_malformed() {
        assert_eq!(parse(&[(1 << 3) | 2, 4, b'a', b'b', b'c']), Err(Malformed));
        // A length that does not even fit in usize on any platform.
        let mut huge = vec![(1 << 3) | 2];
        huge.extend(varint(u64::MAX));
        assert_eq!(parse(&huge), Err(Malformed));
    }

    #[test]
    fn truncated_fields_are_malformed() {
        assert_eq!(parse(&[1 << 3]), Err(Malformed), "varint value missing");
        assert_eq!(parse(&[1 << 3, 0x80]), Err(Malformed), "varint value cut");
        assert_eq!(parse(&[(1 << 3) | 1, 0, 0, 0]), Err(Malformed), "fixed64");
        assert_eq!(parse(&[(1 << 3) | 5, 0, 0]), Err(Malformed), "fixed32");
        assert_eq!(parse(&[(1 << 3) | 2]), Err(Malformed), "length missing");
        assert_eq!(parse(&[0x88]), Err(Malformed), "tag cut");
    }

    #[test]
    fn bad_tags_are_malformed() {
        assert_eq!(parse(&[0]), Err(Malformed), "field number 0");
        assert_eq!(parse(&[(1 << 3) | 3]), Err(Malformed), "start group");
        assert_eq!(parse(&[(1 << 3) | 4]), Err(Malformed), "end group");
        assert_eq!(parse(&[(1 << 3) | 6, 0]), Err(Malformed), "wire type 6");
        assert_eq!(parse(&[(1 << 3) | 7, 0]), Err(Malformed), "wire type 7");
        let mut too_big = varint((MAX_FIELD_NUMBER + 1) << 3);
        too_big.push(0);
        assert_eq!(parse(&too_big), Err(Malformed), "field number 2^29");
    }

    #[test]
    fn iteration_stops_after_an_error() {
        // A good field, then a bad tag, then what would parse as a field.
        let msg = [1 << 3, 7, 0, 1 << 3, 8];
        let got: Vec<_> = fields(&msg).collect();
        assert_eq!(got, vec![Ok((1, Value::Varint(7))), Err(Malformed)]);
    }

    #[test]
    fn packed_varints() {
        assert_eq!(first_packed_varint(&[]), Ok(None));
        let mut payload = varint(300);
        payload.extend(varint(5));
        assert_eq!(first_packed_varint(&payload), Ok(Some(300)));
        payload.push(0x80); // a cut-off third value
        assert_eq!(first_packed_varint(&payload), Err(Malformed));
    }
}
