//! TFRecord import: framing, keys, labels from `tf.train.Example`s, and
//! named errors for damaged files. Files are written here with a small
//! TFRecord writer and hand-encoded Examples.

use std::fs;
use std::path::{Path, PathBuf};

use brand_import::tfrecord::TfRecordSource;
use brand_pack::source::Source;

mod common;
use common::varint;

// ---- writing TFRecords ----

/// TFRecord's masked crc32c: (crc >> 15 | crc << 17) + 0xa282ead8.
fn masked_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One record as TensorFlow's TFRecordWriter frames it.
fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::new();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

fn write_records(path: &Path, records: &[Vec<u8>]) {
    let bytes: Vec<u8> = records.iter().flat_map(|r| frame(r)).collect();
    fs::write(path, bytes).unwrap();
}

// ---- hand-encoding Examples ----

fn len_field(number: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = varint((number << 3) | 2);
    out.extend(varint(payload.len() as u64));
    out.extend_from_slice(payload);
    out
}

fn varint_field(number: u64, value: u64) -> Vec<u8> {
    let mut out = varint(number << 3);
    out.extend(varint(value));
    out
}

/// `Feature { int64_list: Int64List { value } }`, packed or one field per value.
fn int64_feature(values: &[i64], packed: bool) -> Vec<u8> {
    let list: Vec<u8> = if packed {
        let payload: Vec<u8> = values.iter().flat_map(|&v| varint(v as u64)).collect();
        len_field(1, &payload)
    } else {
        values.iter().flat_map(|&v| varint_field(1, v as u64)).collect()
    };
    len_field(3, &list)
}

/// `Feature { bytes_list: BytesList { value } }`.
fn bytes_feature(values: &[&[u8]]) -> Vec<u8> {
    let list: Vec<u8> = values.iter().flat_map(|v| len_field(1, v)).collect();
    len_field(1, &list)
}

/// `Feature { float_list: FloatList { value } }` (packed).
fn float_feature(values: &[f32]) -> Vec<u8> {
    let payload: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    len_field(2, &len_field(1, &payload))
}

/// One `Features.feature` map entry.
fn map_entry(name: &str, feature: &[u8]) -> Vec<u8> {
    let mut entry = len_field(1, name.as_bytes());
    entry.extend(len_field(2, feature));
    len_field(1, &entry)
}

/// `Example { features: Features { feature: {name: feature, ...} } }`.
fn example(features: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let map: Vec<u8> = features
        .iter()
        .flat_map(|(name, feature)| map_entry(name, feature))
        .collect();
    len_field(1, &map)
}

fn image_example(label: i64, packed: bool) -> Vec<u8> {
    example(&[
        ("image/encoded", bytes_feature(&[b"\x89PNG not really"])),
        ("label", int64_feature(&[label], packed)),
    ])
}

fn paths(dir: &Path, names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(|n| dir.join(n)).collect()
}

fn keys(source: &TfRecordSource) -> Vec<String> {
    (0..source.len())
        .map(|i| String::from_utf8(source.key(i).into_owned()).unwrap())
        .collect()
}

fn labels(source: &TfRecordSource) -> Vec<i64> {
    (0..source.len()).map(|i| source.label(i)).collect()
}

fn open_err(paths: &[PathBuf], label_feature: Option<&str>) -> String {
    match TfRecordSource::open(paths, label_feature) {
        Ok(s) => panic!("expected an error, got {} records", s.len()),
        Err(e) => e.to_string(),
    }
}

// ---- tests ----

#[test]
fn lists_keys_labels_and_reads_records_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let a = vec![
        image_example(3, true),
        image_example(-5, false),
        example(&[("other", int64_feature(&[9], true))]),
    ];
    let b = vec![
        example(&[("label", float_feature(&[2.0]))]),
        b"\xff\xff not a protobuf".to_vec(),
        Vec::new(),
        image_example(0, true),
    ];
    write_records(&dir.path().join("a.tfrecord"), &a);
    write_records(&dir.path().join("b.tfrecord"), &b);

    let source = TfRecordSource::open(&paths(dir.path(), &["a.tfrecord", "b.tfrecord"]), Some("label")).unwrap();
    assert_eq!(source.kind(), "tfrecord");
    assert_eq!(
        keys(&source),
        [
            "a.tfrecord:0",
            "a.tfrecord:1",
            "a.tfrecord:2",
            "b.tfrecord:0",
            "b.tfrecord:1",
            "b.tfrecord:2",
            "b.tfrecord:3"
        ]
    );
    assert_eq!(labels(&source), [3, -5, -1, -1, -1, -1, 0]);
    let written: Vec<&Vec<u8>> = a.iter().chain(&b).collect();
    for (i, data) in written.iter().enumerate() {
        assert_eq!(&source.read(i).unwrap(), *data, "record {i}");
    }
    assert!(source.read(written.len()).is_err());
}

#[test]
fn files_keep_the_order_given() {
    let dir = tempfile::tempdir().unwrap();
    write_records(&dir.path().join("a"), &[image_example(1, true)]);
    write_records(&dir.path().join("b"), &[image_example(2, true)]);
    let source = TfRecordSource::open(&paths(dir.path(), &["b", "a"]), Some("label")).unwrap();
    assert_eq!(keys(&source), ["b:0", "a:0"]);
    assert_eq!(labels(&source), [2, 1]);
}

#[test]
fn without_a_label_feature_every_label_is_minus_one() {
    let dir = tempfile::tempdir().unwrap();
    let records = vec![image_example(4, true), image_example(6, false)];
    write_records(&dir.path().join("x.tfrecord"), &records);
    let source = TfRecordSource::open(&paths(dir.path(), &["x.tfrecord"]), None).unwrap();
    assert_eq!(labels(&source), [-1, -1]);
    assert_eq!(source.read(1).unwrap(), records[1]);
}

#[test]
fn label_feature_is_chosen_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let record = example(&[
        ("label", int64_feature(&[1], true)),
        ("class", int64_feature(&[42, 7], true)),
        ("classes", int64_feature(&[3], true)),
        ("clas", int64_feature(&[4], true)),
    ]);
    write_records(&dir.path().join("x"), &[record]);
    let source = TfRecordSource::open(&paths(dir.path(), &["x"]), Some("class")).unwrap();
    assert_eq!(labels(&source), [42]);
}

/// Protobuf's rules for repeated occurrences, which TensorFlow follows when
/// it parses an Example: the last map entry for a key wins, a repeated
/// message field merges, and a oneof takes its last case.
#[test]
fn labels_follow_protobuf_merge_rules() {
    let dir = tempfile::tempdir().unwrap();
    let int64 = |v: i64| int64_feature(&[v], true);
    let records = vec![
        // The last entry for "label" wins.
        example(&[("label", int64(1)), ("label", int64(2))]),
        // Features given twice merge into one map.
        [example(&[("label", int64(3))]), example(&[("x", int64(9))])].concat(),
        // Two int64 lists in one Feature concatenate: the first value stays.
        example(&[("label", [int64(4), int64(5)].concat())]),
        // The oneof's last case wins: bytes after int64 means no label.
        example(&[("label", [int64(6), bytes_feature(&[b"x"])].concat())]),
        // An empty int64 list has no first value.
        example(&[("label", int64_feature(&[], true))]),
        example(&[("label", int64_feature(&[], false))]),
        // A map entry without a key has the empty key.
        len_field(1, &len_field(1, &len_field(2, &int64(7)))),
        // Unknown fields are skipped.
        [varint_field(7, 1), example(&[("label", int64(8))])].concat(),
        // Negative values are ten-byte varints.
        example(&[("label", int64(i64::MIN))]),
        // The first of several values, packed or one field each.
        example(&[("label", int64_feature(&[12, 13], true))]),
        example(&[("label", int64_feature(&[14, 15], false))]),
    ];
    write_records(&dir.path().join("x"), &records);
    let source = TfRecordSource::open(&paths(dir.path(), &["x"]), Some("label")).unwrap();
    assert_eq!(labels(&source), [2, 3, 4, -1, -1, -1, -1, 8, i64::MIN, 12, 14]);
}

/// A record that is not valid protobuf, or that puts a known field of
/// Example, Features, a map entry, Feature or Int64List in the wrong wire
/// type, is not an Example: it gets no label even if a good label follows,
/// as TensorFlow would refuse to parse it.
#[test]
fn malformed_examples_get_no_label_and_read_fine() {
    let dir = tempfile::tempdir().unwrap();
    let good = image_example(5, true);
    let label_5 = int64_feature(&[5], true);
    let features = |parts: &[Vec<u8>]| len_field(1, &parts.concat());
    let entry = |parts: &[Vec<u8>]| len_field(1, &parts.concat());
    let records = vec![
        good[..good.len() - 1].to_vec(),     // cut short
        [good.clone(), vec![0x80]].concat(), // a truncated varint after it
        [varint_field(1, 5), good.clone()].concat(),
        features(&[varint_field(1, 1), map_entry("label", &label_5)]),
        features(&[entry(&[
            len_field(1, b"label"),
            varint_field(2, 1),
            len_field(2, &label_5),
        ])]),
        example(&[("label", [varint_field(3, 1), label_5.clone()].concat())]),
        // Int64List { value: fixed32 } then a good value.
        example(&[("label", len_field(3, &[0x0d, 0, 0, 0, 0, 0x08, 5]))]),
        good,
    ];
    write_records(&dir.path().join("x"), &records);
    let source = TfRecordSource::open(&paths(dir.path(), &["x"]), Some("label")).unwrap();
    assert_eq!(labels(&source), [-1, -1, -1, -1, -1, -1, -1, 5]);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(&source.read(i).unwrap(), record);
    }
}

#[test]
fn a_directory_means_its_regular_files_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    fs::create_dir(&shards).unwrap();
    // Created out of order, and enough of them that the directory listing
    // is unlikely to come back sorted by chance.
    for shard in [5, 2, 7, 0, 3, 6, 1, 4] {
        let records = [image_example(shard, true), image_example(shard + 10, true)];
        write_records(&shards.join(format!("train-{shard:05}")), &records);
    }
    fs::create_dir(shards.join("nested")).unwrap();
    write_records(&shards.join("nested").join("ignored"), &[image_example(99, true)]);
    write_records(&dir.path().join("extra"), &[image_example(42, true)]);

    let inputs = vec![shards, dir.path().join("extra")];
    let source = TfRecordSource::open(&inputs, Some("label")).unwrap();
    let mut expected_keys: Vec<String> = (0..8)
        .flat_map(|shard| [format!("train-{shard:05}:0"), format!("train-{shard:05}:1")])
        .collect();
    expected_keys.push("extra:0".into());
    assert_eq!(keys(&source), expected_keys);
    let mut expected_labels: Vec<i64> = (0..8).flat_map(|shard| [shard, shard + 10]).collect();
    expected_labels.push(42);
    assert_eq!(labels(&source), expected_labels);
}

#[test]
fn reads_in_parallel_from_many_threads() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Vec<u8>> = (0..64).map(|i| image_example(i, i % 2 == 0)).collect();
    write_records(&dir.path().join("x"), &records);
    let source = TfRecordSource::open(&paths(dir.path(), &["x"]), Some("label")).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (source, records) = (&source, &records);
            scope.spawn(move || {
                for i in (t..records.len()).step_by(4).rev() {
                    assert_eq!(source.read(i).unwrap(), records[i]);
                }
            });
        }
    });
    assert_eq!(labels(&source), (0..64).collect::<Vec<i64>>());
}

// ---- damaged input ----

/// Three records, and the byte offset at which each starts.
fn three_records(path: &Path) -> [u64; 3] {
    let records = [image_example(0, true), image_example(1, true), image_example(2, true)];
    write_records(path, &records);
    let first = frame(&records[0]).len() as u64;
    let second = frame(&records[1]).len() as u64;
    [0, first, first + second]
}

#[test]
fn truncated_data_is_an_open_error_naming_file_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.tfrecord");
    let starts = three_records(&path);
    let full = fs::read(&path).unwrap();
    // Cut inside the last record's data, and just before its crc ends.
    for cut in [starts[2] as usize + 20, full.len() - 1] {
        fs::write(&path, &full[..cut]).unwrap();
        for label_feature in [None, Some("label")] {
            let err = open_err(std::slice::from_ref(&path), label_feature);
            assert!(err.contains(&path.display().to_string()), "{err}");
            assert!(err.contains(&format!("record 2 at byte {}", starts[2])), "{err}");
            assert!(err.contains("truncated"), "{err}");
        }
    }
}

#[test]
fn truncated_header_is_an_open_error_naming_file_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.tfrecord");
    let starts = three_records(&path);
    let full = fs::read(&path).unwrap();
    fs::write(&path, &full[..starts[1] as usize + 5]).unwrap();
    let err = open_err(std::slice::from_ref(&path), Some("label"));
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("record 1 at byte {}: truncated", starts[1])),
        "{err}"
    );
}

#[test]
fn flipped_length_byte_is_an_open_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.tfrecord");
    let starts = three_records(&path);
    let mut bytes = fs::read(&path).unwrap();
    bytes[starts[1] as usize] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    let err = open_err(std::slice::from_ref(&path), None);
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains(&format!("record 1 at byte {}", starts[1])), "{err}");
    assert!(err.contains("length checksum mismatch"), "{err}");
}

#[test]
fn flipped_data_byte_is_a_read_error_naming_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.tfrecord");
    let starts = three_records(&path);
    let mut bytes = fs::read(&path).unwrap();
    bytes[starts[1] as usize + 12 + 3] ^= 0x40;
    fs::write(&path, &bytes).unwrap();

    // Without labels the data is not read until `read`.
    let source = TfRecordSource::open(std::slice::from_ref(&path), None).unwrap();
    assert!(source.read(0).is_ok());
    assert!(source.read(2).is_ok());
    let err = source.read(1).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains(&format!("record 1 at byte {}", starts[1])), "{err}");
    assert!(err.contains("data checksum mismatch"), "{err}");

    // With labels `open` reads the data, and reports the damage up front.
    let err = open_err(std::slice::from_ref(&path), Some("label"));
    assert!(err.contains(&format!("record 1 at byte {}", starts[1])), "{err}");
    assert!(err.contains("data checksum mismatch"), "{err}");
}

#[test]
fn flipped_data_crc_byte_is_a_read_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.tfrecord");
    let starts = three_records(&path);
    let mut bytes = fs::read(&path).unwrap();
    bytes[starts[2] as usize - 1] ^= 0x80;
    fs::write(&path, &bytes).unwrap();
    let source = TfRecordSource::open(std::slice::from_ref(&path), None).unwrap();
    let err = source.read(1).unwrap_err().to_string();
    assert!(err.contains("record 1"), "{err}");
}

#[test]
fn a_file_shortened_after_open_is_a_read_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.tfrecord");
    let starts = three_records(&path);
    let source = TfRecordSource::open(std::slice::from_ref(&path), None).unwrap();
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..starts[2] as usize + 30]).unwrap();
    assert!(source.read(1).is_ok());
    let err = source.read(2).unwrap_err().to_string();
    assert!(err.contains(&format!("record 2 at byte {}", starts[2])), "{err}");
}

#[test]
fn empty_input_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.tfrecord");
    fs::write(&empty, b"").unwrap();
    let err = open_err(std::slice::from_ref(&empty), Some("label"));
    assert!(err.contains("empty.tfrecord"), "{err}");
    assert!(err.contains("no TFRecord records"), "{err}");

    let empty_dir = dir.path().join("nothing");
    fs::create_dir(&empty_dir).unwrap();
    let err = open_err(&[empty_dir], None);
    assert!(err.contains("no TFRecord records"), "{err}");

    assert!(TfRecordSource::open(&[], None).is_err());
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write_records(&dir.path().join("here"), &[image_example(1, true)]);
    let err = open_err(&paths(dir.path(), &["here", "not-here"]), None);
    assert!(err.contains("not-here"), "{err}");
}

#[test]
fn a_file_that_is_not_tfrecord_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    fs::write(&path, b"these are not the records you are looking for\n").unwrap();
    let err = open_err(std::slice::from_ref(&path), None);
    assert!(err.contains("notes.txt: record 0 at byte 0"), "{err}");
}
