//! Where samples go in the shared memory: a first-fit allocator of
//! 64-byte-aligned regions (a sample's bytes start 64-byte aligned, as in
//! a loader's own buffers) that merges a freed region with its neighbours.

use std::collections::BTreeMap;

pub const ALIGN: u64 = 64;

pub struct Arena {
    /// Free regions: offset → length.
    free: BTreeMap<u64, u64>,
    len: u64,
    used: u64,
}

/// What a sample of `len` bytes takes.
pub fn footprint(len: u64) -> u64 {
    len.max(1).div_ceil(ALIGN) * ALIGN
}

impl Arena {
    pub fn new(len: u64) -> Self {
        let len = len / ALIGN * ALIGN;
        let mut free = BTreeMap::new();
        if len > 0 {
            free.insert(0, len);
        }
        Arena { free, len, used: 0 }
    }

    /// A region for `len` bytes, if one is free.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let need = footprint(len);
        let (&at, &size) = self.free.iter().find(|(_, s)| **s >= need)?;
        self.free.remove(&at);
        if size > need {
            self.free.insert(at + need, size - need);
        }
        self.used += need;
        Some(at)
    }

    /// Gives back the region at `at` allocated for `len` bytes.
    pub fn free(&mut self, at: u64, len: u64) {
        let mut at = at;
        let mut size = footprint(len);
        self.used -= size;
        if let Some((&next, &n)) = self.free.range(at + size..).next()
            && next == at + size
        {
            self.free.remove(&next);
            size += n;
        }
        if let Some((&prev, &p)) = self.free.range(..at).next_back()
            && prev + p == at
        {
            self.free.remove(&prev);
            at = prev;
            size += p;
        }
        self.free.insert(at, size);
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn size(&self) -> u64 {
        self.len
    }

    pub fn available(&self) -> u64 {
        self.len - self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_and_freed_ones_merge_back() {
        let mut a = Arena::new(1024);
        let x = a.alloc(100).expect("room");
        let y = a.alloc(64).expect("room");
        let z = a.alloc(500).expect("room");
        assert_eq!((x, y, z), (0, 128, 192));
        assert!(a.alloc(400).is_none(), "only 320 left");
        a.free(y, 64);
        a.free(x, 100);
        assert_eq!(a.alloc(150), Some(0), "x and y merged");
        a.free(0, 150);
        a.free(z, 500);
        assert_eq!((a.used(), a.alloc(1024)), (0, Some(0)));
    }
}
