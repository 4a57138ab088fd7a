//! A read that fails after several chunks have been written must leave
//! neither the output nor the temporary directory behind.

use std::sync::atomic::{AtomicUsize, Ordering};

use brand_pack::source::{Entries, Source};
use brand_pack::{PackOptions, pack};
use brand_testkit::Generated;

/// Samples of 5000 bytes, counted in `reads` as they are read; the read
/// of sample `fail_at` fails.
fn failing(entries: Entries, fail_at: usize, reads: &AtomicUsize) -> impl Source + '_ {
    Generated::new(entries, move |i| {
        reads.fetch_add(1, Ordering::Relaxed);
        if i == fail_at {
            return Err(brand_format::Error::input(
                "virtual/source",
                format!("sample {i}"),
                "disk went away",
            ));
        }
        Ok(vec![i as u8; 5000])
    })
}

#[test]
fn a_late_read_error_leaves_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let entries: Entries = (0..2000).map(|i| (format!("k{i}").into_bytes(), 0)).collect();
    let opts = PackOptions {
        chunk_size: 8,
        seed: 1,
        ..Default::default()
    };
    // Find where entry 1234 lands in the packed order, so we know chunks are
    // written before the failure.
    let order = brand_format::rng::Prng::stream(1, &[brand_format::rng::domain::PACK]).permutation(2000);
    let packed_pos = order.iter().position(|&e| e == 1234).expect("present");
    assert!(
        packed_pos > 8 * 8,
        "the failure must come after the first batch of chunks"
    );

    let reads = AtomicUsize::new(0);
    let src = failing(entries, 1234, &reads);
    let out = t.path().join("ds");
    let seen_bytes = std::sync::Mutex::new(0u64);
    let err = pack(&src, &out, &opts, &|_, _, bytes| {
        *seen_bytes.lock().expect("lock") = bytes
    })
    .expect_err("the read error must fail the pack");
    assert!(
        err.to_string().contains("sample 1234") && err.to_string().contains("disk went away"),
        "{err}"
    );
    assert!(
        *seen_bytes.lock().expect("lock") > 0,
        "some chunks were written before the error"
    );
    assert!(reads.load(Ordering::Relaxed) > 64);
    let left: Vec<_> = std::fs::read_dir(t.path()).expect("list").collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_dead_packs_directory_with_a_damaged_checkpoint_is_removed_not_resumed() {
    let t = tempfile::tempdir().expect("tempdir");
    let entries: Entries = (0..100).map(|i| (format!("k{i}").into_bytes(), 0)).collect();
    let reads = AtomicUsize::new(0);
    let src = failing(entries, usize::MAX, &reads);
    // A dead process id: a child that has exited.
    let mut dead = std::process::Command::new("true").spawn().expect("spawn true");
    dead.wait().expect("wait");
    let stale = t.path().join(format!(".ds.packing-{}", dead.id()));
    std::fs::create_dir(&stale).expect("mkdir");
    std::fs::write(stale.join("resume.json"), b"{\"fingerprint\": 7").expect("write");
    std::fs::write(stale.join("data-00000.brd"), vec![1u8; 4096]).expect("write");
    let out = t.path().join("ds");
    let opts = PackOptions {
        chunk_size: 8,
        ..Default::default()
    };
    let m = pack(&src, &out, &opts, &|_, _, _| {}).expect("packs anew");
    assert_eq!(m.samples, 100);
    assert!(!stale.exists(), "the damaged work directory is removed");
    let ds = brand_format::Dataset::open(&out).expect("a whole dataset");
    assert_eq!(ds.index.samples(), 100);
    assert!(!out.join("resume.json").exists(), "no checkpoint in the dataset");
}
