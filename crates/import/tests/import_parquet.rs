//! Parquet import: Hugging Face's `Image` struct and plain binary columns,
//! ClassLabel labels with their names from the `huggingface` metadata,
//! keys `file:row`, several row groups and compressions, and a named error
//! for each kind of damaged input. Files are written here with the
//! `parquet` crate's own writer, in the layout `datasets` writes.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use brand_format::Dataset;
use brand_import::parquet::{ParquetOptions, ParquetSource};
use brand_pack::source::Source;
use brand_pack::{PackOptions, pack};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

const HF_SCHEMA: &str = "message schema {
    optional group image {
        optional binary bytes;
        optional binary path (STRING);
    }
    optional int64 label;
    optional binary caption (STRING);
}";

const NAMES: [&str; 4] = ["cat", "dog", "fish", "owl"];

/// One row: image bytes (None: only a path), label (None: null), caption.
#[derive(Clone)]
struct Row {
    image: Option<Vec<u8>>,
    label: Option<i64>,
}

fn image(file: usize, row: usize) -> Vec<u8> {
    let mut v = format!("\u{89}PNG {file}/{row} ").into_bytes();
    v.extend((0..(row * 41 + file * 13) % 2500).map(|b| (b ^ row) as u8));
    v
}

fn rows(file: usize, n: usize) -> Vec<Row> {
    (0..n)
        .map(|r| Row {
            image: Some(image(file, r)),
            label: if r % 9 == 4 {
                None
            } else {
                Some(((r + file) % NAMES.len()) as i64)
            },
        })
        .collect()
}

fn hf_metadata(names: &[&str]) -> String {
    serde_json::json!({"info": {"features": {
        "image": {"_type": "Image"},
        "label": {"names": names, "_type": "ClassLabel"},
        "caption": {"dtype": "string", "_type": "Value"},
    }}})
    .to_string()
}

/// Writes `rows` as `datasets` would (Image struct, int64 ClassLabel, a
/// string caption), `group_rows` rows per row group.
fn write_hf(path: &Path, rows: &[Row], group_rows: usize, compression: Compression, names: Option<&[&str]>) {
    let schema = Arc::new(parse_message_type(HF_SCHEMA).unwrap());
    let props = WriterProperties::builder()
        .set_compression(compression)
        .set_key_value_metadata(names.map(|n| vec![KeyValue::new("huggingface".to_string(), hf_metadata(n))]))
        .set_data_page_size_limit(4096)
        .build();
    let file = fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, Arc::new(props)).unwrap();
    for group in rows.chunks(group_rows) {
        let mut rg = writer.next_row_group().unwrap();
        // image.bytes: defined (2) or null inside a present struct (1).
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = group
            .iter()
            .filter_map(|r| r.image.clone())
            .map(ByteArray::from)
            .collect();
        let defs: Vec<i16> = group.iter().map(|r| if r.image.is_some() { 2 } else { 1 }).collect();
        col.typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        col.close().unwrap();
        // image.path: set where the bytes are not.
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = group
            .iter()
            .filter(|r| r.image.is_none())
            .map(|_| ByteArray::from("/home/u/.cache/img.png"))
            .collect();
        let defs: Vec<i16> = group.iter().map(|r| if r.image.is_some() { 1 } else { 2 }).collect();
        col.typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<i64> = group.iter().filter_map(|r| r.label).collect();
        let defs: Vec<i16> = group.iter().map(|r| i16::from(r.label.is_some())).collect();
        col.typed::<Int64Type>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = group.iter().map(|_| ByteArray::from("a caption")).collect();
        col.typed::<ByteArrayType>()
            .write_batch(&values, Some(&vec![1; group.len()]), None)
            .unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    writer.close().unwrap();
}

fn options(spool: &Path, field: Option<&str>, label: Option<&str>) -> ParquetOptions {
    ParquetOptions {
        field: field.map(str::to_string),
        label: label.map(str::to_string),
        spool_dir: spool.to_path_buf(),
        store: brand_store::GetPolicy::default(),
        listing: Default::default(),
    }
}

fn samples(src: &dyn Source) -> Vec<(String, i64, Vec<u8>)> {
    (0..src.len())
        .map(|i| {
            (
                String::from_utf8(src.key(i).into_owned()).unwrap(),
                src.label(i),
                src.read(i).unwrap(),
            )
        })
        .collect()
}

fn expected(file_name: &str, file: usize, rows: &[Row]) -> Vec<(String, i64, Vec<u8>)> {
    rows.iter()
        .enumerate()
        .map(|(r, row)| (format!("{file_name}:{r}"), row.label.unwrap_or(-1), image(file, r)))
        .collect()
}

fn contains_all(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
}

#[test]
fn hub_parquet_keeps_every_image_label_key_and_the_class_names() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    fs::create_dir(&data).unwrap();
    // Three shards as push_to_hub names them: 100-row groups, one large
    // group, odd sizes; snappy, zstd and none.
    let shards = [
        (250, 100, Compression::SNAPPY),
        (37, 1000, Compression::ZSTD(Default::default())),
        (101, 7, Compression::UNCOMPRESSED),
    ];
    let mut want = Vec::new();
    for (k, &(n, group, compression)) in shards.iter().enumerate() {
        let name = format!("train-{k:05}-of-00003.parquet");
        let rows = rows(k, n);
        write_hf(&data.join(&name), &rows, group, compression, Some(&NAMES));
        want.extend(expected(&name, k, &rows));
    }
    fs::write(data.join("README.md"), "not parquet").unwrap();
    let src = ParquetSource::open(
        std::slice::from_ref(&data),
        &options(t.path(), Some("image"), Some("label")),
    )
    .unwrap();
    assert_eq!(src.kind(), "parquet");
    assert_eq!(samples(&src), want);
    assert_eq!(src.label_names(), NAMES);
    // The default payload: the only binary or Image column (the caption is a string).
    let src = ParquetSource::open(std::slice::from_ref(&data), &options(t.path(), None, None)).unwrap();
    assert!(
        samples(&src)
            .iter()
            .zip(&want)
            .all(|(a, b)| a.0 == b.0 && a.1 == -1 && a.2 == b.2)
    );
    assert!(src.label_names().is_empty());
    // Packed: every sample by key, names in the manifest.
    let src = ParquetSource::open(
        std::slice::from_ref(&data),
        &options(t.path(), Some("image"), Some("label")),
    )
    .unwrap();
    let out = t.path().join("ds");
    let opts = PackOptions {
        chunk_size: 8,
        ..PackOptions::default()
    };
    pack(&src, &out, &opts, &|_, _, _| {}).unwrap();
    let d = Dataset::open(&out).unwrap();
    assert_eq!(d.manifest.label_names, NAMES);
    let mut got: Vec<_> = (0..d.index.samples())
        .map(|id| {
            let key = String::from_utf8(d.index.key(id).to_vec()).unwrap();
            (key, d.index.label(id), d.read_sample(id).unwrap())
        })
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

/// `message { required binary data; required int32 y; }`, no metadata.
fn write_plain(path: &Path, n: usize) -> Vec<(String, i64, Vec<u8>)> {
    let schema = Arc::new(parse_message_type("message m { required binary data; required int32 y; }").unwrap());
    let file = fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, Arc::new(WriterProperties::builder().build())).unwrap();
    let mut rg = writer.next_row_group().unwrap();
    let data: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; i * 3]).collect();
    let mut col = rg.next_column().unwrap().unwrap();
    let values: Vec<ByteArray> = data.iter().cloned().map(ByteArray::from).collect();
    col.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
    col.close().unwrap();
    let mut col = rg.next_column().unwrap().unwrap();
    let labels: Vec<i32> = (0..n as i32).map(|i| i * 1000 - 3).collect();
    col.typed::<parquet::data_type::Int32Type>()
        .write_batch(&labels, None, None)
        .unwrap();
    col.close().unwrap();
    rg.close().unwrap();
    writer.close().unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    data.into_iter()
        .enumerate()
        .map(|(i, d)| (format!("{name}:{i}"), i as i64 * 1000 - 3, d))
        .collect()
}

#[test]
fn a_required_binary_column_and_an_int32_label_without_names() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("plain.parquet");
    let want = write_plain(&path, 50);
    let src = ParquetSource::open(std::slice::from_ref(&path), &options(t.path(), None, Some("y"))).unwrap();
    assert_eq!(samples(&src), want);
    let e = ParquetSource::open(std::slice::from_ref(&path), &options(t.path(), Some("y"), None))
        .unwrap_err()
        .to_string();
    contains_all(
        &e,
        &["plain.parquet", "schema", "column \"y\" is neither binary nor an Image"],
    );
    let e = ParquetSource::open(std::slice::from_ref(&path), &options(t.path(), None, Some("data")))
        .unwrap_err()
        .to_string();
    contains_all(&e, &["label column \"data\" is BYTE_ARRAY", "not an integer"]);
}

// ---- damaged input ----

/// The error opening `path`; checks that nothing is left beside it.
fn open_error(path: &Path, field: Option<&str>, label: Option<&str>) -> String {
    let dir = path.parent().unwrap();
    let before: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    let err = ParquetSource::open(&[path.to_path_buf()], &options(dir, field, label)).expect_err("damaged input");
    let after: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(before, after);
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    message
}

fn hf_file(dir: &Path, rows: &[Row], compression: Compression, names: Option<&[&str]>) -> (PathBuf, Vec<u8>) {
    let path = dir.join("train-00000-of-00001.parquet");
    write_hf(&path, rows, 20, compression, names);
    let bytes = fs::read(&path).unwrap();
    (path, bytes)
}

#[test]
fn a_file_without_its_footer_is_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let (path, good) = hf_file(t.path(), &rows(0, 50), Compression::SNAPPY, Some(&NAMES));
    fs::write(&path, &good[..good.len() - 100]).unwrap();
    contains_all(
        &open_error(&path, None, None),
        &["footer", "not a readable Parquet file"],
    );
    fs::write(&path, b"PAR1").unwrap();
    contains_all(&open_error(&path, None, None), &["footer"]);
}

#[test]
fn a_corrupt_page_is_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let (path, good) = hf_file(t.path(), &rows(0, 50), Compression::SNAPPY, Some(&NAMES));
    // The first column chunk (image.bytes of row group 0) starts after the
    // 4-byte magic: overwrite its first page header and then its data.
    for (at, len) in [(4, 40), (60, 400)] {
        let mut bad = good.clone();
        bad[at..at + len].iter_mut().for_each(|b| *b = 0xee);
        fs::write(&path, &bad).unwrap();
        contains_all(
            &open_error(&path, Some("image"), Some("label")),
            &["row 0 (row group 0, column \"image.bytes\" (bytes 4..", "decoding"],
        );
    }
}

#[test]
fn missing_columns_and_values_are_named_errors() {
    let t = tempfile::tempdir().unwrap();
    let mut with_path_only = rows(0, 30);
    with_path_only[23].image = None;
    let (path, _) = hf_file(t.path(), &with_path_only, Compression::SNAPPY, Some(&NAMES));
    contains_all(
        &open_error(&path, Some("image"), Some("label")),
        &[
            "row 23 (row group 1",
            "\"image\" has no bytes, only a path (\"/home/u/.cache/img.png\")",
        ],
    );
    let (path, _) = hf_file(t.path(), &rows(0, 30), Compression::SNAPPY, Some(&NAMES));
    contains_all(
        &open_error(&path, Some("photo"), None),
        &["schema", "missing column \"photo\"", "image, label, caption"],
    );
    contains_all(
        &open_error(&path, Some("image"), Some("cls")),
        &["missing label column \"cls\""],
    );
    contains_all(
        &open_error(&path, Some("caption"), Some("image")),
        &["missing label column \"image\""],
    );
}

#[test]
fn a_label_outside_the_class_names_is_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let mut rows = rows(0, 30);
    rows[17].label = Some(4);
    let (path, _) = hf_file(t.path(), &rows, Compression::UNCOMPRESSED, Some(&NAMES));
    contains_all(
        &open_error(&path, None, Some("label")),
        &["row 17 (row group 0)", "label 4 is out of range of the 4 class names"],
    );
    // Without class names, any integer is a label.
    let (path, _) = hf_file(t.path(), &rows, Compression::UNCOMPRESSED, None);
    let src = ParquetSource::open(&[path], &options(t.path(), None, Some("label"))).unwrap();
    assert_eq!(src.label(17), 4);
}

#[test]
fn files_with_different_class_names_are_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a.parquet");
    let b = t.path().join("b.parquet");
    write_hf(&a, &rows(0, 5), 5, Compression::SNAPPY, Some(&NAMES));
    write_hf(&b, &rows(1, 5), 5, Compression::SNAPPY, Some(&NAMES[..3]));
    let e = ParquetSource::open(&[a, b.clone()], &options(t.path(), None, Some("label")))
        .unwrap_err()
        .to_string();
    contains_all(
        &e,
        &[&b.display().to_string(), "3 class names differ from the first file's 4"],
    );
}

#[test]
fn no_damaged_file_panics() {
    let t = tempfile::tempdir().unwrap();
    let (path, good) = hf_file(t.path(), &rows(0, 12), Compression::SNAPPY, Some(&NAMES));
    for i in (0..good.len()).step_by(7) {
        let mut bad = good.clone();
        bad[i] ^= 0x5a;
        fs::write(&path, &bad).unwrap();
        let _ = ParquetSource::open(
            std::slice::from_ref(&path),
            &options(t.path(), Some("image"), Some("label")),
        );
        fs::write(&path, &good[..i]).unwrap();
        assert!(ParquetSource::open(std::slice::from_ref(&path), &options(t.path(), None, None)).is_err());
    }
}
