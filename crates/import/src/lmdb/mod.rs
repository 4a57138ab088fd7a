//! LMDB environments as a pack source: Caffe datum databases (DESIGN.md §2,
//! seeds/004) or any LMDB whose main database maps keys to samples.
//!
//! Samples are the main database's key/value pairs in LMDB's key order
//! (sorted bytes, so deterministic). Values are returned as stored; a value
//! that is a Caffe `Datum` carrying a label gives the sample its label.
//!
//! The data file is read by [`btree`], in pure Rust with positioned reads,
//! never memory-mapped, nothing in it trusted.

#![forbid(unsafe_code)]

pub mod btree;

use std::borrow::Cow;
use std::path::Path;

use brand_format::error::{Error, Result};
use brand_pack::source::{Entries, Source};

use crate::protobuf::{self, Value};
use btree::{DataFile, NodeAt, show_key};

/// The samples of an LMDB environment, opened read-only.
#[derive(Debug)]
pub struct LmdbSource {
    data: DataFile,
    /// Keys (in one arena) and labels, by entry index.
    entries: Entries,
    /// Where each entry's node is, by entry index, as [`NodeAt::packed`].
    nodes: Vec<u64>,
}

impl LmdbSource {
    /// Open the environment at `path` (a directory holding `data.mdb`, or
    /// the data file itself) read-only and list its keys and labels.
    pub fn open(path: &Path) -> Result<Self> {
        let (data, main) = DataFile::open(path)?;
        let mut entries = Entries::new();
        let mut nodes = Vec::new();
        data.walk_main(&main, |at, key, value| {
            let packed = at.packed().ok_or_else(|| {
                format!(
                    "key {}: node {} of page {} is beyond what this importer can address",
                    show_key(key),
                    at.index,
                    at.page
                )
            })?;
            entries.push(key, caffe_datum_label(value).unwrap_or(-1));
            nodes.push(packed);
            Ok(())
        })?;
        if entries.is_empty() {
            return Err(Error::input(path, "open", "the database is empty"));
        }
        entries.shrink_to_fit();
        nodes.shrink_to_fit();
        Ok(LmdbSource { data, entries, nodes })
    }
}

impl Source for LmdbSource {
    fn kind(&self) -> &'static str {
        "lmdb"
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn key(&self, i: usize) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.entries.key(i))
    }

    fn label(&self, i: usize) -> i64 {
        self.entries.label(i)
    }

    fn read(&self, i: usize) -> Result<Vec<u8>> {
        let (Some(key), Some(at)) = (
            (i < self.entries.len()).then(|| self.entries.key(i)),
            self.nodes.get(i).copied().map(NodeAt::unpacked),
        ) else {
            return Err(Error::config(format!(
                "sample {i} out of range: the LMDB database has {} keys",
                self.entries.len()
            )));
        };
        self.data.value(at, key)
    }

    fn listing_bytes(&self) -> usize {
        self.entries.heap_bytes() + self.nodes.capacity() * 8
    }
}

/// The label of a serialized Caffe `Datum`, or None if `value` has no label
/// or is not a Datum (a field Datum lacks, a wrong wire type, or bytes that
/// are not protobuf at all).
///
/// ```text
/// message Datum { optional int32 channels = 1; optional int32 height = 2;
///   optional int32 width = 3; optional bytes data = 4; optional int32 label = 5;
///   repeated float float_data = 6; optional bool encoded = 7; }
/// ```
fn caffe_datum_label(value: &[u8]) -> Option<i64> {
    let mut label = None;
    for field in protobuf::fields(value) {
        match field.ok()? {
            (1 | 2 | 3 | 7, Value::Varint(_)) | (4, Value::Bytes(_)) => {}
            // int32 is sign-extended to 64 bits on the wire; protobuf keeps
            // the low 32. The last occurrence wins.
            (5, Value::Varint(v)) => label = Some(i64::from(v as i32)),
            // float_data: unpacked (Caffe's proto2 default) or packed.
            (6, Value::Fixed32(_)) => {}
            (6, Value::Bytes(packed)) if packed.len() % 4 == 0 => {}
            _ => return None,
        }
    }
    label
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datum_labels() {
        // channels 3, height 2, width 1, data "abcdef", label 7, encoded false.
        let datum = [
            0x08, 3, 0x10, 2, 0x18, 1, 0x22, 6, b'a', b'b', b'c', b'd', b'e', b'f', 0x28, 7, 0x38, 0,
        ];
        assert_eq!(caffe_datum_label(&datum), Some(7));
        // Unpacked and packed float_data.
        let floats = [0x35, 0, 0, 0x80, 0x3f, 0x32, 4, 0, 0, 0, 0x40, 0x28, 1];
        assert_eq!(caffe_datum_label(&floats), Some(1));
        // A negative int32 label: ten-byte sign-extended varint.
        let negative = [0x28, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(caffe_datum_label(&negative), Some(-2));
        // Bits above 32 are dropped, as protobuf does for int32.
        let wide = [0x28, 0x81, 0x80, 0x80, 0x80, 0x10];
        assert_eq!(caffe_datum_label(&wide), Some(1));
        // The last label wins.
        assert_eq!(caffe_datum_label(&[0x28, 1, 0x28, 2]), Some(2));
    }

    #[test]
    fn non_datums_have_no_label() {
        assert_eq!(caffe_datum_label(b""), None, "empty Datum, no label");
        assert_eq!(caffe_datum_label(&[0x08, 3]), None, "no label field");
        assert_eq!(caffe_datum_label(&[0x28, 1, 0x40, 1]), None, "field 8");
        assert_eq!(caffe_datum_label(&[0x2a, 1, 0, 0x28, 1]), None, "label as bytes");
        assert_eq!(
            caffe_datum_label(&[0x32, 3, 0, 0, 0, 0x28, 1]),
            None,
            "packed floats cut"
        );
        assert_eq!(caffe_datum_label(&[0x28, 1, 0x22, 9, 0]), None, "data past the end");
        assert_eq!(caffe_datum_label(b"\x89PNG\r\n\x1a\n"), None, "PNG bytes");
    }
}
