//! A dataset whose files disagree (an index from another pack, a manifest
//! edited by hand, chunks compressed differently than the manifest says) is
//! refused with a named error or reported by `verify`, never a panic or a
//! sample served wrongly.

use std::path::Path;

use brand_format::Dataset;
use brand_pack::source::{Entries, Source};
use brand_pack::{PackOptions, pack};
use brand_store::verify::verify;
use brand_testkit::Generated;

/// Compressible samples, different each.
fn bytes(entries: Entries) -> impl Source {
    Generated::new(entries, |i| Ok(vec![i as u8; 3000 + 37 * i]))
}

fn make(dir: &Path, name: &str, samples: usize, chunk_size: u32, zstd: Option<i32>) -> std::path::PathBuf {
    let src = bytes(
        (0..samples)
            .map(|i| (format!("k{i}").into_bytes(), (i % 3) as i64))
            .collect(),
    );
    let out = dir.join(name);
    let opts = PackOptions {
        chunk_size,
        seed: 5,
        zstd,
        ..Default::default()
    };
    pack(&src, &out, &opts, &|_, _, _| {}).expect("pack");
    out
}

fn open_err(dir: &Path) -> String {
    match Dataset::open(dir) {
        Ok(_) => String::from("<opened>"),
        Err(e) => e.to_string(),
    }
}

fn copy_index(from: &Path, to: &Path) {
    std::fs::copy(from.join("index.bin"), to.join("index.bin")).expect("copy index");
}

fn edit_manifest(dir: &Path, from: &str, to: &str) {
    let p = dir.join("manifest.toml");
    let text = std::fs::read_to_string(&p).expect("read manifest");
    assert!(text.contains(from), "{from} not in manifest");
    std::fs::write(&p, text.replacen(from, to, 1)).expect("write manifest");
}

#[test]
fn an_index_from_another_pack_is_refused_or_reported_never_a_panic() {
    let t = tempfile::tempdir().expect("tempdir");
    // Same sample count and chunk size, other sizes: opens (nothing in
    // manifest+index disagrees) and verify reports every mismatch.
    let a = make(t.path(), "a", 100, 8, None);
    let b = make(t.path(), "b", 100, 8, Some(3));
    let c = make(t.path(), "c", 100, 8, None);
    std::fs::remove_dir_all(&c).expect("rm");
    std::fs::create_dir(&c).expect("mkdir");
    for f in ["manifest.toml", "data-00000.brd"] {
        std::fs::copy(a.join(f), c.join(f)).expect("copy");
    }
    // A zstd index under an uncompressed manifest: refused at open.
    copy_index(&b, &c);
    let msg = open_err(&c);
    assert!(msg.contains("index.bin") && msg.contains("compression"), "{msg}");

    // An index with longer records than the segment holds: chunks end past
    // the segment as the manifest sizes it.
    let big = make(t.path(), "big", 100, 8, None);
    let d = t.path().join("d");
    std::fs::create_dir(&d).expect("mkdir");
    for f in ["manifest.toml", "data-00000.brd"] {
        std::fs::copy(a.join(f), d.join(f)).expect("copy");
    }
    // Make "big" differ in sizes: repack 100 samples of another source.
    std::fs::remove_dir_all(&big).expect("rm");
    let src = Generated::new((0..100).map(|i| (vec![i as u8], 0)).collect(), |i| {
        Ok(vec![1u8; 9000 + i])
    });
    let opts = PackOptions {
        chunk_size: 8,
        ..Default::default()
    };
    pack(&src, &big, &opts, &|_, _, _| {}).expect("pack");
    copy_index(&big, &d);
    let msg = open_err(&d);
    assert!(msg.contains("index.bin") && msg.contains("ends at byte"), "{msg}");

    // Same shape, different pack (other seed, same sizes in another order):
    // opens, verify lists problems and does not panic.
    let e = make(t.path(), "e", 100, 8, None);
    let other = t.path().join("other");
    let src = bytes((0..100).map(|i| (vec![i as u8], 7)).collect());
    let opts = PackOptions {
        chunk_size: 8,
        seed: 99,
        ..Default::default()
    };
    pack(&src, &other, &opts, &|_, _, _| {}).expect("pack");
    copy_index(&other, &e);
    if let Ok(ds) = Dataset::open(&e) {
        let report = verify(&ds, &|_, _| {}).expect("verify runs");
        assert!(!report.ok(), "a foreign index must be reported");
    }

    // More or fewer chunks than the manifest: refused at open.
    let fewer = make(t.path(), "fewer", 100, 8, None);
    let more = make(t.path(), "more", 100, 4, None);
    copy_index(&more, &fewer);
    let msg = open_err(&fewer);
    assert!(msg.contains("index.bin") && msg.contains("manifest.toml"), "{msg}");
}

#[test]
fn verify_reports_a_chunk_header_longer_than_the_index_says() {
    // The index (consistent with the manifest) describes shorter records
    // than the chunk header: the header's records run past the bytes read.
    let t = tempfile::tempdir().expect("tempdir");
    let a = make(t.path(), "a", 16, 16, None);
    let ds = Dataset::open(&a).expect("open");
    let mut samples = Vec::new();
    for i in 0..16u64 {
        samples.push(brand_format::index::SampleMeta {
            rel_offset: 100 + i as u32,
            stored_len: 1,
            raw_len: 1,
            crc: 0,
            label: 0,
            key: vec![],
        });
    }
    let idx = brand_format::index::Index::new(16, 1, ds.index.chunk_locs().collect(), samples).expect("index");
    std::fs::write(a.join("index.bin"), idx.as_bytes()).expect("write index");
    let ds = Dataset::open(&a).expect("a shorter index still opens");
    let report = verify(&ds, &|_, _| {}).expect("verify runs");
    assert!(!report.ok());
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.what.contains("runs past the 4096 bytes")),
        "{:?}",
        report.problems.first()
    );
}

#[test]
fn a_zstd_dataset_relabelled_uncompressed_is_refused() {
    let t = tempfile::tempdir().expect("tempdir");
    let z = make(t.path(), "z", 64, 8, Some(3));
    edit_manifest(&z, "compression = \"zstd\"", "compression = \"none\"");
    let msg = open_err(&z);
    assert!(msg.contains("compression") && msg.contains("manifest.toml"), "{msg}");
    edit_manifest(&z, "compression = \"none\"", "compression = \"lz4\"");
    let msg = open_err(&z);
    assert!(msg.contains("manifest.toml") && msg.contains("`compression`"), "{msg}");
}

#[test]
fn chunk_compression_helper_catches_a_relabelled_dataset() {
    // An uncompressed dataset whose manifest says zstd: the index cannot
    // tell (raw == stored is possible for zstd), the chunk header can.
    let t = tempfile::tempdir().expect("tempdir");
    let a = make(t.path(), "a", 32, 8, None);
    let ds = Dataset::open(&a).expect("open");
    let seg = std::fs::read(a.join("data-00000.brd")).expect("segment");
    let at = ds.index.chunk(1).offset as usize;
    ds.check_chunk_compression(1, &seg[at..]).expect("consistent");
    edit_manifest(&a, "compression = \"none\"", "compression = \"zstd\"");
    let ds = Dataset::open(&a).expect("opens: the index cannot tell");
    let msg = ds
        .check_chunk_compression(1, &seg[at..])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("data-00000.brd") && msg.contains("chunk 1") && msg.contains("manifest.toml"),
        "{msg}"
    );
    let report = verify(&ds, &|_, _| {}).expect("verify runs");
    assert!(
        report.problems.iter().any(|p| p.what.contains("compression")),
        "{:?}",
        report.problems
    );
}

#[test]
fn segment_names_outside_the_dataset_are_refused() {
    let t = tempfile::tempdir().expect("tempdir");
    let a = make(t.path(), "a", 16, 8, None);
    std::fs::copy(a.join("data-00000.brd"), t.path().join("outside.brd")).expect("copy");
    edit_manifest(&a, "\"data-00000.brd\"", "\"../outside.brd\"");
    let msg = open_err(&a);
    assert!(msg.contains("manifest.toml") && msg.contains("`name`"), "{msg}");
    let abs = t.path().join("outside.brd").display().to_string();
    edit_manifest(&a, "\"../outside.brd\"", &format!("{abs:?}"));
    let msg = open_err(&a);
    assert!(msg.contains("manifest.toml") && msg.contains("`name`"), "{msg}");
}

/// The keys are not read at open (a reader need not touch them): a damaged
/// key opens, reads every record right, and `verify` names the index.
#[test]
fn a_damaged_key_is_reported_by_verify_and_never_serves_a_wrong_record() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = make(t.path(), "a", 40, 8, None);
    let ipath = dir.join("index.bin");
    let mut bytes = std::fs::read(&ipath).expect("index");
    // The last key's last byte: just before the 16-byte trailer.
    let at = bytes.len() - 17;
    bytes[at] ^= 0x20;
    std::fs::write(&ipath, &bytes).expect("write index");
    let ds = Dataset::open(&dir).expect("keys are checked by verify, not at open");
    for id in 0..ds.index.samples() {
        let data = ds.read_sample(id).expect("every record reads");
        assert_eq!(data.len(), ds.index.raw_len(id) as usize);
    }
    let report = verify(&ds, &|_, _| {}).expect("verify runs");
    // The chunk header holds the key too: both disagreements are named.
    let msgs: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(
        msgs.iter()
            .any(|m| m.contains("index.bin") && m.contains("keys checksum")),
        "{msgs:?}"
    );
    assert!(msgs.iter().any(|m| m.contains("chunk header has")), "{msgs:?}");
}
