//! brand-store's GETs against a real S3 server (tools/s3-server, in
//! process) with faults injected at the server: each fault is retried as
//! the module says, counted by cause, and a cut body is resumed where it
//! stopped, not fetched again.

use std::time::{Duration, Instant};

use brand_s3_server::{Options, Server};
use brand_store::Connection;
use brand_store::Limiter;
use brand_store::get::{self, GetCounters, GetPolicy};
use brand_store::location::Location;
use brand_store::runtime::IoRuntime;

const SIZE: usize = 3 << 20;

struct Fixture {
    _tmp: tempfile::TempDir,
    server: Server,
    rt: IoRuntime,
    conn: Connection,
    data: Vec<u8>,
    e_tag: Option<String>,
}

/// A client of bucket `bkt` at `endpoint`, with object_store's own retries
/// off (brand's are under test).
fn client(endpoint: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name("bkt")
        .with_region("us-east-1")
        .with_access_key_id("brand-test-ak")
        .with_secret_access_key("brand-test-sk")
        .with_retry(object_store::RetryConfig {
            max_retries: 0,
            ..Default::default()
        })
        .build()
        .expect("client")
}

/// A server with one object `bkt/obj/data-0` of SIZE bytes, uploaded
/// through the S3 API, and a connection configured directly (the
/// environment is the process's, shared by parallel tests).
fn fixture() -> Fixture {
    use object_store::ObjectStoreExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&tmp.path().join("s3"), Options::default()).expect("server");
    std::fs::create_dir_all(tmp.path().join("s3/bkt")).expect("bucket");
    let store = client(&server.endpoint());
    let rt = IoRuntime::new(2).expect("runtime");
    let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 + i / 4096) as u8).collect();
    let path = object_store::path::Path::from("obj/data-0");
    let put = rt.block_on(store.put(&path, data.clone().into())).expect("put");
    let Location::Url(url) = Location::parse("s3://bkt/obj").expect("url") else {
        panic!("not a url")
    };
    let conn = Connection {
        url,
        store: std::sync::Arc::new(store),
    };
    Fixture {
        _tmp: tmp,
        server,
        rt,
        conn,
        data,
        e_tag: put.e_tag,
    }
}

fn policy() -> GetPolicy {
    GetPolicy {
        stall: Duration::from_millis(400),
        retries: 5,
        backoff: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        ..GetPolicy::default()
    }
}

fn get(f: &Fixture, range: std::ops::Range<u64>, c: &GetCounters, p: &GetPolicy) -> brand_format::Result<Vec<u8>> {
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    let l = std::sync::Arc::new(Limiter::new(4));
    f.rt.block_on(get::get_into(
        &f.conn,
        "data-0",
        range,
        f.e_tag.as_deref(),
        &mut buf,
        p,
        c,
        &l,
    ))?;
    Ok(buf)
}

/// The error of a GET that must fail (its bytes are not printed if it does not).
fn get_err(f: &Fixture, range: std::ops::Range<u64>, c: &GetCounters, p: &GetPolicy) -> String {
    match get(f, range, c, p) {
        Ok(bytes) => panic!("the GET succeeded with {} bytes", bytes.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_cut_body_is_resumed_from_where_it_stopped() {
    let f = fixture();
    f.server.faults().cut_bodies(3, 100_000);
    let c = GetCounters::default();
    let got = get(&f, 0..SIZE as u64, &c, &policy()).expect("get");
    assert!(got == f.data, "bytes differ");
    let r = c.report(None);
    assert_eq!(r.retries_by_cause.get("cut"), Some(&3), "{r:?}");
    // Each resume asked only for the rest: every byte came once.
    assert_eq!(r.bytes, SIZE as u64, "{r:?}");
    assert_eq!(f.server.stats().get_requests, 4);
}

#[test]
fn a_body_cut_again_and_again_is_resumed_while_each_attempt_brings_bytes() {
    // A store (or a proxy) that drops every connection after 256 KiB: 12
    // attempts for 3 MiB, more than the 5 retries, but each brings bytes.
    let f = fixture();
    f.server.faults().cut_bodies(11, 256 << 10);
    let c = GetCounters::default();
    let got = get(&f, 0..SIZE as u64, &c, &policy()).expect("get");
    assert!(got == f.data, "bytes differ");
    let r = c.report(None);
    assert_eq!(r.retries_by_cause.get("cut"), Some(&11), "{r:?}");
    assert_eq!(r.bytes, SIZE as u64, "{r:?}");
    // Attempts that bring nothing still run out of retries.
    f.server.faults().cut_bodies(6, 0);
    let e = get_err(&f, 0..SIZE as u64, &c, &policy());
    assert!(e.contains("after 5 retries") && e.contains("cut"), "{e}");
    f.server.faults().clear();
}

/// Sixteen 256 KiB GETs at the server's full speed: the pace slow bodies
/// are judged against.
fn set_the_pace(f: &Fixture, c: &GetCounters, p: &GetPolicy) {
    for i in 0..16u64 {
        let at = (i % 8) * (256 << 10);
        get(f, at..at + (256 << 10), c, p).expect("get");
    }
}

#[test]
fn a_body_far_slower_than_recent_ones_is_dropped_and_its_rest_asked_for_again() {
    let f = fixture();
    let p = GetPolicy {
        slow_after: Duration::from_millis(300),
        ..policy()
    };
    let c = GetCounters::default();
    set_the_pace(&f, &c, &p);
    assert_eq!(c.report(None).retries, 0);
    // 100 kB, then 8 KiB/s: never quiet for the stall timeout, but the
    // rest would take six minutes.
    f.server.faults().trickle_bodies(1, 100_000, 8 << 10);
    let start = Instant::now();
    let got = get(&f, 0..SIZE as u64, &c, &p).expect("get");
    let took = start.elapsed();
    assert!(got == f.data, "bytes differ");
    let r = c.report(None);
    assert_eq!(r.retries_by_cause.get("slow"), Some(&1), "{r:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    // Resumed, not started over: only the trickled bytes came twice at most.
    assert!(r.bytes < 16 * (256 << 10) + SIZE as u64 + (64 << 10), "{r:?}");
}

#[test]
fn a_path_that_slows_down_for_good_sets_a_new_pace_rather_than_being_dropped_forever() {
    let f = fixture();
    // Windows of 200 ms: 10 of the server's trickled pieces each.
    let p = GetPolicy {
        slow_after: Duration::from_millis(200),
        ..policy()
    };
    let c = GetCounters::default();
    set_the_pace(&f, &c, &p);
    // From now on every body comes at 4 MiB/s.
    f.server.faults().trickle_bodies(1_000, 0, 4 << 20);
    let mut slow_before = 0;
    for i in 0..10 {
        let got = get(&f, 0..SIZE as u64, &c, &p).expect("get");
        assert!(got == f.data, "bytes differ");
        let slow = c.report(None).retries_by_cause.get("slow").copied().unwrap_or(0);
        if i == 9 {
            // Dropped at first, then the slow pace is the pace.
            assert!(slow_before > 0, "no body was judged slow");
            assert_eq!(
                slow, slow_before,
                "the last GET was still dropped ({slow} drops in all)"
            );
        }
        slow_before = slow;
    }
    f.server.faults().clear();
}

#[test]
fn statuses_are_retried_with_backoff_and_counted_by_status() {
    let f = fixture();
    f.server.faults().fail_gets(2, 503);
    let c = GetCounters::default();
    let got = get(&f, 4096..8192 + 4096, &c, &policy()).expect("get");
    assert!(got[..] == f.data[4096..8192 + 4096]);
    f.server.faults().fail_gets(1, 500);
    get(&f, 0..4096, &c, &policy()).expect("get");
    let r = c.report(None);
    assert_eq!(r.retries_by_cause.get("503"), Some(&2), "{r:?}");
    assert_eq!(r.retries_by_cause.get("500"), Some(&1), "{r:?}");
    // More failures than retries: an error naming the object, the range and the last status.
    f.server.faults().fail_gets(10, 503);
    let p = GetPolicy { retries: 2, ..policy() };
    let e = get_err(&f, 0..4096, &c, &p);
    assert!(
        e.contains("s3://bkt/obj/data-0") && e.contains("bytes 0..4096") && e.contains("503"),
        "{e}"
    );
}

#[test]
fn a_stalled_body_is_retried_after_the_stall_timeout_and_a_dead_server_is_an_error() {
    let f = fixture();
    f.server.faults().stall_gets(1, 50_000);
    let c = GetCounters::default();
    let got = get(&f, 0..SIZE as u64, &c, &policy()).expect("get");
    assert!(got == f.data);
    assert_eq!(c.report(None).retries_by_cause.get("stall"), Some(&1));
    f.server.faults().stall_all(true);
    let start = Instant::now();
    let p = GetPolicy { retries: 2, ..policy() };
    let e = get_err(&f, 0..4096, &c, &p);
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert!(e.contains("no answer"), "{e}");
    f.server.faults().clear();
}

#[test]
fn a_body_gone_silent_is_dropped_long_before_the_stall_timeout_once_first_bytes_are_timed() {
    // A connection that goes quiet mid-body, as a dead peer behind a proxy
    // does: once 50 first bytes have been timed (milliseconds here), the
    // body may be silent for 8 × the slowest of them, at least 1 s
    // (`slow_after`), not the stall timeout's 30 s.
    let f = fixture();
    let p = GetPolicy {
        stall: Duration::from_secs(30),
        ..policy()
    };
    let c = GetCounters::default();
    for _ in 0..60 {
        get(&f, 0..4096, &c, &p).expect("get");
    }
    f.server.faults().stall_gets(1, 50_000);
    let start = Instant::now();
    let got = get(&f, 0..SIZE as u64, &c, &p).expect("get");
    let took = start.elapsed();
    assert!(got == f.data);
    assert_eq!(c.report(None).retries_by_cause.get("stall"), Some(&1));
    assert!(took < Duration::from_secs(15), "{took:?}");
    f.server.faults().clear();
}

#[test]
fn an_object_replaced_after_its_version_was_taken_is_refused() {
    let f = fixture();
    use object_store::ObjectStoreExt;
    let path = object_store::path::Path::from("obj/data-0");
    let mut other = f.data.clone();
    other[0] ^= 1;
    f.rt.block_on(f.conn.store.put(&path, other.into())).expect("replace");
    let c = GetCounters::default();
    let e = get_err(&f, 0..4096, &c, &policy());
    assert!(e.contains("changed since the dataset was opened"), "{e}");
}

#[test]
fn the_limiter_is_cut_by_throttling() {
    let f = fixture();
    let c = GetCounters::default();
    let l = std::sync::Arc::new(Limiter::new(16));
    f.server.faults().fail_gets(1, 503);
    let mut buf = vec![0u8; 4096];
    f.rt.block_on(get::get_into(
        &f.conn,
        "data-0",
        0..4096,
        None,
        &mut buf,
        &policy(),
        &c,
        &l,
    ))
    .expect("get");
    assert_eq!(l.limit(), 8);
}

#[test]
fn a_first_byte_slower_than_nearly_all_before_it_gets_a_hedged_second_get() {
    let f = fixture();
    let c = GetCounters::default();
    let p = GetPolicy {
        hedge_min: Duration::from_millis(20),
        ..policy()
    };
    // Fifty quick GETs make the history the hedge is measured against.
    for _ in 0..60 {
        get(&f, 0..4096, &c, &p).expect("get");
    }
    assert_eq!(c.report(None).hedges, 0);
    f.server.faults().delay_gets(Duration::from_millis(300));
    let got = get(&f, 8192..16384, &c, &p).expect("get");
    assert!(got[..] == f.data[8192..16384]);
    f.server.faults().clear();
    f.server.faults().delay_gets(Duration::ZERO);
    let r = c.report(None);
    assert_eq!(r.hedges, 1, "{r:?}");
    assert_eq!(f.server.stats().get_requests, 62);
}

#[test]
fn a_get_sent_before_any_first_byte_was_timed_is_hedged_after_a_second() {
    // A start (or a dataset's open): the first GET goes to a connection
    // that is never answered. Nothing has been timed to judge it by, yet
    // it gets its hedge after a second rather than the stall timeout's 30 s.
    let f = fixture();
    let c = std::sync::Arc::new(GetCounters::default());
    let p = GetPolicy {
        stall: Duration::from_secs(30),
        ..policy()
    };
    f.server.faults().stall_all(true);
    let (conn, e_tag) = (f.conn.clone(), f.e_tag.clone());
    let silent = f.rt.handle().spawn({
        let c = c.clone();
        async move {
            let started = Instant::now();
            let mut buf = vec![0u8; 8192];
            let l = Limiter::new(4);
            let r = get::get_into(&conn, "data-0", 8192..16384, e_tag.as_deref(), &mut buf, &p, &c, &l).await;
            (r.map(|()| buf), started.elapsed())
        }
    });
    // The silent GET reached the server before the stall is turned off.
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.server.stats().get_requests == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    f.server.faults().stall_all(false);
    let (got, took) = f.rt.block_on(silent).expect("task");
    let got = got.expect("the silent GET");
    assert!(got[..] == f.data[8192..16384]);
    assert!(took < Duration::from_secs(10), "{took:?}");
    let r = c.report(None);
    assert_eq!((r.hedges, r.hedges_won), (1, 1), "{r:?}");
    assert_eq!(r.requests, 2, "{r:?}");
    f.server.faults().clear();
}

/// GETs of 4 KiB through `limiter`, as many as it lets out at once, the
/// way the engine drives it (a place taken, then the GET started).
fn drive(f: &Fixture, limiter: &std::sync::Arc<Limiter>, gets: usize) {
    let c = std::sync::Arc::new(GetCounters::default());
    f.rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..gets {
            let permit = limiter.acquire().await;
            let (conn, c, l, e_tag) = (f.conn.clone(), c.clone(), limiter.clone(), f.e_tag.clone());
            let at = (i % (SIZE / 4096)) as u64 * 4096;
            tasks.spawn(async move {
                let mut buf = vec![0u8; 4096];
                let r = get::get_into(
                    &conn,
                    "data-0",
                    at..at + 4096,
                    e_tag.as_deref(),
                    &mut buf,
                    &policy(),
                    &c,
                    &l,
                )
                .await;
                drop(permit);
                r
            });
            while let Some(done) = tasks.try_join_next() {
                done.expect("task").expect("get");
            }
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("task").expect("get");
        }
    });
}

#[test]
fn a_store_slow_to_answer_but_never_full_is_given_more_gets_in_flight() {
    // Every first byte 100 ms away and no queue anywhere: more GETs in
    // flight only bring more bytes, so the adaptive limit grows past its
    // start; a fixed one stays where it was set. (100 ms: a busy test
    // machine's scheduling must add 25 ms to the median first byte before
    // it looks like a queue.)
    let f = fixture();
    f.server.faults().delay_gets(Duration::from_millis(100));
    let auto = std::sync::Arc::new(Limiter::adaptive());
    drive(&f, &auto, 2_000);
    let fixed = std::sync::Arc::new(Limiter::new(32));
    drive(&f, &fixed, 200);
    f.server.faults().delay_gets(Duration::ZERO);
    assert!(
        auto.limit() >= 2 * brand_store::limiter::AUTO_START,
        "{} after 2,000 GETs",
        auto.limit()
    );
    assert_eq!(fixed.limit(), 32);
}

#[test]
fn an_endpoint_nobody_listens_on_is_named_as_refused_after_the_retries() {
    let f = fixture();
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let conn = Connection {
        url: f.conn.url.clone(),
        store: std::sync::Arc::new(client(&format!("http://127.0.0.1:{port}"))),
    };
    let c = GetCounters::default();
    let l = std::sync::Arc::new(Limiter::new(4));
    let mut buf = vec![0u8; 4096];
    let p = GetPolicy { retries: 2, ..policy() };
    let e =
        f.rt.block_on(get::get_into(&conn, "data-0", 0..4096, None, &mut buf, &p, &c, &l))
            .expect_err("nobody answers")
            .to_string();
    assert!(
        e.contains("s3://bkt/obj/data-0") && e.contains("Connection refused") && e.contains("last cause: connect"),
        "{e}"
    );
    assert_eq!(c.report(None).retries_by_cause.get("connect"), Some(&2));
}

#[test]
fn stalls_use_up_retries_even_after_bytes_came() {
    // A store that stalls every GET after 100 kB: each attempt brings bytes
    // but waits out the stall timeout, so each counts against the retries.
    let f = fixture();
    f.server.faults().stall_gets(100, 100_000);
    let c = GetCounters::default();
    let p = GetPolicy { retries: 2, ..policy() };
    let start = Instant::now();
    let e = get_err(&f, 0..SIZE as u64, &c, &p);
    assert!(e.contains("stalled") && e.contains("after 2 retries"), "{e}");
    // Three stalls of 400 ms, not one per 100 kB of the 3 MiB.
    assert!(start.elapsed() < Duration::from_secs(4), "{:?}", start.elapsed());
    f.server.faults().clear();
}

#[test]
fn a_whole_object_larger_than_a_part_comes_in_parts_each_resumed_alone() {
    use object_store::ObjectStoreExt;
    let f = fixture();
    // Every part over the 1 MiB the cut comes after, whichever GET takes
    // it (a last part of 12 KB took it uncut in one run of many).
    let size = 2 * get::WHOLE_PART + (1 << 20) + 12345;
    let data: Vec<u8> = (0..size).map(|i| (i * 31 + i / 1000) as u8).collect();
    let path = object_store::path::Path::from("obj/index.bin");
    f.rt.block_on(f.conn.store.put(&path, data.clone().into()))
        .expect("put");
    // One part's body is cut: it alone is resumed.
    f.server.faults().cut_bodies(1, 1 << 20);
    f.server.reset_stats();
    let c = GetCounters::default();
    let l = std::sync::Arc::new(Limiter::new(4));
    let (got, meta) =
        f.rt.block_on(get::get_whole(&f.conn, "index.bin", &policy(), &c, &l))
            .expect("get_whole");
    assert_eq!(meta.size, size as u64);
    assert!(got == data, "bytes differ");
    let stats = f.server.stats();
    // Three parts (the cut one twice), every byte once, after one HEAD.
    assert_eq!((stats.head_requests, stats.get_requests), (1, 4), "{stats:?}");
    assert_eq!(stats.get_bytes, size as u64, "{stats:?}");
    assert_eq!(c.report(None).retries_by_cause.get("cut"), Some(&1));
}
