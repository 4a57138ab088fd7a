//! Local clients that speak the cache's protocol wrongly on purpose, next
//! to a well-behaved job attached at the same time: each hostile client
//! gets a message naming what was wrong (`Refused` before attaching,
//! `Failed` after) and is detached, and the well-behaved job still serves
//! every sample once per epoch. Every wait is bounded.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brand_cache::wire::{Digest, Hello, ToCache, ToJob, read_frame};
use brand_cache::{Attached, CacheConfig, CacheHandle, Served};
use brand_format::Dataset;
use brand_format::ids::IdBits;
use brand_import::synthetic::small_dataset;
use brand_loader::{IoConfig, LoaderConfig, ReadGapSetting};
use brand_plan::Memory;

const SAMPLES: u64 = 600;
const BATCH: u32 = 10;
/// Longer than the cache's hello timeout (10 s), for the waits that
/// include it.
const BOUND: Duration = Duration::from_secs(20);

struct Setup {
    _t: tempfile::TempDir,
    ds: Arc<Dataset>,
    socket: PathBuf,
    _cache: CacheHandle,
}

fn setup() -> Setup {
    let t = tempfile::tempdir().expect("tmp");
    let ds = Arc::new(Dataset::open(small_dataset(t.path(), SAMPLES).expect("pack")).expect("open"));
    let socket = t.path().join("cache.sock");
    let cfg = CacheConfig {
        memory: Memory::Percent(25.0),
        io: IoConfig {
            read_gap: ReadGapSetting::Whole,
            ..IoConfig::default()
        },
        readahead: 1 << 20,
    };
    let cache = CacheHandle::start(ds.clone(), &cfg, &socket).expect("cache starts");
    Setup {
        _t: t,
        ds,
        socket,
        _cache: cache,
    }
}

/// A well-behaved job: two epochs, each sample once in each.
fn honest_job(ds: &Arc<Dataset>, socket: &Path) {
    let mut cfg = LoaderConfig::default();
    cfg.plan.seed = 7;
    cfg.batch_size = BATCH as usize;
    let from = Served {
        epoch: 0,
        ids: IdBits::new(SAMPLES),
    };
    let mut job = Attached::open(ds.clone(), &cfg, socket, from).expect("the honest job attaches");
    for epoch in 0..2 {
        let mut ids = Vec::new();
        while let Some(b) = job.next_batch().expect("the honest job's batch") {
            assert_eq!(b.epoch, epoch);
            ids.extend_from_slice(b.ids());
        }
        ids.sort_unstable();
        assert_eq!(ids, (0..SAMPLES).collect::<Vec<_>>(), "epoch {epoch}: each sample once");
    }
}

/// A raw connection, every read bounded.
fn connect(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(BOUND)).expect("timeout");
    s
}

fn hello(ds: &Dataset) -> Hello {
    Hello {
        digest: Digest::of(ds),
        seed: 1,
        batch_size: BATCH,
        epoch: 0,
        served: Vec::new(),
    }
}

/// The cache's next message, decoded.
fn answer(s: &mut UnixStream) -> ToJob {
    let (kind, body) = read_frame(s).expect("an answer").expect("not the end");
    ToJob::decode(kind, &body).expect("a well-formed answer")
}

/// Attached with a hello of its own (the shared memory's descriptor that
/// comes with the welcome is dropped with the plain read).
fn attached(s: &Setup) -> UnixStream {
    let mut c = connect(&s.socket);
    c.write_all(&ToCache::Hello(hello(&s.ds)).encode()).expect("hello");
    assert!(matches!(answer(&mut c), ToJob::Welcome { .. }));
    c
}

/// After the cache's answer naming what was wrong, the connection ends
/// (within the read timeout): cleanly, or reset when the cache closed it
/// with the client's messages still unread (a flood's).
fn assert_ends(c: &mut UnixStream) {
    let mut rest = Vec::new();
    let ended = c.read_to_end(&mut rest);
    assert!(
        ended.is_ok()
            || ended
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the cache kept the connection: {ended:?}"
    );
}

/// Runs the honest job while `hostile` runs; both bounded.
fn beside_an_honest_job(s: &Setup, hostile: impl FnOnce(&Setup) + Send) {
    let start = Instant::now();
    std::thread::scope(|scope| {
        let honest = scope.spawn(|| honest_job(&s.ds, &s.socket));
        hostile(s);
        honest.join().expect("the honest job");
    });
    assert!(start.elapsed() < BOUND + BOUND, "took {:?}", start.elapsed());
}

#[test]
fn a_client_that_never_says_hello_holds_up_no_other_job_and_is_refused_in_time() {
    let s = setup();
    // One says nothing, one sends the first byte of a length and stops:
    // neither holds up the honest job's attach (each waits on its own).
    let mut silent = connect(&s.socket);
    let mut slow = connect(&s.socket);
    slow.write_all(&[9]).expect("a byte");
    let start = Instant::now();
    honest_job(&s.ds, &s.socket);
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "the honest job waited for the silent ones: {:?}",
        start.elapsed()
    );
    for c in [&mut silent, &mut slow] {
        match answer(c) {
            ToJob::Refused(why) => assert_eq!(why, "no whole hello within 10 s"),
            other => panic!("{other:?}"),
        }
    }
    assert!(start.elapsed() < BOUND, "{:?}", start.elapsed());
}

#[test]
fn a_hello_longer_than_any_hello_is_refused_naming_its_length() {
    let s = setup();
    beside_an_honest_job(&s, |s| {
        // 2 GiB promised, nothing sent: refused by the length alone.
        // 16 MiB of a hello: refused by its length and kind.
        let mut hello_16m = 0x0100_0000u32.to_le_bytes().to_vec();
        hello_16m.push(1);
        for (bytes, want) in [
            (
                0x8000_0000u32.to_le_bytes().to_vec(),
                "a malformed hello: a frame of 2147483648 bytes, longer than any message (536875008)",
            ),
            (
                hello_16m,
                "a malformed hello: a frame of 16777216 bytes, longer than the 1249 a message of kind 1 can be here",
            ),
        ] {
            let mut c = connect(&s.socket);
            c.write_all(&bytes).expect("length");
            match answer(&mut c) {
                ToJob::Refused(why) => assert_eq!(why, want),
                other => panic!("{other:?}"),
            }
        }
    });
}

#[test]
fn hellos_out_of_range_are_refused_naming_the_field() {
    let s = setup();
    beside_an_honest_job(&s, |s| {
        let last = Hello {
            epoch: u64::MAX,
            served: IdBits::full(SAMPLES).words().to_vec(),
            ..hello(&s.ds)
        };
        let past = Hello {
            served: vec![u64::MAX; SAMPLES.div_ceil(64) as usize],
            ..hello(&s.ds)
        };
        let huge = Hello {
            batch_size: u32::MAX,
            ..hello(&s.ds)
        };
        let mut words = ToCache::Hello(hello(&s.ds)).encode();
        // The bitmap's word count (the hello's last field, no words after
        // it) says more words than the hello has bytes.
        let at = words.len() - 8;
        words[at..].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let mut first = Vec::new();
        first.extend(ToCache::Next.encode());
        for (bytes, want) in [
            (
                ToCache::Hello(last).encode(),
                "epoch 18446744073709551615: the last a count can hold",
            ),
            (
                ToCache::Hello(past).encode(),
                "the served bitmap marks sample 639, past the dataset's 600",
            ),
            (
                ToCache::Hello(huge).encode(),
                "fewer than 2 batches of 4294967295 samples",
            ),
            (words, "a malformed hello: a bitmap of 1152921504606846976 words"),
            (first, "expected a hello first"),
        ] {
            let mut c = connect(&s.socket);
            c.write_all(&bytes).expect("hello");
            match answer(&mut c) {
                ToJob::Refused(why) => assert!(why.contains(want), "{why} (wanted {want})"),
                other => panic!("{other:?}"),
            }
        }
    });
}

#[test]
fn an_attached_client_that_misbehaves_is_failed_naming_what_it_did() {
    let s = setup();
    beside_an_honest_job(&s, |s| {
        let release_of = |ids: &[u32]| ToCache::Release(ids.to_vec()).encode();
        let mut too_long = release_of(&(0..BATCH + 1).collect::<Vec<_>>());
        // Its length and kind, not the rest.
        too_long.truncate(5);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                ToCache::Hello(hello(&s.ds)).encode(),
                "the job sent a second hello (it is attached already)",
            ),
            (
                release_of(&[5]),
                "the job sent a release of sample 5, which it does not hold",
            ),
            (
                release_of(&[u32::MAX]),
                "the job sent a release of sample 4294967295, which it does not hold",
            ),
            (
                too_long,
                "the job sent a frame of 45 bytes, longer than the 41 a message of kind 3 can be here",
            ),
            (vec![1, 0, 0, 0, 99], "the job sent a message of unknown kind 99"),
            (
                vec![2, 0, 0, 0, 3, 1],
                "the job sent a malformed message: a release of 1 bytes",
            ),
        ];
        for (bytes, want) in cases {
            let mut c = attached(s);
            c.write_all(&bytes).expect("message");
            match answer(&mut c) {
                ToJob::Failed(why) => assert_eq!(why, want),
                other => panic!("{other:?}"),
            }
            assert_ends(&mut c);
        }
    });
}

#[test]
fn a_client_that_floods_requests_or_releases_twice_is_failed_and_holds_nothing() {
    let s = setup();
    beside_an_honest_job(&s, |s| {
        // A thousand requests without reading an answer: the second is
        // refused; the first may have been answered (a batch) before.
        let mut c = attached(s);
        let flood: Vec<u8> = (0..1000).flat_map(|_| ToCache::Next.encode()).collect();
        c.write_all(&flood).expect("flood");
        let why = loop {
            match answer(&mut c) {
                ToJob::Batch { .. } => continue,
                ToJob::Failed(why) => break why,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(why, "the job sent a request before it had the answer to its last");
        assert_ends(&mut c);
        // A batch released twice: the second release holds nothing.
        let mut c = attached(s);
        c.write_all(&ToCache::Next.encode()).expect("next");
        let ids: Vec<u32> = match answer(&mut c) {
            ToJob::Batch { samples, .. } => samples.iter().map(|p| p.id).collect(),
            other => panic!("{other:?}"),
        };
        assert!(!ids.is_empty());
        c.write_all(&ToCache::Release(ids.clone()).encode()).expect("release");
        c.write_all(&ToCache::Release(ids.clone()).encode()).expect("again");
        match answer(&mut c) {
            ToJob::Failed(why) => assert_eq!(
                why,
                format!("the job sent a release of sample {}, which it does not hold", ids[0])
            ),
            other => panic!("{other:?}"),
        }
        assert_ends(&mut c);
    });
}
