//! Arrow IPC import: `datasets`' `save_to_disk` layout (state.json order,
//! class names from the schema metadata or dataset_info.json, Image
//! structs), plain binary columns, the IPC file format, keys `file:row`,
//! payloads read in place, and a named error for each kind of damaged
//! input. Files are written here by a small IPC writer (flatbuffer tables
//! laid out by hand), in the layout pyarrow writes; python/tests checks
//! files written by `datasets` itself.

use std::fs;
use std::path::{Path, PathBuf};

use brand_format::Dataset;
use brand_import::arrow::{ArrowOptions, ArrowSource};
use brand_pack::source::Source;
use brand_pack::{PackOptions, pack};

use brand_testkit::arrow_ipc::*;

fn options(field: Option<&str>, label: Option<&str>) -> ArrowOptions {
    ArrowOptions {
        field: field.map(str::to_string),
        label: label.map(str::to_string),
        ..ArrowOptions::default()
    }
}

fn samples(src: &dyn Source) -> Vec<(String, i64, Vec<u8>)> {
    (0..src.len())
        .map(|i| {
            (
                String::from_utf8(src.key(i).to_vec()).unwrap(),
                src.label(i),
                src.read(i).unwrap(),
            )
        })
        .collect()
}

fn expected(file_name: &str, rows: &[Row], labels: bool) -> Vec<(String, i64, Vec<u8>)> {
    rows.iter()
        .enumerate()
        .map(|(r, row)| {
            let label = if labels { row.label.unwrap_or(-1) } else { -1 };
            (format!("{file_name}:{r}"), label, row.image.clone().unwrap())
        })
        .collect()
}

fn contains_all(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
}

#[test]
fn save_to_disk_keeps_every_image_label_key_in_state_json_order() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("train");
    // state.json lists 00001 first: its order, not the names', counts.
    let files = [
        ("data-00001-of-00002.arrow", rows(1, 23)),
        ("data-00000-of-00002.arrow", rows(0, 30)),
    ];
    save_to_disk(&dir, &files, true);
    let src = ArrowSource::open(std::slice::from_ref(&dir), &options(Some("image"), Some("label"))).unwrap();
    let mut want = expected(files[0].0, &files[0].1, true);
    want.extend(expected(files[1].0, &files[1].1, true));
    assert_eq!(src.kind(), "arrow");
    assert_eq!(samples(&src), want);
    assert_eq!(src.label_names(), NAMES);
    assert!(src.listing_bytes() > 0);
    // The default field is the only binary/Image column (the caption is a
    // string); without --label, no labels and no names.
    let src = ArrowSource::open(std::slice::from_ref(&dir), &options(None, None)).unwrap();
    let mut no_labels = expected(files[0].0, &files[0].1, false);
    no_labels.extend(expected(files[1].0, &files[1].1, false));
    assert_eq!(samples(&src), no_labels);
    assert!(src.label_names().is_empty());
    // Packed: every sample by key, names in the manifest.
    let src = ArrowSource::open(std::slice::from_ref(&dir), &options(Some("image"), Some("label"))).unwrap();
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

#[test]
fn class_names_come_from_dataset_info_json_when_the_schema_has_none() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("train");
    save_to_disk(&dir, &[("data-00000-of-00001.arrow", rows(2, 12))], false);
    let src = ArrowSource::open(std::slice::from_ref(&dir), &options(Some("image"), Some("label"))).unwrap();
    assert_eq!(src.label_names(), NAMES);
    assert_eq!(samples(&src), expected("data-00000-of-00001.arrow", &rows(2, 12), true));
}

#[test]
fn plain_files_the_file_format_and_directories_of_arrow_files() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a.arrow");
    let b = t.path().join("b.arrow");
    fs::write(&a, hf_stream(&rows(0, 10), 4, Some(&NAMES))).unwrap();
    fs::write(&b, file_format(&hf_stream(&rows(1, 9), 5, Some(&NAMES)))).unwrap();
    let mut want = expected("a.arrow", &rows(0, 10), true);
    want.extend(expected("b.arrow", &rows(1, 9), true));
    let src = ArrowSource::open(&[a.clone(), b.clone()], &options(Some("image"), Some("label"))).unwrap();
    assert_eq!(samples(&src), want);
    // A directory without state.json: its .arrow files by name.
    let src = ArrowSource::open(&[t.path().to_path_buf()], &options(Some("image"), Some("label"))).unwrap();
    assert_eq!(samples(&src), want);
    // A binary column, a string column, an unsigned label, no metadata.
    let path = t.path().join("plain.arrow");
    let values: Vec<Vec<u8>> = (0..20).map(|i| vec![i as u8; i * 3]).collect();
    let mut body = Body::default();
    body.binary(&values.iter().map(|v| Some(v.as_slice())).collect::<Vec<_>>());
    body.binary(&(0..20).map(|_| Some(&b"text"[..])).collect::<Vec<_>>());
    body.node(&[true; 20]);
    body.buffer(&(0..20u16).flat_map(|i| (i % 3).to_le_bytes()).collect::<Vec<_>>());
    let mut stream = schema_message(
        vec![binary_field("data"), string_field("text"), int_field("y", 16, false)],
        None,
    );
    stream.extend(body.message(20));
    stream.extend_from_slice(&EOS);
    fs::write(&path, stream).unwrap();
    let src = ArrowSource::open(std::slice::from_ref(&path), &options(None, Some("y"))).unwrap();
    let want: Vec<_> = (0..20)
        .map(|i| (format!("plain.arrow:{i}"), (i % 3) as i64, values[i].clone()))
        .collect();
    assert_eq!(samples(&src), want);
    let src = ArrowSource::open(std::slice::from_ref(&path), &options(Some("text"), None)).unwrap();
    assert!((0..20).all(|i| src.read(i).unwrap() == b"text"));
}

// ---- damaged input ----

/// The error opening `paths`: it names the first path.
fn open_error(paths: &[PathBuf], field: Option<&str>, label: Option<&str>) -> String {
    let err = ArrowSource::open(paths, &options(field, label)).expect_err("damaged input");
    let message = err.to_string();
    assert!(message.contains(&paths[0].display().to_string()), "{message}");
    message
}

fn write(dir: &Path, bytes: &[u8]) -> PathBuf {
    let path = dir.join("data-00000-of-00001.arrow");
    fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_dataset_dict_names_its_splits() {
    let t = tempfile::tempdir().unwrap();
    save_to_disk(
        &t.path().join("train"),
        &[("data-00000-of-00001.arrow", rows(0, 3))],
        true,
    );
    save_to_disk(
        &t.path().join("test"),
        &[("data-00000-of-00001.arrow", rows(1, 3))],
        true,
    );
    fs::write(t.path().join("dataset_dict.json"), r#"{"splits": ["train", "test"]}"#).unwrap();
    let e = open_error(&[t.path().to_path_buf()], None, None);
    contains_all(
        &e,
        &[
            "DatasetDict of splits [train, test]",
            &t.path().join("train").display().to_string(),
        ],
    );
}

#[test]
fn state_json_naming_a_missing_file_or_leaving_the_directory_is_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("train");
    let files = [
        ("data-00000-of-00002.arrow", rows(0, 5)),
        ("data-00001-of-00002.arrow", rows(1, 5)),
    ];
    save_to_disk(&dir, &files, true);
    fs::remove_file(dir.join(files[1].0)).unwrap();
    let missing = dir.join(files[1].0).display().to_string();
    contains_all(
        &open_error(std::slice::from_ref(&dir), None, None),
        &["state.json", "_data_files[1]", &missing, "does not exist"],
    );
    let state = r#"{"_data_files": [{"filename": "../elsewhere.arrow"}]}"#;
    fs::write(dir.join("state.json"), state).unwrap();
    contains_all(
        &open_error(std::slice::from_ref(&dir), None, None),
        &["state.json", "_data_files[0]", "not a path inside"],
    );
    // Neither state.json nor .arrow files: named, with what was looked for.
    let empty = t.path().join("empty");
    fs::create_dir_all(empty.join("sub")).unwrap();
    fs::write(empty.join("sub/a.arrow"), hf_stream(&rows(0, 2), 2, None)).unwrap();
    contains_all(
        &open_error(std::slice::from_ref(&empty), None, None),
        &["no .arrow files in the directory (and no state.json)"],
    );
}

#[test]
fn truncated_streams_and_a_missing_schema_are_named_errors() {
    let t = tempfile::tempdir().unwrap();
    let good = hf_stream(&rows(0, 10), 4, Some(&NAMES));
    let schema_len = hf_schema(Some(&NAMES)).len();
    // Cut inside the second message's body; then without the EOS marker.
    let path = write(t.path(), &good[..schema_len + 600]);
    contains_all(
        &open_error(&[path], None, None),
        &["message 1 at byte", "does not fit the stream", "truncated"],
    );
    let path = write(t.path(), &good[..schema_len + 100]);
    contains_all(
        &open_error(&[path], None, None),
        &["message 1 at byte", "metadata of", "runs past the end"],
    );
    let path = write(t.path(), &good[..good.len() - 8]);
    contains_all(
        &open_error(&[path], None, None),
        &["message 4 at byte", "without its end-of-stream marker"],
    );
    let path = write(t.path(), &good[..schema_len + 6]);
    contains_all(
        &open_error(&[path], None, None),
        &["message 1 at byte", "inside a message prefix"],
    );
    // A batch first; nothing at all; a file format without its footer.
    let path = write(t.path(), &good[schema_len..]);
    contains_all(
        &open_error(&[path], None, None),
        &["message 0 at byte 0", "missing schema"],
    );
    let path = write(t.path(), &EOS);
    contains_all(&open_error(&[path], None, None), &["missing schema"]);
    let file = file_format(&good);
    let path = write(t.path(), &file[..file.len() - 3]);
    contains_all(&open_error(&[path], None, None), &["footer", "without its footer"]);
    // Not Arrow at all.
    let path = write(t.path(), b"\x89PNG\r\n\x1a\n not arrow");
    assert!(!open_error(&[path], None, None).is_empty());
}

/// A stream of one batch of `rows(0, 10)` with `damage` applied to its
/// body's nodes and buffers.
fn damaged_batch(damage: impl Fn(&mut Body)) -> Vec<u8> {
    let rows = rows(0, 10);
    let mut out = hf_schema(Some(&NAMES));
    let mut body = hf_batch(&rows);
    damage(&mut body);
    out.extend(body.message(rows.len()));
    out.extend_from_slice(&EOS);
    out
}

#[test]
fn damaged_record_batches_are_named_errors() {
    let t = tempfile::tempdir().unwrap();
    let open = |bytes: Vec<u8>| open_error(&[write(t.path(), &bytes)], Some("image"), Some("label"));
    // Buffers (caption 0..3, image 3, bytes 4..7, path 7..10, label 10..12).
    let e = open(damaged_batch(|b| b.buffers[6].0 = b.bytes.len() as i64));
    contains_all(
        &e,
        &["message 1 (record batch 0) at byte", "buffer 6", "outside the body"],
    );
    let e = open(damaged_batch(|b| b.buffers[5].1 = -8));
    contains_all(&e, &["buffer 5 (offset", "length -8", "outside the body"]);
    // Nodes (caption 0, image 1, bytes 2, path 3, label 4).
    let e = open(damaged_batch(|b| b.nodes[2].0 = 9));
    contains_all(&e, &["field node 2 has length 9", "the batch has length 10"]);
    let e = open(damaged_batch(|b| b.nodes[4].0 = -1));
    contains_all(&e, &["field node 4 has length -1"]);
    let e = open(damaged_batch(|b| b.nodes.truncate(3)));
    contains_all(&e, &["3 field nodes, the schema needs node 4"]);
    // Value offsets: row 3 ends before it starts; one past the data.
    let e = open(damaged_batch(|b| {
        let at = b.buffers[5].0 as usize + 4 * 4;
        b.bytes[at..at + 4].copy_from_slice(&1i32.to_le_bytes());
    }));
    contains_all(&e, &["row 3 (message 1, record batch 0) at byte", "not monotonic"]);
    let e = open(damaged_batch(|b| {
        let at = b.buffers[5].0 as usize + 4 * 10;
        b.bytes[at..at + 4].copy_from_slice(&i32::MAX.to_le_bytes());
    }));
    contains_all(&e, &["row 9 (message 1, record batch 0)", "outside the data buffer"]);
    // A body longer than the file: the message claims more than is there.
    let mut bytes = damaged_batch(|_| {});
    bytes.truncate(bytes.len() - 8 - 16);
    contains_all(&open(bytes), &["message 1 at byte", "does not fit the stream"]);
    // A compressed body.
    let rows = rows(0, 4);
    let body = hf_batch(&rows);
    let pairs = |v: &[(i64, i64)]| {
        v.iter()
            .flat_map(|(a, b)| [a.to_le_bytes(), b.to_le_bytes()])
            .flatten()
            .collect()
    };
    let mut bytes = hf_schema(None);
    bytes.extend(framed(
        3,
        vec![
            (0, Val::I64(4)),
            (1, Val::Structs(pairs(&body.nodes), body.nodes.len() as u32)),
            (2, Val::Structs(pairs(&body.buffers), body.buffers.len() as u32)),
            (3, Val::Table(vec![(0, Val::U8(1))])),
        ],
        &body.bytes,
    ));
    bytes.extend_from_slice(&EOS);
    contains_all(
        &open(bytes),
        &["message 1 (record batch 0) at byte", "ZSTD-compressed body"],
    );
    // A batch of i64::MAX rows, every node agreeing: its buffers are too small.
    let mut nodes = body.nodes.clone();
    nodes.iter_mut().for_each(|n| n.0 = i64::MAX);
    let mut bytes = hf_schema(None);
    bytes.extend(framed(
        3,
        vec![
            (0, Val::I64(i64::MAX)),
            (1, Val::Structs(pairs(&nodes), nodes.len() as u32)),
            (2, Val::Structs(pairs(&body.buffers), body.buffers.len() as u32)),
        ],
        &body.bytes,
    ));
    bytes.extend_from_slice(&EOS);
    contains_all(
        &open(bytes),
        &["offsets buffer 5 has", "bytes for 9223372036854775807 rows"],
    );
}

#[test]
fn missing_columns_unsupported_types_and_bad_values_are_named_errors() {
    let t = tempfile::tempdir().unwrap();
    let path = write(t.path(), &hf_stream(&rows(0, 10), 4, Some(&NAMES)));
    let one = std::slice::from_ref(&path);
    contains_all(
        &open_error(one, Some("photo"), None),
        &["(schema)", "missing payload column \"photo\"", "caption, image, label"],
    );
    contains_all(&open_error(one, None, Some("y")), &["missing label column \"y\""]);
    contains_all(
        &open_error(one, Some("label"), None),
        &["column \"label\" is int64", "brand packs stored bytes"],
    );
    contains_all(
        &open_error(one, None, Some("caption")),
        &["label column \"caption\" is string, not an integer"],
    );
    // A column after one of a type brand cannot lay out.
    let mut stream = schema_message(vec![field("v", 23, vec![], vec![]), binary_field("data")], None);
    stream.extend_from_slice(&EOS);
    let path = write(t.path(), &stream);
    contains_all(
        &open_error(std::slice::from_ref(&path), Some("data"), None),
        &["cannot read column \"data\"", "binary_view"],
    );
    // Several candidates without --field.
    let mut stream = schema_message(vec![binary_field("a"), image_field("b")], None);
    stream.extend_from_slice(&EOS);
    let path = write(t.path(), &stream);
    contains_all(
        &open_error(std::slice::from_ref(&path), None, None),
        &["several columns", "--field"],
    );
    // A row with only a path; a label outside the class names.
    let mut bad = rows(0, 10);
    bad[6].image = None;
    let path = write(t.path(), &hf_stream(&bad, 4, Some(&NAMES)));
    contains_all(
        &open_error(std::slice::from_ref(&path), Some("image"), None),
        &[
            "row 6 (message 2, record batch 1)",
            "no bytes, only a path (\"photos/2.png\")",
        ],
    );
    let mut bad = rows(0, 10);
    bad[7].label = Some(4);
    let path = write(t.path(), &hf_stream(&bad, 4, Some(&NAMES)));
    contains_all(
        &open_error(std::slice::from_ref(&path), Some("image"), Some("label")),
        &[
            "row 7 (message 2, record batch 1)",
            "label 4 is out of range of the 4 class names",
        ],
    );
    // Without class names, any label goes.
    let path = write(t.path(), &hf_stream(&bad, 4, None));
    let src = ArrowSource::open(std::slice::from_ref(&path), &options(Some("image"), Some("label"))).unwrap();
    assert_eq!(src.label(7), 4);
}

#[test]
fn a_failed_pack_leaves_no_dataset() {
    let t = tempfile::tempdir().unwrap();
    let path = write(t.path(), &hf_stream(&rows(0, 10), 4, Some(&NAMES)));
    let src = ArrowSource::open(std::slice::from_ref(&path), &options(Some("image"), None)).unwrap();
    // The file changes after listing: reads past its end fail, by name.
    fs::write(&path, &hf_stream(&rows(0, 10), 4, Some(&NAMES))[..400]).unwrap();
    let out = t.path().join("ds");
    let err = pack(&src, &out, &PackOptions::default(), &|_, _, _| {}).expect_err("truncated after listing");
    contains_all(
        &err.to_string(),
        &[&path.display().to_string(), "data-00000-of-00001.arrow:"],
    );
    assert!(!out.exists());
}

#[test]
fn no_damaged_file_panics() {
    let t = tempfile::tempdir().unwrap();
    let good = hf_stream(&rows(0, 6), 4, Some(&NAMES));
    let path = t.path().join("x.arrow");
    let one = std::slice::from_ref(&path);
    let opts = options(Some("image"), Some("label"));
    for cut in 0..good.len() {
        fs::write(&path, &good[..cut]).unwrap();
        assert!(ArrowSource::open(one, &opts).is_err(), "cut at {cut}");
    }
    // Every byte flipped in turn (in both formats): an error or a listing,
    // never a panic; whatever is listed reads or fails by name.
    for bytes in [good.clone(), file_format(&good)] {
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0xA5;
            fs::write(&path, &damaged).unwrap();
            if let Ok(src) = ArrowSource::open(one, &opts) {
                (0..src.len()).for_each(|i| drop(src.read(i)));
            }
        }
    }
}
