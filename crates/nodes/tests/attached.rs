//! The `cache` key through the one configuration path: `Reader::open`
//! attaches to a running cache (what the C ABI, the TF op and Python open),
//! serves each sample once per epoch, and its checkpoints are refused
//! mid-epoch (the count cannot say which samples were served).

use std::sync::Arc;

use brand_cache::{CacheConfig, CacheHandle};
use brand_format::Dataset;
use brand_loader::{IoConfig, LoaderState, ReadGapSetting, Resume};
use brand_nodes::{Config, Reader};
use brand_pack::synthetic::small_dataset;
use brand_plan::Memory;

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
    let e = r.checkpoint().expect_err("mid-epoch").to_string();
    assert!(e.contains("bitmap"), "{e}");
    let mut ids: Vec<u64> = first.ids().to_vec();
    while let Some(b) = r.next_batch().expect("batch") {
        ids.extend(b.ids());
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..300).collect::<Vec<_>>(), "each sample once");
    assert_eq!(
        r.checkpoint().expect("at the epoch's end").state,
        LoaderState { epoch: 1, served: 0 }
    );
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
    let blob = r.served_state().expect("attached state");
    drop(r);
    for (how, cfg) in [("attached", &attached), ("alone", &alone)] {
        let mut again = Reader::open_served(&path, cfg, &blob).expect(how);
        assert_eq!(again.state(), LoaderState { epoch: 0, served: 80 }, "{how}");
        let mut ids = before.clone();
        while let Some(b) = again.next_batch().expect("batch") {
            ids.extend(b.ids());
        }
        ids.sort_unstable();
        assert_eq!(ids, (0..300).collect::<Vec<_>>(), "{how}: the epoch exactly once");
        assert_eq!(again.state(), LoaderState { epoch: 1, served: 0 }, "{how}");
    }
}
