//! Objects read whole and in order (`sequential.rs`) from a real S3 server
//! (tools/s3-server, in process): every byte in order from GETs of the
//! configured size, cut bodies resumed (never fetched again), an object
//! replaced mid-read an error, listings as directories are listed.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use brand_s3_server::{Options, Server};
use brand_store::get::GetPolicy;
use brand_store::location::Location;
use brand_store::{Connection, ObjectInfo, Objects, ReadAhead};
use object_store::ObjectStoreExt;

const SIZE: usize = (3 << 20) + 1234;
const GET: u64 = 256 << 10;

struct Fixture {
    _tmp: tempfile::TempDir,
    server: Server,
    client: Arc<object_store::aws::AmazonS3>,
    objects: Objects,
    data: Vec<u8>,
}

fn client(server: &Server, bucket: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_endpoint(server.endpoint())
        .with_allow_http(true)
        .with_bucket_name(bucket)
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

fn put(f: &Fixture, key: &str, bytes: Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(f.client.put(&object_store::path::Path::from(key), bytes.into()))
        .expect("put");
}

/// `bkt/in/big` (SIZE bytes), `bkt/in/small`, `bkt/in/sub/x`, uploaded
/// through the S3 API; objects read in GETs of 256 KiB, 3 ahead.
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&tmp.path().join("s3"), Options::default()).expect("server");
    std::fs::create_dir_all(tmp.path().join("s3/bkt")).expect("bucket");
    let store = client(&server, "bkt");
    let Location::Url(url) = Location::parse("s3://bkt/anything").expect("url") else {
        panic!("not a url")
    };
    let policy = GetPolicy {
        stall: Duration::from_millis(500),
        retries: 5,
        backoff: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        ..GetPolicy::default()
    };
    let conn = Connection {
        url,
        store: Arc::new(client(&server, "bkt")),
    };
    let read_ahead = ReadAhead {
        get_bytes: GET,
        gets_ahead: 3,
    };
    let f = Fixture {
        _tmp: tmp,
        objects: Objects::with_connection(conn, policy, read_ahead).expect("objects"),
        server,
        client: Arc::new(store),
        data: (0..SIZE).map(|i| (i * 13 + i / 1000) as u8).collect(),
    };
    put(&f, "in/big", f.data.clone());
    put(&f, "in/small", b"small".to_vec());
    put(&f, "in/sub/x", b"x".to_vec());
    f
}

fn big(f: &Fixture) -> ObjectInfo {
    f.objects.head("in/big").expect("head").expect("in/big exists")
}

#[test]
fn an_object_is_read_in_order_in_gets_of_the_configured_size() {
    let f = fixture();
    let info = big(&f);
    assert_eq!(info.size, SIZE as u64);
    f.server.reset_stats();
    let mut got = Vec::new();
    let mut reader = f.objects.reader(&info);
    reader.read_to_end(&mut got).expect("read");
    assert!(got == f.data, "the bytes differ");
    let stats = f.server.stats();
    let gets = (SIZE as u64).div_ceil(GET);
    assert_eq!((stats.get_requests, stats.get_bytes), (gets, SIZE as u64), "{stats:?}");
    assert_eq!(stats.head_requests, 0, "the entity tag was known: {stats:?}");
    assert_eq!(reader.report().requests, gets);
    // Without an entity tag (a listing that gives none), one HEAD first.
    f.server.reset_stats();
    let untagged = ObjectInfo { e_tag: None, ..info };
    let mut again = Vec::new();
    f.objects.reader(&untagged).read_to_end(&mut again).expect("read");
    assert!(again == f.data);
    assert_eq!(f.server.stats().head_requests, 1);
}

#[test]
fn cut_bodies_are_resumed_not_fetched_again() {
    let f = fixture();
    let info = big(&f);
    f.server.reset_stats();
    f.server.faults().cut_bodies(4, 1000);
    let mut got = Vec::new();
    let mut reader = f.objects.reader(&info);
    reader.read_to_end(&mut got).expect("read");
    assert!(got == f.data, "the bytes differ");
    assert_eq!(reader.report().retries, 4);
    assert_eq!(f.server.stats().get_bytes, SIZE as u64, "{:?}", f.server.stats());
}

#[test]
fn an_object_replaced_while_it_is_read_is_an_error_never_a_mix() {
    let f = fixture();
    let info = big(&f);
    let mut reader = f.objects.reader(&info);
    let mut first = vec![0u8; 1000];
    reader.read_exact(&mut first).expect("first bytes");
    let mut other = f.data.clone();
    other[SIZE - 1] ^= 0xff;
    put(&f, "in/big", other);
    let mut rest = Vec::new();
    let e = reader.read_to_end(&mut rest).expect_err("a replaced object");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("replaced while it was read"), "{e}");
    // What came before the error is the old version's, never the new one's.
    assert!(rest.len() < SIZE - 1000 && rest[..] == f.data[1000..1000 + rest.len()]);
    // The error stays.
    assert!(reader.read(&mut [0u8; 10]).is_err());
}

#[test]
fn listings_are_directories_and_missing_things_are_named() {
    let f = fixture();
    let (objects, prefixes) = f.objects.list("in", false).expect("list");
    let keys: Vec<&str> = objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["in/big", "in/small"]);
    assert_eq!(objects[1].size, 5);
    assert_eq!(objects[1].file_name(), "small");
    assert_eq!(prefixes, ["in/sub"]);
    let (all, _) = f.objects.list("in", true).expect("list");
    assert_eq!(all.len(), 3);
    assert!(f.objects.list("nothing", false).expect("list").0.is_empty());
    assert_eq!(f.objects.head("in/none").expect("head"), None);
    let Location::Url(url) = Location::parse("s3://nobkt/x").expect("url") else {
        panic!()
    };
    let conn = Connection {
        url,
        store: Arc::new(client(&f.server, "nobkt")),
    };
    let none = Objects::with_connection(conn, GetPolicy::default(), ReadAhead::default()).expect("objects");
    let e = none.list("x", false).expect_err("no bucket").to_string();
    assert!(
        e.contains("s3://nobkt/x") && e.contains("the bucket nobkt does not exist"),
        "{e}"
    );
}
