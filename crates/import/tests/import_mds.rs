//! MDS import: payload and label columns of every encoding brand takes,
//! keys `shard:index`, zstd shards against plain ones, and a named error for
//! each kind of damaged input. Datasets are written here by a small MDS
//! writer following Streaming's layout (`u32 n | u32 offsets[n+1] | config
//! JSON | samples`, columns sorted by name, a u32 size per variable column).

use std::fs;
use std::path::{Path, PathBuf};

use brand_format::Dataset;
use brand_import::mds::{MdsOptions, MdsSource};
use brand_pack::source::Source;
use brand_pack::{PackOptions, pack};
use serde_json::json;

// ---- writing MDS ----

/// A column: name, encoding, fixed size (None: variable).
#[derive(Clone)]
struct Column(&'static str, &'static str, Option<u64>);

/// One sample: each column's stored bytes, in column order.
type Row = Vec<Vec<u8>>;

/// A shard's bytes as Streaming's `encode_joint_shard` writes them.
fn shard_bytes(columns: &[Column], rows: &[Row]) -> Vec<u8> {
    let mut samples: Vec<Vec<u8>> = Vec::new();
    for row in rows {
        assert_eq!(row.len(), columns.len());
        let mut sample = Vec::new();
        for (col, value) in columns.iter().zip(row) {
            if col.2.is_none() {
                sample.extend((value.len() as u32).to_le_bytes());
            }
        }
        for value in row {
            sample.extend_from_slice(value);
        }
        samples.push(sample);
    }
    let config =
        serde_json::to_vec(&json!({"column_names": columns.iter().map(|c| c.0).collect::<Vec<_>>(), "format": "mds"}))
            .unwrap();
    let n = rows.len() as u32;
    let mut offset = 4 + 4 * (n + 1) + config.len() as u32;
    let mut out = n.to_le_bytes().to_vec();
    out.extend(offset.to_le_bytes());
    for s in &samples {
        offset += s.len() as u32;
        out.extend(offset.to_le_bytes());
    }
    out.extend(config);
    samples.iter().for_each(|s| out.extend_from_slice(s));
    out
}

/// Writes `index.json` and the shards of `rows_per_shard` in `dir`; with
/// `zstd`, only the compressed shards (as a Streaming upload holds them).
fn write_mds(dir: &Path, columns: &[Column], rows_per_shard: &[Vec<Row>], zstd: bool) -> Vec<serde_json::Value> {
    fs::create_dir_all(dir).unwrap();
    let mut shards = Vec::new();
    for (k, rows) in rows_per_shard.iter().enumerate() {
        let raw = shard_bytes(columns, rows);
        let basename = format!("shard.{k:05}.mds");
        let zip = zstd.then(|| zstd::encode_all(&raw[..], 3).unwrap());
        match &zip {
            Some(z) => fs::write(dir.join(format!("{basename}.zstd")), z).unwrap(),
            None => fs::write(dir.join(&basename), &raw).unwrap(),
        }
        shards.push(json!({
            "column_encodings": columns.iter().map(|c| c.1).collect::<Vec<_>>(),
            "column_names": columns.iter().map(|c| c.0).collect::<Vec<_>>(),
            "column_sizes": columns.iter().map(|c| c.2).collect::<Vec<_>>(),
            "compression": if zstd { json!("zstd:3") } else { json!(null) },
            "format": "mds",
            "hashes": [],
            "raw_data": {"basename": basename, "bytes": raw.len(), "hashes": {}},
            "samples": rows.len(),
            "size_limit": 67108864,
            "version": 2,
            "zip_data": match &zip {
                Some(z) => json!({"basename": format!("{basename}.zstd"), "bytes": z.len(), "hashes": {}}),
                None => json!(null),
            },
        }));
    }
    write_index(dir, &shards);
    shards
}

fn write_index(dir: &Path, shards: &[serde_json::Value]) {
    let index = json!({"version": 2, "shards": shards});
    fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

/// Columns as MDSWriter sorts them: caption (str), image (jpeg), label
/// (int), weight (float32, fixed), and a second label as uint16.
fn columns() -> Vec<Column> {
    vec![
        Column("caption", "str", None),
        Column("cls16", "uint16", Some(2)),
        Column("image", "jpeg", None),
        Column("label", "int", Some(8)),
        Column("weight", "float32", Some(4)),
    ]
}

fn image(shard: usize, i: usize) -> Vec<u8> {
    let mut v = format!("\u{ff}\u{d8} jpeg {shard}/{i} ").into_bytes();
    v.extend((0..(i * 53 + shard * 7) % 3000).map(|b| (b * 31) as u8));
    v
}

fn label(shard: usize, i: usize) -> i64 {
    if i % 11 == 5 {
        -1
    } else {
        (shard * 1000 + i) as i64 % 997
    }
}

/// A sample as `(key, label, image, cls16)`.
type Want = (String, i64, Vec<u8>, i64);

/// Shards of `sizes[k]` samples; and every sample.
fn dataset(sizes: &[usize]) -> (Vec<Vec<Row>>, Vec<Want>) {
    let mut want = Vec::new();
    let shards = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            (0..n)
                .map(|i| {
                    let cls16 = (i * 1111 % 65536) as u16;
                    want.push((
                        format!("shard.{k:05}.mds:{i}"),
                        label(k, i),
                        image(k, i),
                        i64::from(cls16),
                    ));
                    vec![
                        format!("caption {k}/{i}").into_bytes(),
                        cls16.to_le_bytes().to_vec(),
                        image(k, i),
                        label(k, i).to_le_bytes().to_vec(),
                        (i as f32).to_le_bytes().to_vec(),
                    ]
                })
                .collect()
        })
        .collect();
    (shards, want)
}

// ---- reading back ----

fn options(spool: &Path, field: Option<&str>, label: Option<&str>) -> MdsOptions {
    MdsOptions {
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

fn packed(dir: &Path) -> Vec<(String, i64, Vec<u8>)> {
    let d = Dataset::open(dir).unwrap();
    let mut out: Vec<_> = (0..d.index.samples())
        .map(|id| {
            let key = String::from_utf8(d.index.key(id).to_vec()).unwrap();
            (key, d.index.label(id), d.read_sample(id).unwrap())
        })
        .collect();
    out.sort();
    out
}

fn pack_to(src: &dyn Source, out: &Path) -> brand_format::Result<()> {
    let opts = PackOptions {
        chunk_size: 4,
        ..PackOptions::default()
    };
    pack(src, out, &opts, &|_, _, _| {}).map(|_| ())
}

fn contains_all(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
}

#[test]
fn every_sample_keeps_its_bytes_label_and_key() {
    let t = tempfile::tempdir().unwrap();
    let (shards, want) = dataset(&[40, 1, 23]);
    let dir = t.path().join("mds");
    write_mds(&dir, &columns(), &shards, false);
    // The directory or its index.json.
    for input in [dir.clone(), dir.join("index.json")] {
        let src = MdsSource::open(&input, &options(t.path(), Some("image"), Some("label"))).unwrap();
        assert_eq!(src.kind(), "mds");
        let got = samples(&src);
        let expected: Vec<_> = want.iter().map(|(k, l, b, _)| (k.clone(), *l, b.clone())).collect();
        assert_eq!(got, expected);
    }
    // A fixed-size unsigned label column; the caption as the payload.
    let src = MdsSource::open(&dir, &options(t.path(), Some("caption"), Some("cls16"))).unwrap();
    let got = samples(&src);
    for ((key, label, bytes), (wkey, _, _, cls16)) in got.iter().zip(&want) {
        assert_eq!((key, label), (wkey, cls16));
        let (shard, i) = wkey.trim_start_matches("shard.").split_once(".mds:").unwrap();
        assert_eq!(
            bytes,
            format!("caption {}/{i}", shard.parse::<usize>().unwrap()).as_bytes()
        );
    }
    // Packed: every sample by key.
    let src = MdsSource::open(&dir, &options(t.path(), Some("image"), Some("label"))).unwrap();
    let out = t.path().join("ds");
    pack_to(&src, &out).unwrap();
    let mut expected: Vec<_> = want.iter().map(|(k, l, b, _)| (k.clone(), *l, b.clone())).collect();
    expected.sort();
    assert_eq!(packed(&out), expected);
}

#[test]
fn zstd_shards_pack_byte_identical_to_plain_ones() {
    let t = tempfile::tempdir().unwrap();
    let (shards, want) = dataset(&[30, 17]);
    write_mds(&t.path().join("plain"), &columns(), &shards, false);
    write_mds(&t.path().join("zstd"), &columns(), &shards, true);
    assert!(!t.path().join("zstd/shard.00000.mds").exists());
    let spool = t.path().join("spool");
    fs::create_dir(&spool).unwrap();
    let plain = MdsSource::open(&t.path().join("plain"), &options(&spool, Some("image"), Some("label"))).unwrap();
    let zstd = MdsSource::open(&t.path().join("zstd"), &options(&spool, Some("image"), Some("label"))).unwrap();
    assert_eq!(samples(&zstd), samples(&plain));
    assert_eq!(samples(&zstd).len(), want.len());
    // The spool is anonymous: nothing is left in its directory.
    assert_eq!(fs::read_dir(&spool).unwrap().count(), 0);
    pack_to(&plain, &t.path().join("a")).unwrap();
    pack_to(&zstd, &t.path().join("b")).unwrap();
    for name in ["index.bin", "manifest.toml"] {
        let (a, b) = (
            fs::read(t.path().join("a").join(name)).unwrap(),
            fs::read(t.path().join("b").join(name)).unwrap(),
        );
        assert!(a == b, "{name} differs");
    }
    assert_eq!(packed(&t.path().join("a")), packed(&t.path().join("b")));
}

#[test]
fn label_encodings_and_the_payload_choice() {
    let t = tempfile::tempdir().unwrap();
    let cols = vec![
        Column("data", "bytes", None),
        Column("i8", "int8", Some(1)),
        Column("s", "str_int", None),
        Column("u64", "uint64", Some(8)),
    ];
    let rows: Vec<Row> = (0..5i64)
        .map(|i| {
            vec![
                vec![i as u8; i as usize + 1],
                ((-i) as i8).to_le_bytes().to_vec(),
                format!("{}", i * 1_000_000_007).into_bytes(),
                ((i as u64) << 40).to_le_bytes().to_vec(),
            ]
        })
        .collect();
    let dir = t.path().join("mds");
    write_mds(&dir, &cols, &[rows], false);
    // One bytes-like column: the payload without --field; no label: -1.
    let src = MdsSource::open(&dir, &options(t.path(), None, None)).unwrap();
    assert_eq!(samples(&src)[3], ("shard.00000.mds:3".to_string(), -1, vec![3u8; 4]));
    for (label, f) in [
        ("i8", (|i: i64| -i) as fn(i64) -> i64),
        ("s", |i| i * 1_000_000_007),
        ("u64", |i| i << 40),
    ] {
        let src = MdsSource::open(&dir, &options(t.path(), None, Some(label))).unwrap();
        let labels: Vec<i64> = (0..src.len()).map(|i| src.label(i)).collect();
        assert_eq!(labels, (0..5).map(f).collect::<Vec<_>>(), "{label}");
    }
    let e = MdsSource::open(&dir, &options(t.path(), None, Some("data")))
        .unwrap_err()
        .to_string();
    contains_all(&e, &["index.json", "label column \"data\" has encoding bytes"]);
    let e = MdsSource::open(&dir, &options(t.path(), Some("s"), None))
        .unwrap_err()
        .to_string();
    contains_all(&e, &["column \"s\" has encoding str_int", "bytes, str, jpeg or png"]);

    // Several candidates: --field needed; pkl and ndarray refused.
    let cols = vec![
        Column("a", "png", None),
        Column("b", "pkl", None),
        Column("c", "str", None),
    ];
    let rows: Vec<Row> = vec![vec![b"png".to_vec(), b"pickle".to_vec(), b"text".to_vec()]];
    let dir = t.path().join("two");
    write_mds(&dir, &cols, &[rows], false);
    let e = MdsSource::open(&dir, &options(t.path(), None, None))
        .unwrap_err()
        .to_string();
    contains_all(&e, &["choose one with --field", "a (png), b (pkl), c (str)"]);
    let e = MdsSource::open(&dir, &options(t.path(), Some("b"), None))
        .unwrap_err()
        .to_string();
    contains_all(&e, &["column \"b\" has encoding pkl"]);
    let e = MdsSource::open(&dir, &options(t.path(), Some("nope"), None))
        .unwrap_err()
        .to_string();
    contains_all(&e, &["index.json", "shard 0", "no column \"nope\""]);
    let src = MdsSource::open(&dir, &options(t.path(), Some("a"), Some("none"))).unwrap();
    assert_eq!(samples(&src), [("shard.00000.mds:0".to_string(), -1, b"png".to_vec())]);
}

// ---- damaged input ----

/// A small dataset (one plain shard of 3 samples) to damage.
fn small(dir: &Path) -> (PathBuf, Vec<u8>, Vec<serde_json::Value>) {
    let cols = vec![Column("image", "bytes", None), Column("label", "int", Some(8))];
    let rows: Vec<Row> = (0..3i64)
        .map(|i| vec![vec![b'x'; 100 + i as usize], i.to_le_bytes().to_vec()])
        .collect();
    let index = write_mds(dir, &cols, &[rows], false);
    let shard = dir.join("shard.00000.mds");
    let bytes = fs::read(&shard).unwrap();
    (shard, bytes, index)
}

/// The error opening (or packing) the damaged dataset in `dir`; checks
/// that a failed pack leaves nothing and the message names `names`.
fn error_of(dir: &Path, label: Option<&str>, names: &Path) -> String {
    let before: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    let err = match MdsSource::open(dir, &options(dir, Some("image"), label)) {
        Ok(src) => {
            let out = dir.join("out");
            let err = pack_to(&src, &out).expect_err("packing damaged input");
            assert!(!out.exists());
            err
        }
        Err(e) => e,
    };
    let after: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(before, after, "files left behind");
    let message = err.to_string();
    assert!(message.contains(&names.display().to_string()), "{message}");
    message
}

#[test]
fn a_damaged_shard_is_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("mds");
    let (shard, good, _) = small(&dir);
    let offset = |i: usize| u32::from_le_bytes(good[4 + 4 * i..8 + 4 * i].try_into().unwrap());
    let set = |bytes: &mut Vec<u8>, i: usize, v: u32| bytes[4 + 4 * i..8 + 4 * i].copy_from_slice(&v.to_le_bytes());
    assert!(MdsSource::open(&dir, &options(&dir, Some("image"), Some("label"))).is_ok());

    // The offset table runs past the end of the shard.
    fs::write(&shard, &good[..12]).unwrap();
    contains_all(
        &error_of(&dir, None, &shard),
        &["byte 4", "offset table of 4 entries ends at byte 20", "past the end"],
    );
    // The last offset past the end.
    fs::write(&shard, &good[..good.len() - 1]).unwrap();
    contains_all(
        &error_of(&dir, None, &shard),
        &["offset table entry 3", "past the end of the shard"],
    );
    // Offsets not increasing.
    let mut bad = good.clone();
    set(&mut bad, 2, offset(1));
    fs::write(&shard, &bad).unwrap();
    contains_all(
        &error_of(&dir, None, &shard),
        &["offset table entry 2", "offsets not increasing"],
    );
    // An offset into the table.
    let mut bad = good.clone();
    set(&mut bad, 0, 8);
    fs::write(&shard, &bad).unwrap();
    contains_all(&error_of(&dir, None, &shard), &["inside the shard's offset table"]);
    // A sample whose column sizes do not add up to its span.
    let mut bad = good.clone();
    let s1 = offset(1) as usize;
    bad[s1..s1 + 4].copy_from_slice(&50u32.to_le_bytes());
    fs::write(&shard, &bad).unwrap();
    contains_all(
        &error_of(&dir, None, &shard),
        &[
            &format!("sample 1 at byte {s1}"),
            "sample sizes do not match",
            "62 bytes",
            "gives it 113",
        ],
    );
    // A count that is not index.json's.
    let mut bad = good.clone();
    bad[..4].copy_from_slice(&7u32.to_le_bytes());
    fs::write(&shard, &bad).unwrap();
    contains_all(
        &error_of(&dir, None, &shard),
        &["byte 0", "holds 7 samples, index.json says 3"],
    );
    // Changed after listing: the pack fails and leaves nothing.
    fs::write(&shard, &good).unwrap();
    let src = MdsSource::open(&dir, &options(&dir, Some("image"), None)).unwrap();
    fs::write(&shard, &good[..offset(1) as usize]).unwrap();
    let out = t.path().join("out");
    let e = pack_to(&src, &out).unwrap_err().to_string();
    contains_all(&e, &["shard.00000.mds", "ended early"]);
    assert!(!out.exists());
}

#[test]
fn a_damaged_zstd_shard_is_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("mds");
    let (shard, good, index) = small(&dir);
    fs::remove_file(&shard).unwrap();
    let zip = dir.join("shard.00000.mds.zstd");
    let mut entry = index[0].clone();
    entry["compression"] = json!("zstd:7");
    entry["zip_data"] = json!({"basename": "shard.00000.mds.zstd", "bytes": 0, "hashes": {}});
    write_index(&dir, &[entry]);
    // Whole: fine; cut inside a sample (decompressed whole, then cut).
    fs::write(&zip, zstd::encode_all(&good[..], 7).unwrap()).unwrap();
    assert_eq!(
        MdsSource::open(&dir, &options(&dir, Some("image"), Some("label")))
            .unwrap()
            .len(),
        3
    );
    fs::write(&zip, zstd::encode_all(&good[..good.len() - 20], 7).unwrap()).unwrap();
    contains_all(
        &error_of(&dir, None, &zip),
        &["of the decompressed shard", "truncated", "sample 2"],
    );
    // The compressed stream itself cut short.
    let z = zstd::encode_all(&good[..], 7).unwrap();
    fs::write(&zip, &z[..z.len() / 2]).unwrap();
    error_of(&dir, None, &zip);
    // Not zstd at all.
    fs::write(&zip, &good).unwrap();
    error_of(&dir, None, &zip);
}

#[test]
fn a_bad_index_is_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("mds");
    let (shard, _, index) = small(&dir);
    let index_json = dir.join("index.json");
    // Malformed JSON, and JSON that is not an index.
    fs::write(&index_json, b"{\"version\": 2, \"shards\": [").unwrap();
    contains_all(&error_of(&dir, None, &index_json), &["index.json", "malformed"]);
    fs::write(&index_json, b"{\"shards\": []}").unwrap();
    contains_all(&error_of(&dir, None, &index_json), &["missing field `version`"]);
    // A shard entry missing a field; a non-MDS shard; an unknown compression.
    let mut entry = index[0].clone();
    entry.as_object_mut().unwrap().remove("column_sizes");
    write_index(&dir, &[entry]);
    contains_all(&error_of(&dir, None, &index_json), &["shard 0", "column_sizes"]);
    let mut entry = index[0].clone();
    entry["format"] = json!("jsonl");
    write_index(&dir, &[index[0].clone(), entry]);
    contains_all(
        &error_of(&dir, None, &index_json),
        &["shard 1", "format \"jsonl\"", "MDS shards"],
    );
    let mut entry = index[0].clone();
    entry["compression"] = json!("br:11");
    write_index(&dir, &[entry]);
    contains_all(&error_of(&dir, None, &index_json), &["compression \"br:11\""]);
    // Column arrays of different lengths.
    let mut entry = index[0].clone();
    entry["column_encodings"] = json!(["bytes"]);
    write_index(&dir, &[entry]);
    contains_all(&error_of(&dir, None, &index_json), &["2 column names, 1 encodings"]);
    // A missing shard file; a name leaving the directory.
    let mut entry = index[0].clone();
    entry["raw_data"]["basename"] = json!("gone.mds");
    write_index(&dir, &[entry]);
    contains_all(&error_of(&dir, None, &index_json), &["missing shard file", "gone.mds"]);
    let mut entry = index[0].clone();
    entry["raw_data"]["basename"] = json!("../shard.00000.mds");
    write_index(&dir, &[entry]);
    contains_all(&error_of(&dir, None, &index_json), &["not a path inside"]);
    // A label column the shard lacks; a label of the wrong size.
    write_index(&dir, &index);
    contains_all(&error_of(&dir, Some("cls"), &index_json), &["no label column \"cls\""]);
    let mut entry = index[0].clone();
    entry["column_sizes"] = json!([null, 4]);
    write_index(&dir, &[entry]);
    contains_all(
        &error_of(&dir, Some("label"), &index_json),
        &["encoding int has size Some(4)"],
    );
    // An index with no samples.
    write_index(&dir, &[]);
    contains_all(&error_of(&dir, None, &index_json), &["no samples"]);
    assert!(shard.exists());
}

#[test]
fn a_label_brand_cannot_hold_is_a_named_error() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("mds");
    let cols = vec![Column("image", "bytes", None), Column("label", "uint64", Some(8))];
    let rows: Vec<Row> = [5u64, u64::MAX]
        .iter()
        .map(|&l| vec![b"img".to_vec(), l.to_le_bytes().to_vec()])
        .collect();
    write_mds(&dir, &cols, &[rows], false);
    let shard = dir.join("shard.00000.mds");
    contains_all(
        &error_of(&dir, Some("label"), &shard),
        &["sample 1 at byte", "label 18446744073709551615 is above"],
    );
}

#[test]
fn no_damaged_shard_panics() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("mds");
    let (shard, good, _) = small(&dir);
    // Every byte flipped and every length cut: an error or a listing, never a panic.
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0xa5;
        fs::write(&shard, &bad).unwrap();
        if let Ok(src) = MdsSource::open(&dir, &options(&dir, Some("image"), Some("label"))) {
            (0..src.len()).for_each(|s| drop(src.read(s)));
        }
        fs::write(&shard, &good[..i]).unwrap();
        assert!(
            MdsSource::open(&dir, &options(&dir, Some("image"), Some("label"))).is_err(),
            "cut at {i}"
        );
    }
}
