//! The `cache` key through the one configuration path: `Reader::open`
//! attaches to a running cache (what the C ABI, the TF op and Python open),
//! serves each sample once per epoch, and its checkpoints mid-epoch carry the
//! bitmap of the samples served (the count cannot say which), from which it
//! resumes attached or alone, each sample once.

use std::sync::Arc;

use brand_cache::{CacheConfig, CacheHandle};
use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::{Checkpoint, IoConfig, LoaderState, ReadGapSetting, Resume};
use brand_plan::Memory;
use brand_reader::{Config, Reader};

#[test]
fn the_cache_key_makes_a_reader_attach() {
    let t = tempfile::tempdir().expect("tmp");
    let path = small_dataset(t.path(), 300).expect("pack");
    let ds = Arc::new(Dataset::open(&path).expect("open"));
    let socket = t.path().join("c.sock");
    let cfg = CacheConfig {
        memory: Memory::Percent(30.0),
        io: IoConfig {
            read_gap: ReadGapSetting::Whole,
            ..IoConfig::default()
        },
        readahead: 1 << 20,
    };
    let cache = CacheHandle::start(ds, &cfg, &socket).expect("cache");
    let text = format!("cache = {:?}\nbatch_size = 16\nseed = 3", socket.display().to_string());
    let cfg = Config::resolve(&text, toml::Table::new(), &|_| None).expect("config");
    let mut r = Reader::open(&path, &cfg, Resume::At(LoaderState::default())).expect("attaches");
    assert_eq!(r.epoch_len(), 300);
    let first = r.next_batch().expect("batch").expect("some");
    assert_eq!(first.len(), 16);
    let mid = r.checkpoint().expect("mid-epoch");
    let mut want = vec![0u64; 300usize.div_ceil(64)];
    for &id in first.ids() {
        want[id as usize / 64] |= 1 << (id % 64);
    }
    assert_eq!(
        mid.bitmap.as_ref().map(|b| b.words().to_vec()),
        Some(want),
        "the samples served"
    );
    assert_eq!(mid.to_bytes().len(), Checkpoint::len_with_bitmap(300));
    assert_eq!(r.checkpoint_len(), Checkpoint::len_with_bitmap(300));
    let mut ids: Vec<u64> = first.ids().to_vec();
    let mut last = Vec::new();
    while let Some(b) = r.next_batch().expect("batch") {
        ids.extend(b.ids());
        last = b.ids().to_vec();
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..300).collect::<Vec<_>>(), "each sample once");
    let end = r.checkpoint().expect("at the epoch's end");
    assert_eq!(end.state, LoaderState { epoch: 1, served: 0 });
    assert_eq!(end.bitmap, None, "a count is the whole state at an epoch's start");
    // Inside the batch that ended the epoch (samples 288..300): every
    // sample but the rest of that batch.
    let inside = r.checkpoint_at(LoaderState { epoch: 0, served: 290 }).expect("inside");
    let bits = inside.bitmap.expect("mid-epoch: a bitmap");
    assert_eq!((last.len(), bits.len()), (12, 290));
    assert!(last[..2].iter().all(|&id| bits.contains(id)), "{last:?}");
    assert!(last[2..].iter().all(|&id| !bits.contains(id)), "{last:?}");
    let e = Reader::open(&path, &cfg, Resume::At(LoaderState { epoch: 0, served: 5 }))
        .err()
        .expect("a count is not enough")
        .to_string();
    assert!(e.contains("served"), "{e}");
    assert_eq!(cache.stop("done").samples_served, 300);
}

#[test]
fn an_attached_jobs_state_resumes_attached_or_alone_exactly_once() {
    let t = tempfile::tempdir().expect("tmp");
    let path = small_dataset(t.path(), 300).expect("pack");
    let ds = Arc::new(Dataset::open(&path).expect("open"));
    let socket = t.path().join("c.sock");
    let cache_cfg = CacheConfig {
        memory: Memory::Percent(30.0),
        io: IoConfig {
            read_gap: ReadGapSetting::Whole,
            ..IoConfig::default()
        },
        readahead: 1 << 20,
    };
    let _cache = CacheHandle::start(ds, &cache_cfg, &socket).expect("cache");
    let attached = Config::resolve(
        &format!("cache = {:?}\nbatch_size = 16", socket.display().to_string()),
        toml::Table::new(),
        &|_| None,
    )
    .expect("config");
    let alone =
        Config::resolve("batch_size = 16\nread_gap = \"whole\"", toml::Table::new(), &|_| None).expect("config");
    let mut r = Reader::open(&path, &attached, Resume::At(LoaderState::default())).expect("attaches");
    let mut before: Vec<u64> = Vec::new();
    for _ in 0..5 {
        before.extend(r.next_batch().expect("batch").expect("some").ids());
    }
    // A consumer one batch ahead of its user saves where the user is: the
    // sixth batch, fetched, is not served in that state.
    let sixth = r.next_batch().expect("batch").expect("some");
    let at_user = r
        .checkpoint_at(LoaderState { epoch: 0, served: 80 })
        .expect("inside the last batch");
    assert_eq!(at_user.state.served, 80);
    let e = r
        .checkpoint_at(LoaderState { epoch: 0, served: 40 })
        .expect_err("an earlier batch")
        .to_string();
    assert!(e.contains("40 samples of epoch 0"), "{e}");
    drop((r, sixth));
    let blob = at_user.to_bytes();
    for (how, cfg) in [("attached", &attached), ("alone", &alone)] {
        let saved = Checkpoint::from_bytes(&blob).expect("its own blob");
        let mut again = Reader::open(&path, cfg, Resume::Checkpoint(saved)).expect(how);
        assert_eq!(again.state(), LoaderState { epoch: 0, served: 80 }, "{how}");
        let mut ids = before.clone();
        // Saved again mid-epoch and resumed the other way: still once.
        ids.extend(again.next_batch().expect("batch").expect("some").ids());
        let blob = again.checkpoint().expect("mid-epoch again").to_bytes();
        drop(again);
        let other = if how == "attached" { &alone } else { &attached };
        let saved = Checkpoint::from_bytes(&blob).expect("its own blob");
        let mut again = Reader::open(&path, other, Resume::Checkpoint(saved)).expect(how);
        while let Some(b) = again.next_batch().expect("batch") {
            ids.extend(b.ids());
        }
        ids.sort_unstable();
        assert_eq!(ids, (0..300).collect::<Vec<_>>(), "{how}: the epoch exactly once");
        assert_eq!(again.state(), LoaderState { epoch: 1, served: 0 }, "{how}");
    }
    // Elastic resume continues a world's plan: a bitmap is refused, named.
    let saved = Checkpoint::from_bytes(&blob).expect("its own blob");
    let e = Reader::open(&path, &alone, Resume::Elastic(vec![saved]))
        .err()
        .expect("elastic")
        .to_string();
    assert!(e.contains("state 0 is a job's attached to a cache"), "{e}");
}
