//! A cache and jobs attached to it, in one process (each job maps the
//! shared memory itself, as another process would): exactly once per job
//! and epoch, the sources' bytes, jobs joining, leaving, resuming and
//! lagging, another dataset refused, the cache stopping.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brand_cache::{Attached, CacheConfig, CacheHandle, Served};
use brand_format::Dataset;
use brand_loader::{IoConfig, LoaderConfig, ReadGapSetting};
use brand_pack::synthetic::small_dataset;
use brand_plan::Memory;

const SAMPLES: u64 = 600;

fn cache(ds: &Arc<Dataset>, socket: &Path, memory: Memory) -> CacheHandle {
    let cfg = CacheConfig {
        memory,
        io: IoConfig {
            read_gap: ReadGapSetting::Whole,
            ..IoConfig::default()
        },
        readahead: 1 << 20,
    };
    CacheHandle::start(ds.clone(), &cfg, socket).expect("cache starts")
}

fn job_cfg(seed: u64) -> LoaderConfig {
    let mut c = LoaderConfig::default();
    c.plan.seed = seed;
    c.batch_size = 10;
    c
}

fn attach(ds: &Arc<Dataset>, socket: &Path, seed: u64) -> Attached {
    Attached::open(
        ds.clone(),
        &job_cfg(seed),
        socket,
        Served {
            epoch: 0,
            bitmap: vec![],
        },
    )
    .expect("attaches")
}

/// Takes `batches` batches (all of the epoch if `None`), checking each
/// sample's bytes against its source file; the ids in order.
fn take(job: &mut Attached, src: &Path, batches: Option<usize>) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut k = 0;
    while batches.is_none_or(|b| k < b) {
        let Some(batch) = job.next_batch().expect("a batch") else {
            break;
        };
        for s in batch.iter() {
            let want = std::fs::read(src.join(String::from_utf8_lossy(s.key).as_ref())).expect("source");
            assert!(s.data == want.as_slice(), "sample {} differs from its source", s.id);
            assert_eq!(s.data.as_ptr() as usize % 64, 0, "64-byte aligned");
            ids.push(s.id);
        }
        k += 1;
    }
    ids
}

fn once(ids: &[u64]) -> bool {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v == (0..SAMPLES).collect::<Vec<_>>()
}

struct Setup {
    _t: tempfile::TempDir,
    ds: Arc<Dataset>,
    src: PathBuf,
    socket: PathBuf,
}

fn setup() -> Setup {
    let t = tempfile::tempdir().expect("tmp");
    let ds = Arc::new(Dataset::open(small_dataset(t.path(), SAMPLES).expect("pack")).expect("open"));
    let src = t.path().join("src");
    let socket = t.path().join("cache.sock");
    Setup { _t: t, ds, src, socket }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn three_jobs_serve_every_sample_once_per_epoch_in_their_own_orders_with_the_sources_bytes() {
    let s = setup();
    let c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let orders: Vec<Vec<Vec<u64>>> = std::thread::scope(|scope| {
        let jobs: Vec<_> = (0..3u64)
            .map(|seed| {
                let (ds, src, socket) = (s.ds.clone(), s.src.clone(), s.socket.clone());
                scope.spawn(move || {
                    let mut job = attach(&ds, &socket, seed);
                    (0..2).map(|_| take(&mut job, &src, None)).collect::<Vec<_>>()
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().expect("job")).collect()
    });
    for (j, epochs) in orders.iter().enumerate() {
        for (e, ids) in epochs.iter().enumerate() {
            assert!(once(ids), "job {j} epoch {e}: {} samples, not each once", ids.len());
        }
        assert_ne!(epochs[0], epochs[1], "job {j}: each epoch its own order");
    }
    assert_ne!(orders[0][0], orders[1][0], "each job its own order");
    let r = c.stop("the test ended");
    assert_eq!(r.samples_served, 3 * 2 * SAMPLES);
    assert_eq!(r.jobs_attached, 3);
    assert!(!s.socket.exists(), "the socket is removed");
}

#[test]
fn a_job_that_vanishes_mid_epoch_is_detached_and_the_others_finish() {
    let s = setup();
    let c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let mut a = attach(&s.ds, &s.socket, 1);
    let mut b = attach(&s.ds, &s.socket, 2);
    let mut gone = attach(&s.ds, &s.socket, 3);
    let mut ids_a = take(&mut a, &s.src, Some(5));
    let mut ids_b = take(&mut b, &s.src, Some(5));
    // A live batch, then the job goes without a word (as when killed).
    let held = gone.next_batch().expect("batch").expect("some");
    drop(gone);
    drop(held);
    wait_for("the job is detached", || c.report().jobs_now == 2);
    ids_a.extend(take(&mut a, &s.src, None));
    ids_b.extend(take(&mut b, &s.src, None));
    assert!(once(&ids_a) && once(&ids_b));
}

#[test]
fn a_job_joining_mid_epoch_starts_its_epoch_there() {
    let s = setup();
    let _c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let mut a = attach(&s.ds, &s.socket, 1);
    let mut ids_a = take(&mut a, &s.src, Some(30));
    let mut late = attach(&s.ds, &s.socket, 2);
    assert_eq!(late.state().served, 0);
    let ids_late = take(&mut late, &s.src, None);
    ids_a.extend(take(&mut a, &s.src, None));
    assert!(once(&ids_a), "the first job");
    assert!(once(&ids_late), "the late job: a whole epoch from where it joined");
}

#[test]
fn a_job_resumes_from_its_served_samples() {
    let s = setup();
    let _c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let mut a = attach(&s.ds, &s.socket, 4);
    let mut ids = take(&mut a, &s.src, Some(7));
    let blob = a.served().to_bytes(&s.ds);
    drop(a);
    let saved = Served::from_bytes(&blob, &s.ds).expect("its own state");
    assert_eq!(saved.count(), 70);
    let mut damaged = blob.clone();
    damaged[50] ^= 1;
    let e = Served::from_bytes(&damaged, &s.ds).expect_err("damaged").to_string();
    assert!(e.contains("checksum"), "{e}");
    let t2 = tempfile::tempdir().expect("tmp");
    let other = Dataset::open(small_dataset(t2.path(), 64).expect("pack")).expect("open");
    let e = Served::from_bytes(&blob, &other)
        .expect_err("another dataset")
        .to_string();
    assert!(e.contains("another dataset"), "{e}");
    let mut again = Attached::open(s.ds.clone(), &job_cfg(4), &s.socket, saved).expect("resumes");
    assert_eq!(again.state().served, 70);
    ids.extend(take(&mut again, &s.src, None));
    assert!(once(&ids), "the resumed epoch is exact");
    assert_eq!(again.state().epoch, 1);
}

#[test]
fn a_laggard_does_not_stall_the_others_and_catches_up_later() {
    let s = setup();
    // Memory for about 10 % of the samples: the fast job must drop what
    // only the idle one still needs.
    let c = cache(&s.ds, &s.socket, Memory::Percent(10.0));
    let mut slow = attach(&s.ds, &s.socket, 1);
    let mut fast = attach(&s.ds, &s.socket, 2);
    let mut slow_ids = take(&mut slow, &s.src, Some(1));
    for _ in 0..2 {
        assert!(once(&take(&mut fast, &s.src, None)), "the fast job's epoch");
    }
    assert!(c.report().dropped_needed > 0, "the laggard's samples were dropped");
    slow_ids.extend(take(&mut slow, &s.src, None));
    assert!(once(&slow_ids), "the laggard's epoch is still exact");
}

#[test]
fn a_job_of_another_dataset_is_refused_naming_what_differs() {
    let s = setup();
    let _c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let t2 = tempfile::tempdir().expect("tmp");
    let other = Arc::new(Dataset::open(small_dataset(t2.path(), 300).expect("pack")).expect("open"));
    let e = Attached::open(
        other,
        &job_cfg(0),
        &s.socket,
        Served {
            epoch: 0,
            bitmap: vec![],
        },
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(e.contains("another dataset") && e.contains("samples 300"), "{e}");
    let mode = std::fs::metadata(&s.socket).expect("socket").permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600,
        "owner-only"
    );
}

#[test]
fn a_stopped_cache_fails_its_jobs_clearly_and_a_new_one_starts_on_the_same_path() {
    let s = setup();
    let c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let mut a = attach(&s.ds, &s.socket, 1);
    let batch = a.next_batch().expect("batch").expect("some");
    c.stop("SIGTERM");
    let e = a.next_batch().expect_err("an error").to_string();
    assert!(e.contains("stopped: SIGTERM") && e.contains("cache.sock"), "{e}");
    assert!(batch.iter().count() == 10, "a batch outlives its cache");
    drop(batch);
    assert!(!s.socket.exists());
    let e = Attached::open(
        s.ds.clone(),
        &job_cfg(0),
        &s.socket,
        Served {
            epoch: 0,
            bitmap: vec![],
        },
    )
    .err()
    .expect("no cache")
    .to_string();
    assert!(e.contains("no brand cache listens"), "{e}");
    // A socket left behind (as by a killed cache) is replaced.
    let stale = std::os::unix::net::UnixListener::bind(&s.socket).expect("stale socket");
    drop(stale);
    let _c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let mut b = attach(&s.ds, &s.socket, 1);
    assert!(once(&take(&mut b, &s.src, None)));
}
