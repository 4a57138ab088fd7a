//! Where `brand pack` gets samples from. A source lists its samples up front
//! (key and label, cheap) and reads any one on demand, from any thread, so the
//! packer can shuffle first and read in packed order without holding the
//! dataset in memory.
//!
//! The listing is held compactly, a few bytes per sample plus the key bytes:
//! sources keep keys in an [`Entries`] arena (one buffer of key bytes, not an
//! allocation per sample) or derive them on demand (TFRecord's `file:record`),
//! and hand them out by index.

use std::borrow::Cow;

use brand_format::error::Result;

pub trait Source: Sync {
    /// dir, list, tfrecord or lmdb.
    fn kind(&self) -> &'static str;

    /// How many samples the source lists. Samples are numbered `0..len()`
    /// in the source's natural order (the order the pack seed shuffles; it
    /// must be deterministic for a given input).
    fn len(&self) -> usize;

    /// Whether the source lists no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `i`'s original name (relative path, `file:record`, LMDB key);
    /// `i < len()`.
    fn key(&self, i: usize) -> Cow<'_, [u8]>;

    /// Sample `i`'s class label, or -1 where the source has none; `i < len()`.
    fn label(&self, i: usize) -> i64;

    /// The bytes of sample `i`. Errors name the file and position (path,
    /// record number, byte offset, key).
    fn read(&self, i: usize) -> Result<Vec<u8>>;

    /// Class names by label, where the source has them.
    fn label_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// What identifies the inputs beyond their names (tar, MDS, Parquet:
    /// every input file's size and time, or object's entity tag), for a
    /// pack's checkpoint; empty where the source does not say.
    fn inputs_identity(&self) -> &str {
        ""
    }

    /// Heap bytes the source holds to list its samples (keys, labels,
    /// locations), for memory accounting; 0 where the source does not say.
    fn listing_bytes(&self) -> usize {
        0
    }
}

/// Keys and labels of many samples in a few allocations: every key's bytes
/// in one buffer, where each key ends in a column, and the labels in another,
/// both columns as narrow as their values so far need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    bytes: Vec<u8>,
    ends: Ints,
    labels: Ints,
}

impl Entries {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the next sample.
    pub fn push(&mut self, key: &[u8], label: i64) {
        self.bytes.extend_from_slice(key);
        // A Vec never holds more than isize::MAX bytes.
        self.ends.push(self.bytes.len() as i64);
        self.labels.push(label);
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `i`'s key; `i < len()`.
    pub fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends.get(i - 1) as usize };
        &self.bytes[start..self.ends.get(i) as usize]
    }

    /// Sample `i`'s label; `i < len()`.
    pub fn label(&self, i: usize) -> i64 {
        self.labels.get(i)
    }

    /// Replaces every label by `f(label)`: for sources that number classes
    /// only once they have seen them all.
    pub fn relabel(&mut self, f: impl Fn(i64) -> i64) {
        let mut labels = Ints::default();
        (0..self.labels.len()).for_each(|i| labels.push(f(self.labels.get(i))));
        self.labels = labels;
    }

    /// `(key, label)` of every sample, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], i64)> + '_ {
        (0..self.len()).map(|i| (self.key(i), self.label(i)))
    }

    /// Gives back the spare capacity the listing grew into.
    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
        self.labels.shrink_to_fit();
    }

    /// Heap bytes held (capacity, not length).
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.heap_bytes() + self.labels.heap_bytes()
    }
}

impl<K: AsRef<[u8]>> FromIterator<(K, i64)> for Entries {
    fn from_iter<I: IntoIterator<Item = (K, i64)>>(iter: I) -> Self {
        let mut entries = Entries::new();
        for (key, label) in iter {
            entries.push(key.as_ref(), label);
        }
        entries
    }
}

/// A column of integers stored at the narrowest width that holds every
/// value pushed so far, widened (once per width) when a value needs more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ints {
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Default for Ints {
    fn default() -> Self {
        Ints::I8(Vec::new())
    }
}

impl Ints {
    pub fn push(&mut self, v: i64) {
        loop {
            match self {
                Ints::I8(c) => match i8::try_from(v) {
                    Ok(x) => return c.push(x),
                    Err(_) => *self = Ints::I16(c.iter().map(|&x| x.into()).collect()),
                },
                Ints::I16(c) => match i16::try_from(v) {
                    Ok(x) => return c.push(x),
                    Err(_) => *self = Ints::I32(c.iter().map(|&x| x.into()).collect()),
                },
                Ints::I32(c) => match i32::try_from(v) {
                    Ok(x) => return c.push(x),
                    Err(_) => *self = Ints::I64(c.iter().map(|&x| x.into()).collect()),
                },
                Ints::I64(c) => return c.push(v),
            }
        }
    }

    /// Value `i`; `i < len()`.
    pub fn get(&self, i: usize) -> i64 {
        match self {
            Ints::I8(c) => c[i].into(),
            Ints::I16(c) => c[i].into(),
            Ints::I32(c) => c[i].into(),
            Ints::I64(c) => c[i],
        }
    }

    /// How many values were pushed.
    pub fn len(&self) -> usize {
        match self {
            Ints::I8(c) => c.len(),
            Ints::I16(c) => c.len(),
            Ints::I32(c) => c.len(),
            Ints::I64(c) => c.len(),
        }
    }

    /// Whether no value was pushed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gives back the spare capacity the column grew into.
    pub fn shrink_to_fit(&mut self) {
        match self {
            Ints::I8(c) => c.shrink_to_fit(),
            Ints::I16(c) => c.shrink_to_fit(),
            Ints::I32(c) => c.shrink_to_fit(),
            Ints::I64(c) => c.shrink_to_fit(),
        }
    }

    pub fn heap_bytes(&self) -> usize {
        match self {
            Ints::I8(c) => c.capacity(),
            Ints::I16(c) => c.capacity() * 2,
            Ints::I32(c) => c.capacity() * 4,
            Ints::I64(c) => c.capacity() * 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_widen_as_values_need_and_keep_every_value() {
        let values = [0, -1, 127, -128, 128, 40_000, -40_000, 1 << 40, i64::MIN, i64::MAX, 5];
        let mut c = Ints::default();
        for (n, &v) in values.iter().enumerate() {
            c.push(v);
            assert_eq!(c.len(), n + 1);
            for (i, &w) in values[..=n].iter().enumerate() {
                assert_eq!(c.get(i), w, "value {i} after {n} pushes");
            }
        }
        assert!(matches!(c, Ints::I64(_)));
        let mut small = Ints::default();
        (0..1000).for_each(|i| small.push(i % 100 - 50));
        assert!(matches!(small, Ints::I8(_)));
    }

    #[test]
    fn entries_keep_keys_and_labels_in_order() {
        let list: Vec<(Vec<u8>, i64)> = (0..3000)
            .map(|i| (format!("class-{}/{i}", i % 7).into_bytes(), (i % 300) - 1))
            .chain([(Vec::new(), i64::MAX), (b"last".to_vec(), -1)])
            .collect();
        let mut e: Entries = list.iter().map(|(k, l)| (k, *l)).collect();
        e.shrink_to_fit();
        assert_eq!(e.len(), list.len());
        for (i, (k, l)) in list.iter().enumerate() {
            assert_eq!((e.key(i), e.label(i)), (k.as_slice(), *l), "entry {i}");
        }
        assert!(e.iter().map(|(k, l)| (k.to_vec(), l)).eq(list.iter().cloned()));
        let key_bytes: usize = list.iter().map(|(k, _)| k.len()).sum();
        // Key bytes, a 4-byte end and an 8-byte label (one label needs 64 bits).
        assert!(e.heap_bytes() <= key_bytes + 12 * list.len(), "{}", e.heap_bytes());
    }
}
