//! The local tier's directory (`brand_store::tier`) between processes, as
//! separate opens of it (each its own open file, so its own locks): a chunk
//! being fetched is one process's, the limit holds across them, a live
//! fetch's reservation survives another's recount, a dead one's does not.

mod common;

use std::sync::Arc;

use brand_format::Dataset;
use brand_store::tier::{Admission, Refusal, Tier, TierLimit, TierSettings};

fn setup(limit: TierLimit) -> (tempfile::TempDir, Arc<Dataset>, TierSettings) {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(common::small_dataset(&t.path().join("ds"), 300));
    let settings = TierSettings {
        dir: t.path().join("tier"),
        limit,
    };
    (t, ds, settings)
}

fn open(settings: &TierSettings, ds: &Arc<Dataset>) -> Arc<Tier> {
    Tier::open(settings, "s3://bkt/ds", ds.clone()).expect("open the tier")
}

/// The chunk's bytes as the dataset holds them.
fn chunk_bytes(ds: &Dataset, c: u64) -> Vec<u8> {
    let loc = ds.index.chunk(c);
    let seg = std::fs::read(ds.segment_path(loc.segment)).expect("segment");
    seg[loc.offset as usize..(loc.offset + ds.index.chunk_padded_len(c)) as usize].to_vec()
}

#[test]
fn a_chunk_being_fetched_is_one_processs_and_kept_for_all() {
    let (_t, ds, settings) = setup(TierLimit::Disk);
    let (a, b) = (open(&settings, &ds), open(&settings, &ds));
    let Admission::Admitted(r) = a.admit(0).expect("admit") else {
        panic!("a takes chunk 0")
    };
    assert!(matches!(b.admit(0).expect("admit"), Admission::Busy));
    assert!(!b.is_present(0));
    // Damaged bytes are not kept: the reservation stays this process's.
    let mut bad = chunk_bytes(&ds, 0);
    let last = bad.len() - 1;
    let first_record_end = ds.index.rel_offset(0) as usize + 1;
    bad[first_record_end.min(last)] ^= 1;
    assert!(r.keep(&bad).is_err(), "a damaged chunk is refused");
    // Given back when dropped: now b may take it, keep it, and a sees it.
    let Admission::Admitted(r) = b.admit(0).expect("admit") else {
        panic!("b takes chunk 0")
    };
    r.keep(&chunk_bytes(&ds, 0)).expect("keep");
    assert!(a.is_present(0) && b.is_present(0));
    assert!(matches!(a.admit(0).expect("admit"), Admission::Present));
    assert_eq!(a.held_bytes(), ds.index.chunk_padded_len(0));
    // Kept where a disk backend reads it: the chunk's own offset in its segment file.
    let loc = ds.index.chunk(0);
    let kept = std::fs::read(a.dir().join(&ds.manifest.segments[loc.segment as usize].name)).expect("kept");
    let at = loc.offset as usize;
    assert!(kept[at..at + chunk_bytes(&ds, 0).len()] == chunk_bytes(&ds, 0)[..]);
}

#[test]
fn the_limit_holds_across_processes_and_a_live_fetch_survives_a_recount() {
    let (_t, ds, probe) = setup(TierLimit::Disk);
    let (l0, l1) = (ds.index.chunk_padded_len(0), ds.index.chunk_padded_len(1));
    let settings = TierSettings {
        limit: TierLimit::Bytes(l0 + l1 - 1),
        ..probe
    };
    let (a, b) = (open(&settings, &ds), open(&settings, &ds));
    let Admission::Admitted(r0) = a.admit(0).expect("admit") else {
        panic!("room for chunk 0")
    };
    // Chunk 1 would pass the limit, whoever asks.
    assert!(matches!(b.admit(1).expect("admit"), Admission::Refused(Refusal::Limit)));
    // A third process's open recounts the ledger: a's fetch is live (its lock held), so counted.
    let c = open(&settings, &ds);
    assert_eq!(c.held_bytes(), l0);
    assert!(matches!(c.admit(1).expect("admit"), Admission::Refused(Refusal::Limit)));
    // a's process "dies" mid-fetch: its tier and reservation dropped without keeping.
    drop(r0);
    drop(a);
    assert_eq!(c.held_bytes(), 0, "given back");
    let Admission::Admitted(r1) = c.admit(1).expect("admit") else {
        panic!("room for chunk 1 now")
    };
    r1.keep(&chunk_bytes(&ds, 1)).expect("keep");
    assert_eq!(b.held_bytes(), l1);
}

#[test]
fn an_entry_left_fetching_by_a_dead_process_is_cleared_at_the_next_open() {
    use std::os::unix::fs::FileExt;
    let (_t, ds, settings) = setup(TierLimit::Disk);
    let dir = open(&settings, &ds).dir().to_path_buf();
    // What a kill -9 mid-fetch leaves: chunk 2's entry marked fetching and
    // its length counted in the ledger, and no lock (the kernel dropped it).
    let len = ds.index.chunk_padded_len(2);
    let table = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("chunks"))
        .expect("chunks");
    table
        .write_all_at(&(len | 1 << 63).to_le_bytes(), 2 * 8)
        .expect("entry");
    std::fs::write(settings.dir.join("usage"), len.to_le_bytes()).expect("ledger");
    let b = open(&settings, &ds);
    assert_eq!(b.held_bytes(), 0, "the dead fetch is not counted");
    let entries = std::fs::read(dir.join("chunks")).expect("chunks");
    assert_eq!(&entries[16..24], &[0; 8], "its entry is cleared");
    assert!(matches!(b.admit(2).expect("admit"), Admission::Admitted(_)));
}

#[test]
fn limits_parse_as_bytes_or_a_share_and_refuse_the_rest() {
    assert_eq!(
        "500GiB".parse::<TierLimit>().expect("bytes"),
        TierLimit::Bytes(500 << 30)
    );
    assert_eq!(" 30 % ".parse::<TierLimit>().expect("share"), TierLimit::Percent(30.0));
    for bad in ["0", "0%", "100.5%", "-3%", "lots", ""] {
        let e = bad.parse::<TierLimit>().expect_err(bad).to_string();
        assert!(e.contains("disk_cache_limit"), "{bad}: {e}");
    }
}
