//! The server through a real S3 client (object_store's, as brand uses), plus
//! raw HTTP for what that client cannot send (CreateBucket, the admin API).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path as FsPath;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brand_s3_server::{Options, Server, Stats};
use futures_util::StreamExt;
use object_store::aws::{AmazonS3Builder, AwsAuthorizer, AwsCredential};
use object_store::path::Path;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

const BUCKET: &str = "brand-test";
/// No test may take longer than this.
const LIMIT: Duration = Duration::from_secs(30);

fn start() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), Options::default()).expect("start");
    create_bucket(&server, BUCKET).expect("create bucket");
    (dir, server)
}

fn retry_none() -> RetryConfig {
    RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    }
}

fn client_with(server: &Server, secret: &str, timeout: Duration) -> Arc<dyn ObjectStore> {
    let opts = Options::default();
    let store = AmazonS3Builder::new()
        .with_endpoint(server.endpoint())
        .with_allow_http(true)
        .with_region(&opts.region)
        .with_bucket_name(BUCKET)
        .with_access_key_id(&opts.access_key)
        .with_secret_access_key(secret)
        .with_retry(retry_none())
        .with_client_options(ClientOptions::new().with_timeout(timeout).with_allow_http(true))
        .build()
        .expect("client");
    Arc::new(store)
}

fn client(server: &Server) -> Arc<dyn ObjectStore> {
    client_with(server, &Options::default().secret_key, Duration::from_secs(10))
}

/// A raw HTTP/1.1 exchange: the status and the body.
fn http(addr: SocketAddr, head: &str, body: &[u8]) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {text:?}")))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    Ok((status, body))
}

fn admin(server: &Server, method: &str, path: &str) -> (u16, String) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        server.addr()
    );
    http(server.addr(), &head, b"").expect("admin request")
}

/// CreateBucket, signed with SigV4 (object_store has no call for it).
fn create_bucket(server: &Server, name: &str) -> std::io::Result<(u16, String)> {
    let opts = Options::default();
    let cred = AwsCredential {
        key_id: opts.access_key.clone(),
        secret_key: opts.secret_key.clone(),
        token: None,
    };
    let url = format!("{}/{name}", server.endpoint());
    let mut req = object_store::client::HttpRequest::new(Vec::new().into());
    *req.method_mut() = http::Method::PUT;
    *req.uri_mut() = url.parse().map_err(std::io::Error::other)?;
    AwsAuthorizer::new(&cred, "s3", &opts.region)
        .try_authorize(&mut req, None)
        .map_err(std::io::Error::other)?;
    let mut head = format!(
        "PUT /{name} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n",
        server.addr()
    );
    for (k, v) in req.headers() {
        head.push_str(&format!("{k}: {}\r\n", v.to_str().map_err(std::io::Error::other)?));
    }
    head.push_str("\r\n");
    http(server.addr(), &head, b"")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed ^ (i >> 12) as u8))
        .collect()
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f).await.expect("test took too long")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_range_head_list_delete() {
    let (_dir, server) = start();
    let s3 = client(&server);
    bounded(async {
        let small = pattern(100_000, 1);
        let put = s3
            .put(&Path::from("ds/manifest.json"), small.clone().into())
            .await
            .expect("put");
        let head = s3.head(&Path::from("ds/manifest.json")).await.expect("head");
        assert_eq!(head.size, small.len() as u64);
        assert!(head.e_tag.is_some());
        assert_eq!(head.e_tag, put.e_tag);

        // Multipart: two parts of 5 MiB and a short last one.
        let part = 5 << 20;
        let big = pattern(2 * part + 12_345, 2);
        let mut up = s3
            .put_multipart(&Path::from("ds/data-0000"))
            .await
            .expect("create upload");
        for chunk in big.chunks(part) {
            up.put_part(PutPayload::from(chunk.to_vec())).await.expect("part");
        }
        let done = up.complete().await.expect("complete");
        assert!(
            done.e_tag
                .as_deref()
                .is_some_and(|e| e.ends_with("-3\"") || e.ends_with("-3")),
            "{:?}",
            done.e_tag
        );
        let whole = s3
            .get(&Path::from("ds/data-0000"))
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body");
        assert_eq!(&whole[..], &big[..]);

        // Ranged GETs, across the part boundary too.
        for (a, b) in [
            (0, 1),
            (17, 4096),
            (part as u64 - 10, part as u64 + 10),
            (big.len() as u64 - 5, big.len() as u64),
        ] {
            let got = s3.get_range(&Path::from("ds/data-0000"), a..b).await.expect("range");
            assert_eq!(&got[..], &big[a as usize..b as usize], "range {a}..{b}");
        }
        let suffix = GetOptions {
            range: Some(GetRange::Suffix(7)),
            ..Default::default()
        };
        let got = s3
            .get_opts(&Path::from("ds/data-0000"), suffix)
            .await
            .expect("suffix")
            .bytes()
            .await
            .expect("body");
        assert_eq!(&got[..], &big[big.len() - 7..]);

        // If-Match: the right ETag serves, a wrong one is 412.
        let etag = s3
            .head(&Path::from("ds/data-0000"))
            .await
            .expect("head")
            .e_tag
            .expect("etag");
        let ok = GetOptions {
            if_match: Some(etag.clone()),
            range: Some((3..9).into()),
            ..Default::default()
        };
        let got = s3
            .get_opts(&Path::from("ds/data-0000"), ok)
            .await
            .expect("if-match")
            .bytes()
            .await
            .expect("body");
        assert_eq!(&got[..], &big[3..9]);
        let bad = GetOptions {
            if_match: Some("\"0123\"".to_owned()),
            ..Default::default()
        };
        let err = s3
            .get_opts(&Path::from("ds/data-0000"), bad)
            .await
            .expect_err("if-match mismatch");
        assert!(matches!(err, object_store::Error::Precondition { .. }), "{err}");

        // An aborted upload leaves nothing.
        let mut up = s3
            .put_multipart(&Path::from("ds/aborted"))
            .await
            .expect("create upload");
        up.put_part(PutPayload::from(pattern(part, 3))).await.expect("part");
        up.abort().await.expect("abort");

        s3.put(&Path::from("other/x"), b"x".to_vec().into()).await.expect("put");
        let mut listed: Vec<String> = futures_list(&s3, "ds").await;
        listed.sort();
        assert_eq!(listed, ["ds/data-0000", "ds/manifest.json"]);

        s3.delete(&Path::from("ds/manifest.json")).await.expect("delete");
        let err = s3.get(&Path::from("ds/manifest.json")).await.expect_err("deleted");
        assert!(matches!(err, object_store::Error::NotFound { .. }), "{err}");
        assert_eq!(futures_list(&s3, "ds").await, ["ds/data-0000"]);
    })
    .await;
    let st = server.stats();
    assert_eq!(st.put_requests, 2 + 3 + 1, "{st:?}");
    assert!(st.head_requests >= 2, "{st:?}");
    assert!(st.list_requests >= 2, "{st:?}");
    assert_eq!(st.errors_injected, 0);
}

async fn futures_list(s3: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    let r = s3.list_with_delimiter(Some(&Path::from(prefix))).await.expect("list");
    let mut all: Vec<String> = r.objects.into_iter().map(|m| m.location.to_string()).collect();
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_wrong_secret_and_a_bad_bucket_name() {
    let (_dir, server) = start();
    bounded(async {
        let good = client(&server);
        good.put(&Path::from("k"), b"v".to_vec().into()).await.expect("put");
        let bad = client_with(&server, "not-the-secret", Duration::from_secs(5));
        let err = bad.get(&Path::from("k")).await.expect_err("wrong secret");
        assert!(err.to_string().contains("403"), "{err}");
        let err = bad
            .put(&Path::from("k2"), b"v".to_vec().into())
            .await
            .expect_err("wrong secret");
        assert!(err.to_string().contains("403"), "{err}");
        let opts = Options::default();
        let elsewhere = AmazonS3Builder::new()
            .with_endpoint(server.endpoint())
            .with_allow_http(true)
            .with_region("eu-west-1")
            .with_bucket_name(BUCKET)
            .with_access_key_id(&opts.access_key)
            .with_secret_access_key(&opts.secret_key)
            .with_retry(retry_none())
            .build()
            .expect("client");
        let err = elsewhere.get(&Path::from("k")).await.expect_err("wrong region");
        assert!(err.to_string().contains("400"), "{err}");
    })
    .await;
    let (status, body) = create_bucket(&server, "ab").expect("request");
    assert_eq!(status, 400, "{body}");
    let (status, body) = create_bucket(&server, "abc").expect("request");
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_gets_fire_n_times_with_their_status() {
    let (_dir, server) = start();
    let s3 = client(&server);
    let key = Path::from("data-1");
    bounded(async {
        s3.put(&key, pattern(1000, 4).into()).await.expect("put");
        for status in [503u16, 500, 429] {
            server.reset_stats();
            server.faults().fail_gets(2, status);
            for _ in 0..2 {
                let err = s3.get(&key).await.expect_err("injected");
                assert!(err.to_string().contains(&status.to_string()), "{status}: {err}");
            }
            let got = s3.get(&key).await.expect("third get").bytes().await.expect("body");
            assert_eq!(got.len(), 1000);
            let st = server.stats();
            assert_eq!(
                (st.get_requests, st.errors_injected, st.get_bytes),
                (3, 2, 1000),
                "{st:?}"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_bodies_end_short_then_serve() {
    let (_dir, server) = start();
    let s3 = client(&server);
    let key = Path::from("data-2");
    let data = pattern(1 << 20, 5);
    bounded(async {
        s3.put(&key, data.clone().into()).await.expect("put");
        server.reset_stats();
        server.faults().cut_bodies(2, 1000);
        for _ in 0..2 {
            let r = s3.get(&key).await.expect("headers come");
            assert_eq!(r.meta.size, data.len() as u64);
            // The bytes before the cut arrive, then the body fails.
            let mut body = r.into_stream();
            let mut got = Vec::new();
            let err = loop {
                match body.next().await {
                    Some(Ok(b)) => got.extend_from_slice(&b),
                    Some(Err(e)) => break e,
                    None => panic!("the body ended without an error after {} bytes", got.len()),
                }
            };
            assert_eq!(&got[..], &data[..1000], "{err}");
        }
        let got = s3.get(&key).await.expect("get").bytes().await.expect("whole body");
        assert_eq!(&got[..], &data[..]);
    })
    .await;
    let st = server.stats();
    assert_eq!((st.get_requests, st.errors_injected), (3, 2), "{st:?}");
    assert_eq!(st.get_bytes, 2 * 1000 + data.len() as u64, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_time_out_at_the_client_and_release() {
    let (_dir, server) = start();
    let key = Path::from("data-3");
    let data = pattern(300_000, 6);
    client(&server).put(&key, data.clone().into()).await.expect("put");
    let s3 = client_with(&server, &Options::default().secret_key, Duration::from_millis(800));
    bounded(async {
        // Mid-body.
        server.faults().stall_gets(1, 5000);
        let t = Instant::now();
        let r = s3.get(&key).await;
        let failed = match r {
            Err(_) => true,
            Ok(r) => r.bytes().await.is_err(),
        };
        assert!(failed, "a stalled body must time out");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(server.stats().get_bytes, 5000);

        // Before the headers.
        server.faults().stall_all(true);
        let t = Instant::now();
        s3.get(&key).await.expect_err("stalled before headers");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

        // A stalled GET goes on once released.
        let patient = client_with(&server, &Options::default().secret_key, Duration::from_secs(10));
        let waiting = tokio::spawn({
            let key = key.clone();
            async move { patient.get(&key).await?.bytes().await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished());
        server.faults().stall_all(false);
        server.faults().release_stalls();
        let got = waiting.await.expect("join").expect("released get");
        assert_eq!(&got[..], &data[..]);
        let got = s3.get(&key).await.expect("get").bytes().await.expect("body");
        assert_eq!(got.len(), data.len());
    })
    .await;
    assert_eq!(server.stats().errors_injected, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_server_ends_stalled_gets() {
    let (_dir, server) = start();
    let key = Path::from("data-4");
    let s3 = client(&server);
    s3.put(&key, pattern(100_000, 7).into()).await.expect("put");
    server.faults().stall_gets(1, 10);
    let mid_body = tokio::spawn({
        let (s3, key) = (Arc::clone(&s3), key.clone());
        async move { s3.get(&key).await?.bytes().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.faults().stall_all(true);
    let before_headers = tokio::spawn({
        let (s3, key) = (Arc::clone(&s3), key.clone());
        async move { s3.get(&key).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    drop(server);
    assert!(t.elapsed() < Duration::from_secs(3), "drop took {:?}", t.elapsed());
    let r = tokio::time::timeout(Duration::from_secs(5), mid_body)
        .await
        .expect("client sees the end")
        .expect("join");
    assert!(r.is_err());
    let r = tokio::time::timeout(Duration::from_secs(5), before_headers)
        .await
        .expect("client sees the end")
        .expect("join");
    assert!(r.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_and_key_filter() {
    let (_dir, server) = start();
    let s3 = client(&server);
    bounded(async {
        s3.put(&Path::from("ds/manifest"), b"m".to_vec().into())
            .await
            .expect("put");
        s3.put(&Path::from("ds/data-0"), b"d".to_vec().into())
            .await
            .expect("put");
        let f = server.faults();
        f.set_key_filter(Some("data-"));
        f.fail_gets(1, 503);
        f.delay_gets(Duration::from_millis(300));
        let t = Instant::now();
        s3.get(&Path::from("ds/manifest"))
            .await
            .expect("manifest unaffected")
            .bytes()
            .await
            .expect("body");
        assert!(t.elapsed() < Duration::from_millis(250), "{:?}", t.elapsed());
        let t = Instant::now();
        s3.get(&Path::from("ds/data-0")).await.expect_err("data fails");
        assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
        let t = Instant::now();
        s3.get(&Path::from("ds/data-0"))
            .await
            .expect("second data get")
            .bytes()
            .await
            .expect("body");
        assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
        f.clear();
        let t = Instant::now();
        s3.get(&Path::from("ds/data-0"))
            .await
            .expect("cleared")
            .bytes()
            .await
            .expect("body");
        assert!(t.elapsed() < Duration::from_millis(250), "{:?}", t.elapsed());
    })
    .await;
    assert_eq!(server.stats().errors_injected, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_interface() {
    let (_dir, server) = start();
    let s3 = client(&server);
    bounded(async {
        s3.put(&Path::from("data-9"), pattern(4000, 8).into())
            .await
            .expect("put");
    })
    .await;
    let (status, body) = admin(&server, "POST", "/_admin/reset-stats");
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin(&server, "POST", "/_admin/faults?fail=1&status=500&key_filter=data-");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"fail\":1"), "{body}");
    let (status, body) = admin(&server, "POST", "/_admin/faults?cut=1&after=100");
    assert_eq!(status, 200, "{body}");
    let (status, _) = admin(&server, "POST", "/_admin/faults?bogus=1");
    assert_eq!(status, 400);
    let (status, _) = admin(&server, "POST", "/_admin/faults?delay_ms=x");
    assert_eq!(status, 400);
    let (status, _) = admin(&server, "GET", "/_admin/nothing");
    assert_eq!(status, 404);
    bounded(async {
        let err = s3.get(&Path::from("data-9")).await.expect_err("fail fault");
        assert!(err.to_string().contains("500"), "{err}");
        s3.get(&Path::from("data-9"))
            .await
            .expect("headers")
            .bytes()
            .await
            .expect_err("cut fault");
        s3.get(&Path::from("data-9"))
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body");
    })
    .await;
    let (status, body) = admin(&server, "GET", "/_admin/stats");
    assert_eq!(status, 200, "{body}");
    let st: Stats = serde_json::from_str(&body).expect("stats json");
    assert_eq!(
        (st.get_requests, st.errors_injected, st.get_bytes),
        (3, 2, 4100),
        "{st:?}"
    );
    for path in ["/_admin/faults?stall_all=1", "/_admin/release-stalls", "/_admin/clear"] {
        let (status, body) = admin(&server, "POST", path);
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (_, body) = admin(&server, "GET", "/_admin/faults");
    assert!(
        body.contains("\"stall_all\":false") && body.contains("\"key_filter\":null"),
        "{body}"
    );
}

#[test]
fn binary_prints_its_endpoint_and_stops_at_stdin_eof() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("new").join("root");
    let mut child = Command::new(env!("CARGO_BIN_EXE_brand-s3-server"))
        .args(["--dir".as_ref(), data.as_os_str()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    BufReader::new(stdout).read_line(&mut line).expect("endpoint line");
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("endpoint http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("bad line {line:?}"));
    assert!(addr.ip().is_loopback());
    assert!(FsPath::new(&data).is_dir());
    let head = format!("GET /_admin/stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let (status, body) = http(addr, &head, b"").expect("stats");
    assert_eq!(status, 200);
    let st: Stats = serde_json::from_str(&body).expect("json");
    assert_eq!(st, Stats::default());
    drop(child.stdin.take());
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "{status}");
            break;
        }
        if t.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            panic!("did not stop at the end of stdin");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
