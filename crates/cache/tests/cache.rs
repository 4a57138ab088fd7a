//! A cache and jobs attached to it, in one process (each job maps the
//! shared memory itself, as another process would): exactly once per job
//! and epoch, the sources' bytes, jobs joining, leaving, resuming and
//! lagging, the order's quality, batches held across jobs, corrupt
//! records, another dataset refused, the cache stopping.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use brand_cache::{Attached, CacheConfig, CacheHandle, CachePolicy, Served};
use brand_format::Dataset;
use brand_format::ids::IdBits;
use brand_format::rng::Prng;
use brand_import::synthetic::small_dataset;
use brand_loader::{IoConfig, LoaderConfig, OnCorrupt, ReadGapSetting};
use brand_plan::order::OrderMeter;
use brand_plan::{Memory, PlanConfig};

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
            ids: IdBits::new(SAMPLES),
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
    // Saved and loaded through the loader's checkpoint blob (its bitmap
    // section): `brand_reader::Reader` tests that; here the cache's side.
    let saved = a.served();
    drop(a);
    assert_eq!(saved.ids.len(), 70);
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
    // Attaching `ds` with 300 samples marked served: the refusal's text.
    let refusal = |ds: Arc<Dataset>| {
        let served = Served {
            epoch: 0,
            ids: IdBits::new(300),
        };
        Attached::open(ds, &job_cfg(0), &s.socket, served)
            .err()
            .expect("refused")
            .to_string()
    };
    let e = refusal(other);
    assert!(e.contains("another dataset") && e.contains("samples 300"), "{e}");
    let e = refusal(s.ds.clone());
    assert!(e.contains("of a dataset of 300 samples, this one has 600"), "{e}");
    let mode = std::fs::metadata(&s.socket).expect("socket").permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600,
        "owner-only"
    );
}

#[test]
fn a_hello_whose_served_bitmap_does_not_fit_the_dataset_is_refused() {
    use brand_cache::wire::{Digest, Hello, ToCache, ToJob, read_frame};
    let s = setup();
    let _c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let words = SAMPLES.div_ceil(64) as usize;
    let mut past = vec![0u64; words];
    past[words - 1] = 1 << 63;
    for (served, why) in [
        (past, "the served bitmap marks sample 639, past the dataset's 600"),
        (
            vec![0; words + 1],
            "the served bitmap has 11 words for 600 samples (needs 10)",
        ),
    ] {
        let mut job = std::os::unix::net::UnixStream::connect(&s.socket).expect("connects");
        let hello = ToCache::Hello(Hello {
            digest: Digest::of(&s.ds),
            seed: 0,
            batch_size: 10,
            epoch: 0,
            served,
        });
        std::io::Write::write_all(&mut job, &hello.encode()).expect("hello sent");
        let (kind, body) = read_frame(&mut job).expect("an answer").expect("a frame");
        assert_eq!(ToJob::decode(kind, &body), Ok(ToJob::Refused(why.into())));
    }
    // The cache goes on serving.
    let mut a = attach(&s.ds, &s.socket, 1);
    assert!(once(&take(&mut a, &s.src, None)));
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
            ids: IdBits::new(SAMPLES),
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

/// A cache with a [`CachePolicy`] other than the default.
fn cache_with(ds: &Arc<Dataset>, socket: &Path, memory: Memory, policy: CachePolicy) -> CacheHandle {
    let cfg = CacheConfig {
        memory,
        io: IoConfig {
            read_gap: ReadGapSetting::Whole,
            ..IoConfig::default()
        },
        readahead: 1 << 20,
    };
    CacheHandle::start_with(ds.clone(), &cfg, &policy, socket).expect("cache starts")
}

#[test]
fn jobs_joining_at_different_times_and_paces_serve_each_sample_once_per_epoch() {
    // Seeded schedules: 4 jobs join after the others served a drawn number
    // of batches, some computing a little per batch (laggards); each takes
    // 2 epochs from where it joined.
    for case in 0..4u64 {
        let s = setup();
        let c = cache(&s.ds, &s.socket, Memory::Percent(15.0));
        let mut draw = Prng::stream(case, &[77]);
        let plans: Vec<(u64, u64)> = (0..4)
            .map(|j| (if j == 0 { 0 } else { draw.below(90) }, draw.below(3)))
            .collect();
        let batches = AtomicU64::new(0);
        let epochs: Vec<Vec<Vec<u64>>> = std::thread::scope(|scope| {
            let jobs: Vec<_> = plans
                .iter()
                .enumerate()
                .map(|(j, &(join_after, pause_ms))| {
                    let (ds, socket, batches) = (s.ds.clone(), s.socket.clone(), &batches);
                    scope.spawn(move || {
                        let start = Instant::now();
                        while batches.load(Ordering::SeqCst) < join_after && start.elapsed() < Duration::from_secs(10) {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        let mut job = attach(&ds, &socket, 10 + j as u64);
                        (0..2)
                            .map(|_| {
                                let mut ids = Vec::new();
                                while let Some(b) = job.next_batch().expect("a batch") {
                                    ids.extend(b.iter().map(|x| x.id));
                                    batches.fetch_add(1, Ordering::SeqCst);
                                    std::thread::sleep(Duration::from_millis(pause_ms));
                                }
                                ids
                            })
                            .collect()
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().expect("job")).collect()
        });
        for (j, e) in epochs.iter().enumerate() {
            for (k, ids) in e.iter().enumerate() {
                assert!(
                    once(ids),
                    "case {case} job {j} {:?} epoch {k}: {} samples, not each once",
                    plans[j],
                    ids.len()
                );
            }
        }
        assert_eq!(c.stop("the test ended").samples_served, 4 * 2 * SAMPLES);
    }
}

/// Chunk-mate dispersion of each epoch of `order` (`brand simulate`'s).
fn dispersion(ds: &Dataset, epochs: &[Vec<u64>]) -> Vec<f64> {
    let mut meter = OrderMeter::new(&ds.index);
    epochs
        .iter()
        .map(|ids| {
            for (p, &id) in ids.iter().enumerate() {
                meter.served(id, p as u64);
            }
            meter.end_epoch().chunk_mate_dispersion.expect("pairs")
        })
        .collect()
}

#[test]
fn an_attached_jobs_order_spreads_chunk_mates_as_a_lone_brand_loader_does() {
    // A fill chunk by chunk (a shuffle buffer) serves chunk-mates near each
    // other (dispersion ≈ memory / N); Brand's plan spreads them over the
    // epoch (≈ 0.8 at 10 %, 1 is a uniform shuffle).
    let s = setup();
    let _c = cache(&s.ds, &s.socket, Memory::Percent(10.0));
    let mut a = attach(&s.ds, &s.socket, 1);
    let mut b = attach(&s.ds, &s.socket, 2);
    let (ea, eb): (Vec<_>, Vec<_>) = (0..2)
        .map(|_| (take(&mut a, &s.src, None), take(&mut b, &s.src, None)))
        .unzip();
    let lone =
        brand_plan::simulate::simulate(&s.ds.index, &PlanConfig::new(Memory::Percent(10.0)), 2).expect("simulate");
    let lone = lone.epochs[1].chunk_mate_dispersion.expect("pairs");
    for (job, epochs) in [("a", &ea), ("b", &eb)] {
        for d in dispersion(&s.ds, epochs) {
            assert!(
                d > 0.6 * lone,
                "job {job}: dispersion {d:.3}, a lone brand loader's {lone:.3}"
            );
        }
    }
}

#[test]
fn jobs_that_hold_every_batch_they_get_fail_at_once_naming_the_memory_they_need() {
    let s = setup();
    let _c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let started = Instant::now();
    let errors: Vec<String> = std::thread::scope(|scope| {
        let jobs: Vec<_> = (0..2u64)
            .map(|seed| {
                let (ds, socket) = (s.ds.clone(), s.socket.clone());
                scope.spawn(move || {
                    let mut job = attach(&ds, &socket, seed);
                    // Keeps every batch: the two jobs fill the memory with
                    // batches and then each waits for the other's.
                    let mut kept = Vec::new();
                    loop {
                        match job.next_batch() {
                            Ok(Some(b)) => kept.push(b),
                            Ok(None) => return "the epoch ended".to_string(),
                            Err(e) => return e.to_string(),
                        }
                    }
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().expect("job")).collect()
    });
    for e in &errors {
        assert!(
            e.contains("hold") && e.contains("each waits for another") && e.contains("need about"),
            "{e}"
        );
    }
    // Not the 120 s "no progress" error: the deadlock is seen as it forms.
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

#[test]
fn on_corrupt_skip_leaves_a_corrupt_record_out_of_every_jobs_epoch_and_counts_it() {
    let s = setup();
    let victim = 123u64;
    let (seg, offset, len) = s.ds.index.record_location(victim);
    let path = s.ds.segment_path(seg);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[(offset + len as u64 / 2) as usize] ^= 0x40;
    std::fs::write(&path, bytes).expect("write");
    let policy = CachePolicy {
        on_corrupt: OnCorrupt::Skip,
        ..CachePolicy::default()
    };
    let c = cache_with(&s.ds, &s.socket, Memory::Percent(25.0), policy);
    let epochs: Vec<(Vec<u64>, u64)> = std::thread::scope(|scope| {
        let jobs: Vec<_> = (0..3u64)
            .map(|seed| {
                let (ds, socket) = (s.ds.clone(), s.socket.clone());
                scope.spawn(move || {
                    let mut job = attach(&ds, &socket, seed);
                    let mut ids = Vec::new();
                    while let Some(b) = job.next_batch().expect("no error: the record is skipped") {
                        ids.extend(b.iter().map(|x| x.id));
                    }
                    assert_eq!(job.state().epoch, 1, "the epoch ended without the record");
                    (ids, job.metrics().skipped_corrupt)
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().expect("job")).collect()
    });
    let want: Vec<u64> = (0..SAMPLES).filter(|&i| i != victim).collect();
    for (ids, skipped) in epochs {
        let mut got = ids.clone();
        got.sort_unstable();
        assert_eq!(got, want, "every other sample once, never the corrupt one");
        assert_eq!(skipped, 1);
    }
    assert!(c.report().corrupt_records >= 1);
}

#[test]
fn on_corrupt_error_fails_the_job_that_draws_the_corrupt_record() {
    let s = setup();
    let victim = 123u64;
    let (seg, offset, len) = s.ds.index.record_location(victim);
    let path = s.ds.segment_path(seg);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[(offset + len as u64 / 2) as usize] ^= 0x40;
    std::fs::write(&path, bytes).expect("write");
    let _c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let mut job = attach(&s.ds, &s.socket, 1);
    let e = loop {
        match job.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the corrupt record went unnoticed"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(e.contains(&format!("sample {victim}")) && e.contains("crc32c"), "{e}");
}

/// A read that fails as a whole (its segment cut short after the dataset was
/// opened) marks every sample it was to bring, and the job that draws one
/// fails naming the segment's real end.
#[test]
fn a_read_that_fails_whole_fails_the_job_that_draws_one_of_its_samples() {
    let s = setup();
    let path = s.ds.segment_path(0);
    let len = std::fs::metadata(&path).expect("segment").len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
    file.set_len(len / 2).expect("truncate");
    let _c = cache(&s.ds, &s.socket, Memory::Percent(25.0));
    let mut job = attach(&s.ds, &s.socket, 1);
    // Samples left unmarked would be waited for forever: bounded here.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = loop {
            match job.next_batch() {
                Ok(Some(_)) => {}
                Ok(None) => break None,
                Err(e) => break Some(e.to_string()),
            }
        };
        let _ = tx.send(outcome);
    });
    let e = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the job waited 60 s for samples of a failed read")
        .expect("the cut-short segment went unnoticed");
    assert!(e.contains("segment ends at byte"), "{e}");
}
