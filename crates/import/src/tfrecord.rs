//! TFRecord files as a pack source.
//!
//! A TFRecord file is a sequence of records, each framed as
//! `u64 length (LE) | u32 masked crc32c of the length | data | u32 masked
//! crc32c of the data`. `open` walks the framing once and remembers where
//! each record's data is; `read` fetches one record's data and checks it.
//! The data is returned as-is: a serialized `tf.train.Example` stays
//! serialized, so TensorFlow can parse it after loading.

use std::borrow::Cow;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::protobuf::{self, Malformed, Value};
use brand_format::error::{Error, IoContext, Result};
use brand_pack::source::{Ints, Source};

/// Bytes before a record's data: its length and the length's masked crc.
const HEADER_LEN: u64 = 12;
/// Bytes after a record's data: the data's masked crc.
const FOOTER_LEN: u64 = 4;

fn position(number: u64, offset: u64) -> String {
    format!("record {number} at byte {offset}")
}

/// One input file, with the range of records it holds.
#[derive(Debug)]
struct InputFile {
    path: PathBuf,
    /// Index of its first record among all the source's records.
    first: usize,
    /// Where its last record ends (the file's length when it was scanned).
    end: u64,
}

/// Records of one or more TFRecord files, in file order and then record
/// order. Per record only the offset of its header (8 bytes) and its label
/// (as narrow as the labels allow) are held: the file, the record's number
/// in it and its length follow from its neighbours (records are contiguous),
/// and its key `file:number` is made when asked for.
#[derive(Debug)]
pub struct TfRecordSource {
    files: Vec<InputFile>,
    /// Byte offset of each record's header in its file.
    offsets: Vec<u64>,
    labels: Ints,
}

/// Where one record's data lives.
struct Record<'a> {
    path: &'a Path,
    /// Position of the record in its file, counting from 0.
    number: u64,
    /// Byte offset of the record's header in its file.
    offset: u64,
    /// Length of the record's data.
    len: u64,
}

impl Record<'_> {
    fn position(&self) -> String {
        position(self.number, self.offset)
    }
}

impl TfRecordSource {
    /// Scan `paths` (files, or directories whose regular files are taken in
    /// name order) and list every record. With `label_feature`, each record
    /// is read during the scan and, if it is a `tf.train.Example` with an
    /// int64 feature of that name, the feature's first value is its label;
    /// otherwise the label is -1.
    pub fn open(paths: &[PathBuf], label_feature: Option<&str>) -> Result<Self> {
        let inputs = expand_inputs(paths)?;
        let mut scan = Scan {
            offsets: Vec::new(),
            labels: Ints::default(),
            label_feature: label_feature.map(str::as_bytes),
            data: Vec::new(),
        };
        let mut files = Vec::with_capacity(inputs.len());
        for path in inputs {
            let first = scan.offsets.len();
            let end = scan.file(&path)?;
            files.push(InputFile { path, first, end });
        }
        if scan.offsets.is_empty() {
            let Some(first) = paths.first() else {
                return Err(Error::config("no TFRecord input given"));
            };
            return Err(Error::input(
                first,
                format!("{} input file(s)", files.len()),
                "no TFRecord records to import",
            ));
        }
        scan.offsets.shrink_to_fit();
        scan.labels.shrink_to_fit();
        Ok(TfRecordSource {
            files,
            offsets: scan.offsets,
            labels: scan.labels,
        })
    }

    /// The file record `i` is in, its number there, and where it is.
    fn record(&self, i: usize) -> Result<Record<'_>> {
        let out_of_range = || {
            Error::config(format!(
                "sample {i} out of range: the TFRecord input has {} records",
                self.offsets.len()
            ))
        };
        let offset = *self.offsets.get(i).ok_or_else(out_of_range)?;
        // The last file whose first record is at or before i (files without
        // records share their first index with the next file).
        let f = self.files.partition_point(|f| f.first <= i);
        let file = f
            .checked_sub(1)
            .and_then(|f| self.files.get(f))
            .ok_or_else(out_of_range)?;
        let next_first = self.files.get(f).map_or(self.offsets.len(), |next| next.first);
        let next = if i + 1 < next_first {
            self.offsets[i + 1]
        } else {
            file.end
        };
        Ok(Record {
            path: &file.path,
            number: (i - file.first) as u64,
            offset,
            // The scan checked every record fits before the next one starts.
            len: next - offset - HEADER_LEN - FOOTER_LEN,
        })
    }
}

impl Source for TfRecordSource {
    fn kind(&self) -> &'static str {
        "tfrecord"
    }

    fn len(&self) -> usize {
        self.offsets.len()
    }

    fn key(&self, i: usize) -> Cow<'_, [u8]> {
        // `file:number`, the file by its name without the directory.
        let f = self.files.partition_point(|f| f.first <= i) - 1;
        let file = &self.files[f];
        let name = file
            .path
            .file_name()
            .unwrap_or(file.path.as_os_str())
            .as_encoded_bytes();
        let mut key = Vec::with_capacity(name.len() + 11);
        key.extend_from_slice(name);
        key.push(b':');
        key.extend_from_slice((i - file.first).to_string().as_bytes());
        Cow::Owned(key)
    }

    fn label(&self, i: usize) -> i64 {
        self.labels.get(i)
    }

    fn read(&self, i: usize) -> Result<Vec<u8>> {
        let record = self.record(i)?;
        let path = record.path;
        let fail = |what: String| Error::input(path, record.position(), what);

        let mut file = File::open(path).at(path)?;
        file.seek(SeekFrom::Start(record.offset + HEADER_LEN))
            .map_err(|e| fail(format!("seeking to the data: {e}")))?;
        // Data and its crc in one read; the crc is split off below.
        let mut data = Vec::new();
        resize_buffer(&mut data, record.len + FOOTER_LEN).map_err(fail)?;
        file.read_exact(&mut data).map_err(|e| fail(read_failure(e)))?;
        check_data(&mut data).map_err(fail)?;
        Ok(data)
    }

    fn listing_bytes(&self) -> usize {
        self.offsets.capacity() * 8 + self.labels.heap_bytes() + self.files.capacity() * size_of::<InputFile>()
    }
}

/// Files to scan: each path as given, or a directory's regular files sorted
/// by name.
fn expand_inputs(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if !fs::metadata(path).at(path)?.is_dir() {
            files.push(path.clone());
            continue;
        }
        let mut in_dir = Vec::new();
        for dir_entry in fs::read_dir(path).at(path)? {
            let file = dir_entry.at(path)?.path();
            // metadata() follows symlinks, so a link to a file counts.
            if fs::metadata(&file).at(&file)?.is_file() {
                in_dir.push(file);
            }
        }
        in_dir.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        files.extend(in_dir);
    }
    Ok(files)
}

/// State of the scan in `open`: what has been listed so far, and one data
/// buffer reused across records so labels are extracted one record at a time.
struct Scan<'a> {
    offsets: Vec<u64>,
    labels: Ints,
    label_feature: Option<&'a [u8]>,
    data: Vec<u8>,
}

impl Scan<'_> {
    /// Lists the records of one file; returns where the last one ends.
    fn file(&mut self, path: &Path) -> Result<u64> {
        let file = File::open(path).at(path)?;
        let file_len = file.metadata().at(path)?.len();
        let mut reader = BufReader::new(file);

        let mut offset = 0;
        let mut number = 0;
        while offset < file_len {
            let fail = |what: String| Error::input(path, position(number, offset), what);
            let remaining = file_len - offset;
            if remaining < HEADER_LEN {
                return Err(fail(format!(
                    "truncated: {remaining} bytes left where a {HEADER_LEN}-byte record header should be"
                )));
            }
            let mut len_bytes = [0u8; 8];
            let mut len_crc = [0u8; 4];
            reader
                .read_exact(&mut len_bytes)
                .and_then(|()| reader.read_exact(&mut len_crc))
                .map_err(|e| fail(read_failure(e)))?;
            if masked_crc32c(&len_bytes) != u32::from_le_bytes(len_crc) {
                return Err(fail(
                    "length checksum mismatch (corrupt, or not a TFRecord file)".into(),
                ));
            }
            let len = u64::from_le_bytes(len_bytes);
            let record_len = len
                .checked_add(HEADER_LEN + FOOTER_LEN)
                .filter(|&record_len| record_len <= remaining)
                .ok_or_else(|| {
                    fail(format!(
                        "truncated: the record needs {len} data bytes and a {FOOTER_LEN}-byte checksum \
                         but only {} bytes follow its header",
                        remaining - HEADER_LEN
                    ))
                })?;

            let label = match self.label_feature {
                Some(feature) => {
                    // Reading the data anyway, so check it now rather than
                    // fail later in the middle of a pack.
                    resize_buffer(&mut self.data, len + FOOTER_LEN).map_err(fail)?;
                    reader.read_exact(&mut self.data).map_err(|e| fail(read_failure(e)))?;
                    check_data(&mut self.data).map_err(fail)?;
                    example_int64_feature(&self.data, feature).unwrap_or(-1)
                }
                None => {
                    let skip = i64::try_from(len + FOOTER_LEN)
                        .map_err(|_| fail(format!("record of {len} bytes is too long to skip")))?;
                    reader
                        .seek_relative(skip)
                        .map_err(|e| fail(format!("skipping the data: {e}")))?;
                    -1
                }
            };

            self.offsets.push(offset);
            self.labels.push(label);
            offset += record_len;
            number += 1;
        }
        Ok(offset)
    }
}

/// TFRecord's checksum: crc32c rotated and offset so that the crc of bytes
/// that themselves contain crcs is not degenerate.
pub(crate) fn masked_crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Make `buf` `len` bytes long (contents unspecified), reporting an error
/// instead of aborting when a (checksummed but huge) record does not fit in
/// memory.
fn resize_buffer(buf: &mut Vec<u8>, len: u64) -> std::result::Result<(), String> {
    let too_big = || format!("cannot allocate {len} bytes for the record");
    let len = usize::try_from(len).map_err(|_| too_big())?;
    buf.clear();
    buf.try_reserve_exact(len).map_err(|_| too_big())?;
    buf.resize(len, 0);
    Ok(())
}

/// `data_and_crc` is a record's data followed by its 4-byte masked crc:
/// check the crc and strip it, leaving the data.
fn check_data(data_and_crc: &mut Vec<u8>) -> std::result::Result<(), String> {
    let data_len = match data_and_crc.split_last_chunk::<4>() {
        Some((data, crc)) if masked_crc32c(data) == u32::from_le_bytes(*crc) => data.len(),
        _ => return Err("data checksum mismatch (the record is corrupt)".into()),
    };
    data_and_crc.truncate(data_len);
    Ok(())
}

fn read_failure(e: io::Error) -> String {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        "the file ended early (truncated, or changed since it was opened)".into()
    } else {
        format!("reading: {e}")
    }
}

/// The first value of the int64 feature `name` of a serialized
/// `tf.train.Example`, or None if `record` is not an Example, has no such
/// feature, or the feature is not a non-empty int64 list.
fn example_int64_feature(record: &[u8], name: &[u8]) -> Option<i64> {
    match example_feature(record, name) {
        Ok(Some(Feature::Int64(first))) => first,
        _ => None,
    }
}

/// What a `Feature` message holds, as far as labels are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Feature {
    /// No `kind` set.
    Unset,
    /// An `Int64List`, with its first value if it has one.
    Int64(Option<i64>),
    /// A `BytesList` or `FloatList`.
    Other,
}

// The wire format of the messages read below, from TensorFlow's
// example.proto and feature.proto:
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }  (entries: key = 1, value = 2)
//   Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                           Int64List int64_list = 3; } }
//   Int64List { repeated int64 value = 1 [packed = true]; }
// Protobuf parses a message field that occurs several times as the merge of
// its occurrences, and a map key that occurs several times as its last entry;
// both are followed here so the label is what TensorFlow would see.

/// The feature `name` of an Example, if present.
fn example_feature(example: &[u8], name: &[u8]) -> Result<Option<Feature>, Malformed> {
    let mut found = None;
    for field in protobuf::fields(example) {
        match field? {
            (1, Value::Bytes(features)) => {
                for entry in protobuf::fields(features) {
                    match entry? {
                        (1, Value::Bytes(entry)) => {
                            if let Some(feature) = map_entry(entry, name)? {
                                found = Some(feature);
                            }
                        }
                        (1, _) => return Err(Malformed),
                        _ => {}
                    }
                }
            }
            (1, _) => return Err(Malformed),
            _ => {}
        }
    }
    Ok(found)
}

/// A `Features.feature` map entry's value, if its key is `name`.
fn map_entry(entry: &[u8], name: &[u8]) -> Result<Option<Feature>, Malformed> {
    // A missing key is the empty string, protobuf's default.
    let mut key: &[u8] = b"";
    let mut feature = Feature::Unset;
    for field in protobuf::fields(entry) {
        match field? {
            (1, Value::Bytes(k)) => key = k,
            (2, Value::Bytes(f)) => feature = merge_feature(feature, f)?,
            (1 | 2, _) => return Err(Malformed),
            _ => {}
        }
    }
    Ok((key == name).then_some(feature))
}

/// `feature` after merging in one serialized `Feature` occurrence.
fn merge_feature(mut feature: Feature, serialized: &[u8]) -> Result<Feature, Malformed> {
    for field in protobuf::fields(serialized) {
        match field? {
            (1 | 2, Value::Bytes(_)) => feature = Feature::Other,
            (3, Value::Bytes(list)) => {
                let first = first_int64(list)?;
                feature = match feature {
                    // Same oneof case again: the lists concatenate.
                    Feature::Int64(earlier) => Feature::Int64(earlier.or(first)),
                    Feature::Unset | Feature::Other => Feature::Int64(first),
                };
            }
            (1..=3, _) => return Err(Malformed),
            _ => {}
        }
    }
    Ok(feature)
}

/// The first value of a serialized `Int64List`, packed or not.
fn first_int64(list: &[u8]) -> Result<Option<i64>, Malformed> {
    let mut first = None;
    for field in protobuf::fields(list) {
        let value = match field? {
            (1, Value::Bytes(packed)) => protobuf::first_packed_varint(packed)?,
            (1, Value::Varint(v)) => Some(v),
            (1, _) => return Err(Malformed),
            _ => None,
        };
        // int64 is two's complement on the wire.
        first = first.or(value.map(|v| v as i64));
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_follows_tensorflows_definition() {
        // TensorFlow's crc32c::Mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8,
        // worked by hand for "123456789", whose crc32c is the standard check
        // value 0xe3069283.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn check_data_rejects_short_input() {
        assert!(check_data(&mut vec![1, 2, 3]).is_err());
        let mut empty_record = masked_crc32c(b"").to_le_bytes().to_vec();
        assert_eq!(check_data(&mut empty_record), Ok(()));
        assert!(empty_record.is_empty());
    }
}
