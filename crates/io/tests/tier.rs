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
        pinned_share: None,
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

/// Asks `tier` for every chunk of `ds` and keeps those admitted; returns
/// the chunks now kept and the refusals.
fn fill(tier: &Arc<Tier>, ds: &Dataset) -> (u64, Vec<Refusal>) {
    let mut refused = Vec::new();
    for c in 0..ds.index.chunk_count() {
        match tier.admit(c).expect("admit") {
            Admission::Admitted(r) => r.keep(&chunk_bytes(ds, c)).expect("keep"),
            Admission::Refused(why) => refused.push(why),
            Admission::Present | Admission::Busy => {}
        }
    }
    let kept = (0..ds.index.chunk_count()).filter(|&c| tier.is_present(c)).count() as u64;
    (kept, refused)
}

fn chunks_bytes(ds: &Dataset) -> u64 {
    (0..ds.index.chunk_count()).map(|c| ds.index.chunk_padded_len(c)).sum()
}

/// Two datasets and a tier with room for one of them and half the other.
struct TwoDatasets {
    _t: tempfile::TempDir,
    a_ds: Arc<Dataset>,
    b_ds: Arc<Dataset>,
    a_bytes: u64,
    b_bytes: u64,
    limit: u64,
    settings: TierSettings,
}

fn two_datasets() -> TwoDatasets {
    let t = tempfile::tempdir().expect("tempdir");
    let a_ds = Arc::new(common::small_dataset(&t.path().join("a"), 300));
    let b_ds = Arc::new(common::small_dataset(&t.path().join("b"), 300));
    let (a_bytes, b_bytes) = (chunks_bytes(&a_ds), chunks_bytes(&b_ds));
    let limit = a_bytes + b_bytes / 2;
    let settings = TierSettings {
        dir: t.path().join("tier"),
        limit: TierLimit::Bytes(limit),
        pinned_share: None,
    };
    TwoDatasets {
        _t: t,
        a_ds,
        b_ds,
        a_bytes,
        b_bytes,
        limit,
        settings,
    }
}

#[test]
fn a_full_tiers_space_goes_to_the_dataset_that_waits_for_the_store() {
    let TwoDatasets {
        _t,
        a_ds,
        b_ds,
        a_bytes,
        b_bytes,
        limit,
        settings,
    } = two_datasets();
    // b's job hides the store behind its compute (benefit 0), and takes the
    // free space while nobody else wants it.
    let b = Tier::open(&settings, "s3://bkt/b", b_ds.clone()).expect("open b");
    let r = b.rebalance(Some(0.0)).expect("rebalance");
    assert_eq!((r.owed, r.yielding, r.evicted), (0, false, 0));
    assert_eq!(fill(&b, &b_ds), (b_ds.index.chunk_count(), vec![]));
    // a's job waits for the store most of its time: owed all of a.
    let a = Tier::open(&settings, "s3://bkt/a", a_ds.clone()).expect("open a");
    let r = a.rebalance(Some(0.8)).expect("rebalance");
    assert_eq!((r.owed, r.held, r.evicted, r.yielding), (a_bytes, 0, 0, false));
    let (kept, refused) = fill(&a, &a_ds);
    assert!(kept < a_ds.index.chunk_count() && refused.iter().all(|&w| w == Refusal::Limit));
    let a_first = kept;
    // b's next rebalance sheds what a is short of (no more than that and a
    // chunk), and leaves the free space to a.
    let a_held: u64 = (0..a_ds.index.chunk_count())
        .filter(|&c| a.is_present(c))
        .map(|c| a_ds.index.chunk_padded_len(c))
        .sum();
    // What a is short of beyond the free space.
    let short = (a_bytes - a_held) - (limit - (b_bytes + a_held));
    let r = b.rebalance(Some(0.0)).expect("rebalance");
    assert!(r.yielding && r.owed == 0 && r.evicted > 0, "{r:?}");
    let max_chunk = (0..b_ds.index.chunk_count())
        .map(|c| b_ds.index.chunk_padded_len(c))
        .max()
        .unwrap_or(0);
    assert!(
        r.evicted <= short + max_chunk,
        "shed {} for a shortfall of {short}",
        r.evicted
    );
    assert_eq!(r.held, b_bytes - r.evicted);
    assert_eq!(b.evicted_bytes(), r.evicted);
    let shed: Vec<u64> = (0..b_ds.index.chunk_count()).filter(|&c| !b.entry_kept(c)).collect();
    assert!(!shed.is_empty());
    for &c in &shed {
        assert!(!b.is_present(c), "chunk {c} shed but still known kept");
        assert!(matches!(
            b.admit(c).expect("admit"),
            Admission::Refused(Refusal::Placement)
        ));
        // Its bytes are gone from the tier's file (a hole): a reader that
        // still thought it kept finds its records' crc32c wrong.
        let loc = b_ds.index.chunk(c);
        let file = std::fs::read(b.dir().join(&b_ds.manifest.segments[loc.segment as usize].name)).expect("segment");
        let at = loc.offset as usize;
        let len = b_ds.index.chunk_padded_len(c) as usize;
        assert!(
            file[at..at + len].iter().all(|&x| x == 0),
            "chunk {c}'s bytes are still there"
        );
        assert!(b_ds.check_chunk(c, &file[at..at + len]).is_err());
    }
    // a takes the room: all of a kept, the limit held.
    let (kept, refused) = fill(&a, &a_ds);
    assert!(kept > a_first);
    assert_eq!((kept, refused), (a_ds.index.chunk_count(), vec![]));
    assert!(a.held_bytes() <= limit, "{} > {limit}", a.held_bytes());
    assert_eq!(a.held_bytes(), a_bytes + r.held);
    // a's job ends; b's turns I/O-bound: a's version, read by nobody, is
    // removed for it (a whole version: nobody is left to shed its chunks).
    let a_dir = a.dir().to_path_buf();
    drop(a);
    let r = b.rebalance(Some(0.9)).expect("rebalance");
    assert!(!a_dir.exists(), "a's version is still there");
    assert_eq!((r.owed, r.yielding), (b_bytes, false));
    assert!(r.evicted >= a_bytes, "{r:?}");
    assert_eq!(fill(&b, &b_ds), (b_ds.index.chunk_count(), vec![]));
    assert_eq!(b.held_bytes(), b_bytes);
}

#[test]
fn a_dead_readers_claim_is_not_counted() {
    let (t, ds, settings) = setup(TierLimit::Disk);
    let tier = open(&settings, &ds);
    // A claim file nobody holds (its reader died without removing it).
    let jobs = settings.dir.join("jobs");
    std::fs::write(
        jobs.join("ffffffff-ffffffff.1.0"),
        "version ffffffff-ffffffff\nwant 100\nbenefit 0.9\n",
    )
    .expect("write");
    let r = tier.rebalance(Some(0.5)).expect("rebalance");
    assert_eq!(r.placement.shares.len(), 1, "{r:?}");
    assert_eq!(r.placement.shares[0].version, tier.version());
    assert!(
        !jobs.join("ffffffff-ffffffff.1.0").exists(),
        "the dead claim is removed"
    );
    // This reader's own claim says what it measured.
    let own: Vec<_> = std::fs::read_dir(&jobs).expect("jobs").flatten().collect();
    assert_eq!(own.len(), 1);
    let text = std::fs::read_to_string(own[0].path()).expect("claim");
    assert!(text.contains("benefit 0.500000"), "{text}");
    drop(tier);
    assert_eq!(
        std::fs::read_dir(&jobs).expect("jobs").count(),
        0,
        "a closed reader's claim is removed"
    );
    drop(t);
}

#[test]
fn while_another_dataset_is_short_one_takes_free_space_only_up_to_its_own_share() {
    let TwoDatasets {
        _t,
        a_ds,
        b_ds,
        a_bytes,
        b_bytes: _,
        limit,
        settings,
    } = two_datasets();
    let a = Tier::open(&settings, "s3://bkt/a", a_ds.clone()).expect("open a");
    let b = Tier::open(&settings, "s3://bkt/b", b_ds.clone()).expect("open b");
    // Both benefit; a more per byte: a is owed all of a, b the rest.
    a.rebalance(Some(0.9)).expect("rebalance");
    let r = b.rebalance(Some(0.1)).expect("rebalance");
    assert_eq!((r.owed, r.held, r.evicted), (limit - a_bytes, 0, 0));
    assert!(r.yielding, "a is short: {r:?}");
    // The ledger has room for far more than b's share; b takes its share only.
    let (kept, refused) = fill(&b, &b_ds);
    assert!(kept > 0 && refused.contains(&Refusal::Placement), "{kept} {refused:?}");
    let b_held: u64 = (0..b_ds.index.chunk_count())
        .filter(|&c| b.is_present(c))
        .map(|c| b_ds.index.chunk_padded_len(c))
        .sum();
    assert!(b_held <= r.owed, "b holds {b_held} of a share of {}", r.owed);
    // a fills all of a beside it, nothing shed.
    assert_eq!(fill(&a, &a_ds), (a_ds.index.chunk_count(), vec![]));
    assert_eq!(a.held_bytes(), a_bytes + b_held);
    // Once nobody is short, b may use free space again (the rest of its share).
    let r = b.rebalance(Some(0.1)).expect("rebalance");
    assert!(!r.yielding && r.evicted == 0, "{r:?}");
}
