//! The blocks layout (format 2) as `brand pack` writes it: a sample read
//! alone costs the fewest 4 KiB blocks its size allows (a 4 KiB sample is
//! one block read at read gap 0, not two), the padding that costs is
//! reported alike by the manifest, the index and `inspect`, and a dataset
//! of a format this build does not read is refused at open, naming it.

use std::path::Path;

use brand_format::Dataset;
use brand_format::extents::{ReadGap, extents};
use brand_pack::source::Source;
use brand_pack::{PackOptions, pack};
use brand_testkit::Generated;

/// `count` samples whose sizes cycle through `sizes`.
fn sized(count: usize, sizes: &[usize]) -> impl Source {
    let sizes = sizes.to_vec();
    Generated::keyed(
        count,
        |i| format!("s/{i:06}"),
        |i| (i % 7) as i64,
        move |i| Ok(vec![(i % 251) as u8; sizes[i % sizes.len()]]),
    )
}

fn packed(dir: &Path, count: usize, sizes: &[usize], zstd: Option<i32>) -> Dataset {
    std::fs::create_dir_all(dir).expect("mkdir");
    let out = dir.join("ds");
    let opts = PackOptions {
        zstd,
        ..Default::default()
    };
    pack(&sized(count, sizes), &out, &opts, &|_, _, _| {}).expect("pack");
    Dataset::open(&out).expect("open")
}

/// Bytes read for every sample alone (read gap 0), and the fewest possible.
fn read_alone(ds: &Dataset) -> (u64, u64) {
    let (mut read, mut fewest) = (0, 0);
    for id in 0..ds.index.samples() {
        let c = ds.index.chunk_of(id);
        let slot = id % ds.index.chunk_size() as u64;
        let ext = extents(&ds.index, c, 1 << slot, ReadGap::Bytes(0));
        assert_eq!(ext.len(), 1);
        read += ext[0].len;
        fewest += (ds.index.stored_len(id) as u64).div_ceil(4096).max(1) * 4096;
    }
    (read, fewest)
}

#[test]
fn samples_of_one_block_or_a_multiple_of_it_read_no_extra_block() {
    let t = tempfile::tempdir().expect("tempdir");
    // 4 KiB exactly, then a mix that straddles blocks from 64-byte boundaries.
    for (name, sizes) in [
        ("4 KiB", &[4096][..]),
        ("1 KiB", &[1024][..]),
        ("mixed", &[4096, 1000, 3000, 8192, 2500, 16384, 700, 5000, 12000][..]),
    ] {
        let dir = t.path().join(name.replace(' ', "-"));
        let ds = packed(&dir, 300, sizes, None);
        assert_eq!(ds.manifest.format_version, 3);
        let (read, fewest) = read_alone(&ds);
        assert_eq!(read, fewest, "{name}: every sample read alone in the fewest blocks");
        // The padding that bought it: the same in manifest, index and inspect.
        let padding = ds.index.block_padding();
        assert_eq!(ds.manifest.block_padding_bytes, padding, "{name}");
        let s = brand_store::inspect::summary(&ds);
        assert_eq!(
            (s.block_padding_bytes, s.layout.as_str()),
            (padding, "blocks"),
            "{name}"
        );
        assert!(s.to_string().contains("layout       blocks:"), "{s}");
        // Under a block per record at most, and less than the records themselves.
        assert!(padding < 4096 * ds.index.samples(), "{name}: {padding}");
        assert!(padding < ds.manifest.stored_bytes, "{name}: {padding}");
        if name == "mixed" {
            assert!(padding > 0, "{name}: some sample had to move");
        }
        let report = brand_store::verify::verify(&ds, &|_, _| {}).expect("verify");
        assert!(report.problems.is_empty(), "{name}: {:?}", report.problems);
        for id in [0, 17, 299] {
            let got = ds.read_sample(id).expect("read");
            assert_eq!(got.len(), ds.index.raw_len(id) as usize, "{name}: sample {id}");
        }
    }
}

#[test]
fn a_4_kib_sample_dataset_wastes_almost_nothing_on_disk() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = packed(t.path(), 640, &[4096], None);
    // One block of header per chunk, and the 4 KiB samples back to back
    // after it: the padding is what separates the header from the first.
    let chunks = ds.index.chunk_count();
    assert_eq!(ds.manifest.data_bytes, (ds.index.samples() + chunks) * 4096);
    assert!(ds.index.block_padding() < chunks * 4096);
}

#[test]
fn compressed_records_follow_the_layout_too() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = packed(t.path(), 200, &[4096, 9000, 30000], Some(1));
    let (read, fewest) = read_alone(&ds);
    assert_eq!(read, fewest);
    let report = brand_store::verify::verify(&ds, &|_, _| {}).expect("verify");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_dataset_of_a_newer_format_is_refused_at_open_naming_the_version() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = packed(t.path(), 64, &[4096], None).dir().to_path_buf();
    let manifest = dir.join("manifest.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    assert!(text.contains("format_version = 3"), "{text}");
    std::fs::write(&manifest, text.replacen("format_version = 3", "format_version = 4", 1)).expect("write");
    let msg = Dataset::open(&dir).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        msg.contains("manifest.toml") && msg.contains("format version 4 (this build reads versions 1 to 3"),
        "{msg}"
    );
}
