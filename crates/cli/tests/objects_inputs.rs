//! `brand pack --from tar|mds|parquet|arrow s3://…`: inputs in object storage,
//! read from a real S3 server (tools/s3-server on 127.0.0.1, SigV4 on, the
//! objects uploaded through the S3 API) by `brand` processes configured the
//! way users configure them (`AWS_ENDPOINT_URL`, keys in the environment).
//! Each pack from URLs is compared with the pack of the same files from the
//! local disk: the segments and the index are the same bytes. The server
//! counts the requests: one listing (with entity tags, as S3's: no HEAD)
//! and GETs of 8 MiB.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brand_s3_server::{Options, Server};
use common::{hidden_entries, ok, s};

/// brand-store's GET size for objects read in order (`ReadAhead`).
const GET_BYTES: u64 = 8 << 20;

/// A server with the bucket `bkt`, and a scratch directory.
struct Store {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    server: Server,
}

impl Store {
    fn new() -> Store {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let server = Server::start(&root.join("s3"), Options::default()).expect("start the S3 server");
        std::fs::create_dir_all(root.join("s3/bkt")).expect("bucket");
        Store {
            _tmp: tmp,
            root,
            server,
        }
    }

    fn client(&self) -> Arc<dyn object_store::ObjectStore> {
        Arc::new(
            object_store::aws::AmazonS3Builder::new()
                .with_endpoint(self.server.endpoint())
                .with_allow_http(true)
                .with_bucket_name("bkt")
                .with_region("us-east-1")
                .with_access_key_id("brand-test-ak")
                .with_secret_access_key("brand-test-sk")
                .build()
                .expect("client"),
        )
    }

    /// Object `key` of `bkt`, through the S3 API (so it has an entity tag).
    fn put(&self, key: &str, bytes: Vec<u8>) {
        use object_store::ObjectStoreExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(self.client().put(&object_store::path::Path::from(key), bytes.into()))
            .expect("put");
    }

    /// Every file under `dir`, uploaded under `prefix` (same relative names).
    fn put_dir(&self, dir: &Path, prefix: &str) {
        for file in walk(dir) {
            let rel = file.strip_prefix(dir).expect("under dir").to_str().expect("utf-8");
            self.put(&format!("{prefix}/{rel}"), std::fs::read(&file).expect("read"));
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_brand"));
        c.args(args)
            .env("RUST_BACKTRACE", "0")
            .env("AWS_ENDPOINT_URL", self.server.endpoint())
            .env("AWS_ACCESS_KEY_ID", "brand-test-ak")
            .env("AWS_SECRET_ACCESS_KEY", "brand-test-sk")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_CONFIG_FILE", self.root.join("no-aws-config"))
            .env("AWS_SHARED_CREDENTIALS_FILE", self.root.join("no-aws-credentials"))
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run brand")
    }

    fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(out.status.success(), "brand {args:?}: {}", stderr(&out));
        out
    }

    /// A pack that must fail cleanly: exit 1, one error line, no panic, no
    /// dataset at `out` and nothing hidden beside it but the listing of the
    /// inputs finished before the error, where the pack says it kept one
    /// (the rerun reuses it). Returns stderr.
    fn fails(&self, args: &[&str], out: &Path) -> String {
        let o = self.run(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "brand {args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(
            err.lines().filter(|l| l.starts_with("brand: error:")).count(),
            1,
            "{err}"
        );
        assert!(!out.exists(), "{} left behind: {err}", out.display());
        let parent = out.parent().expect("parent");
        let listing = format!(".{}.listing", out.file_name().expect("name").to_string_lossy());
        let allowed: Vec<String> = if err.contains("is kept in") {
            vec![listing]
        } else {
            Vec::new()
        };
        assert_eq!(hidden_entries(parent), allowed, "{err}");
        err
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every file under `dir`, sorted.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The segments and index of two datasets are the same bytes (their
/// manifests differ: provenance names the inputs as given).
fn assert_same_dataset(a: &Path, b: &Path) {
    let names = |d: &Path| {
        let mut n: Vec<String> = std::fs::read_dir(d)
            .expect("dataset")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".brd") || n == "index.bin")
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(a), names(b));
    assert!(names(a).len() >= 2, "{:?}", names(a));
    for name in names(a) {
        let (x, y) = (std::fs::read(a.join(&name)), std::fs::read(b.join(&name)));
        assert!(x.expect("a") == y.expect("b"), "{name} differs");
    }
}

/// The manifest's provenance inputs.
fn provenance_inputs(ds: &Path) -> Vec<String> {
    let m = brand_format::manifest::Manifest::load(&ds.join("manifest.toml")).expect("manifest");
    m.provenance.inputs
}

/// A WebDataset shard of samples `first..first + n` (`.txt`, `.jpg`, `.cls`
/// each), payloads of `bytes` bytes and more.
fn shard(first: usize, n: usize, bytes: usize) -> Vec<u8> {
    let mut members = Vec::new();
    for i in first..first + n {
        let key = format!("s{i:05}");
        let payload: Vec<u8> = (0..bytes + i).map(|b| (b * 31 + i) as u8).collect();
        members.push((format!("{key}.txt"), b"caption".to_vec()));
        members.push((format!("{key}.jpg"), payload));
        members.push((format!("{key}.cls"), (i % 7).to_string().into_bytes()));
    }
    common::ustar(&members)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(bytes).expect("gzip");
    z.finish().expect("gzip")
}

/// `shards/`: two tars (one of 3 GETs), a gzipped tar, and what a listing
/// must skip (another extension, a hidden tar, a tar one level down).
/// Written to `dir` and uploaded under `shards/`; returns the sizes of the
/// objects a pack reads.
fn tar_shards(store: &Store, dir: &Path) -> Vec<u64> {
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    let files = [
        ("a-00000.tar", shard(0, 40, 1000)),
        ("a-00001.tar", shard(40, 90, 200 << 10)),
        ("a-00002.tar.gz", gzip(&shard(130, 25, 3000))),
        ("README.txt", b"not a tar".to_vec()),
        (".partial.tar", shard(500, 3, 10)),
        ("sub/b-00000.tar", shard(600, 3, 10)),
    ];
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes).expect("write");
    }
    store.put_dir(dir, "shards");
    files[..3].iter().map(|(_, b)| b.len() as u64).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn tar_pack<'a>(input: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "pack",
        "--from",
        "tar",
        input,
        "--field",
        "jpg",
        "--label",
        "cls",
        "-o",
        out,
        "--chunk-size",
        "8",
        "--seed",
        "3",
    ]
}

#[test]
fn a_prefix_of_tar_shards_packs_as_the_same_files_do_with_one_get_per_8_mib() {
    let store = Store::new();
    let t = &store.root;
    let sizes = tar_shards(&store, &t.join("shards"));
    let (local, remote) = (t.join("local"), t.join("remote"));
    ok(&tar_pack(s(&t.join("shards")), s(&local)));
    store.server.reset_stats();
    let mut args = vec!["-v"];
    args.extend(tar_pack("s3://bkt/shards/", s(&remote)));
    let out = store.ok(&args);
    assert_same_dataset(&local, &remote);
    assert_eq!(provenance_inputs(&remote), ["s3://bkt/shards/"]);
    // Each object read once, in order: one listing (whose entity tags pin
    // the reads: no HEAD) and ⌈size / 8 MiB⌉ GETs.
    let stats = store.server.stats();
    let gets: u64 = sizes.iter().map(|n| n.div_ceil(GET_BYTES)).sum();
    let bytes: u64 = sizes.iter().sum();
    eprintln!("{} objects, {bytes} bytes: {stats:?}", sizes.len());
    assert_eq!(stats.list_requests, 1, "{stats:?}");
    assert_eq!(stats.head_requests, 0, "{stats:?}");
    assert_eq!(stats.get_requests, gets, "{stats:?}");
    assert_eq!(stats.get_bytes, bytes, "{stats:?}");
    // Progress (-v): each object as it is read, in name order, and what it took.
    let err = stderr(&out);
    let at = |what: &str| err.find(what).unwrap_or_else(|| panic!("no {what:?} in {err}"));
    let order: Vec<usize> = ["a-00000.tar (", "a-00001.tar (", "a-00002.tar.gz ("]
        .iter()
        .map(|n| at(&format!("reading s3://bkt/shards/{n}")))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{err}");
    // Three GETs (the listing gave the entity tag).
    assert!(err.contains("s3://bkt/shards/a-00001.tar: 3 requests"), "{err}");
    assert!(!err.contains("partial") && !err.contains("sub/"), "{err}");

    // One object by its URL, and a local file beside it: the same as both local.
    let (local2, remote2) = (t.join("local2"), t.join("remote2"));
    let (gz, plain) = (t.join("shards/a-00002.tar.gz"), t.join("shards/a-00000.tar"));
    let mut args = tar_pack(s(&gz), s(&local2));
    args.insert(4, s(&plain));
    ok(&args);
    let mut args = tar_pack("s3://bkt/shards/a-00002.tar.gz", s(&remote2));
    args.insert(4, s(&plain));
    store.ok(&args);
    assert_same_dataset(&local2, &remote2);
}

/// An MDS dataset of three shards in `dir` (zstd or plain), one of them in
/// a subdirectory, as Streaming writes them.
fn write_mds(dir: &Path, zstd: bool) {
    let shards: Vec<brand_testkit::MdsShard> = [(0usize, 30usize), (1, 12), (2, 20)]
        .into_iter()
        .map(|(k, n)| {
            let basename = if k == 2 {
                format!("part/shard.{k:05}.mds")
            } else {
                format!("shard.{k:05}.mds")
            };
            let samples = (0..n)
                .map(|i| (((k * 7 + i) % 5) as i64, vec![(i + k) as u8; 50 + 900 * i]))
                .collect();
            (basename, samples)
        })
        .collect();
    brand_testkit::write_mds(dir, &shards, zstd.then_some(3));
}

#[test]
fn mds_datasets_plain_and_zstd_pack_from_a_prefix_as_from_their_directory() {
    let store = Store::new();
    let t = &store.root;
    for (name, zstd) in [("plain", false), ("zstd", true)] {
        write_mds(&t.join(name), zstd);
        store.put_dir(&t.join(name), &format!("mds/{name}"));
    }
    let pack = |input: &str, out: &Path| {
        vec![
            "pack".to_string(),
            "--from".into(),
            "mds".into(),
            input.into(),
            "--field".into(),
            "image".into(),
            "--label".into(),
            "label".into(),
            "-o".into(),
            s(out).into(),
            "--chunk-size".into(),
            "4".into(),
        ]
    };
    let local = t.join("local");
    ok(&strs(&pack(s(&t.join("plain")), &local)));
    // The prefix (no trailing slash: a HEAD finds no object, then it is
    // listed), and the index object itself.
    for (i, url) in [
        "s3://bkt/mds/plain",
        "s3://bkt/mds/zstd/index.json",
        "s3://bkt/mds/zstd/",
    ]
    .iter()
    .enumerate()
    {
        let out = t.join(format!("remote{i}"));
        store.server.reset_stats();
        store.ok(&strs(&pack(url, &out)));
        assert_same_dataset(&local, &out);
        assert_eq!(provenance_inputs(&out), [url.to_string()]);
        let stats = store.server.stats();
        eprintln!("{url}: {stats:?}");
        // index.json and three shards, each one GET (all under 8 MiB); the
        // prefix listed once (the index's URL: its name, then its prefix).
        assert_eq!(stats.get_requests, 4, "{url}: {stats:?}");
        let lists = if url.ends_with("index.json") { 2 } else { 1 };
        assert_eq!(stats.list_requests, lists, "{url}: {stats:?}");
    }
    // A prefix without index.json, a shard missing: named errors, nothing left.
    let out = t.join("none");
    let err = store.fails(&strs(&pack("s3://bkt/mds", &out)), &out);
    assert!(
        err.contains("s3://bkt/mds") && err.contains("no index.json under this prefix"),
        "{err}"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    use object_store::ObjectStoreExt;
    rt.block_on(
        store
            .client()
            .delete(&object_store::path::Path::from("mds/plain/part/shard.00002.mds")),
    )
    .expect("delete");
    let err = store.fails(&strs(&pack("s3://bkt/mds/plain/", &out)), &out);
    assert!(
        err.contains("missing shard file s3://bkt/mds/plain/part/shard.00002.mds"),
        "{err}"
    );
}

/// Parquet files as `datasets` writes them: `image` binary, `label` int64.
fn write_parquet(path: &Path, first: usize, rows: usize) {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    let schema = Arc::new(
        parquet::schema::parser::parse_message_type("message schema { optional binary image; optional int64 label; }")
            .expect("schema"),
    );
    let props = Arc::new(WriterProperties::builder().set_max_row_group_row_count(Some(7)).build());
    let file = std::fs::File::create(path).expect("create");
    let mut writer = SerializedFileWriter::new(file, schema, props).expect("writer");
    for group in (first..first + rows).collect::<Vec<_>>().chunks(7) {
        let mut rg = writer.next_row_group().expect("row group");
        let mut col = rg.next_column().expect("column").expect("image");
        let images: Vec<ByteArray> = group
            .iter()
            .map(|&r| ByteArray::from((0..300 + r * 50).map(|b| (b ^ r) as u8).collect::<Vec<u8>>()))
            .collect();
        col.typed::<ByteArrayType>()
            .write_batch(&images, Some(&vec![1; group.len()]), None)
            .expect("write");
        col.close().expect("close");
        let mut col = rg.next_column().expect("column").expect("label");
        let labels: Vec<i64> = group.iter().map(|&r| (r % 4) as i64).collect();
        col.typed::<Int64Type>()
            .write_batch(&labels, Some(&vec![1; group.len()]), None)
            .expect("write");
        col.close().expect("close");
        rg.close().expect("close");
    }
    writer.close().expect("close");
}

#[test]
fn parquet_files_pack_from_a_prefix_as_from_their_directory() {
    let store = Store::new();
    let t = &store.root;
    let data = t.join("hub/data");
    std::fs::create_dir_all(&data).expect("mkdir");
    write_parquet(&data.join("train-00000-of-00002.parquet"), 0, 40);
    write_parquet(&data.join("train-00001-of-00002.parquet"), 40, 25);
    store.put_dir(&t.join("hub"), "hub");
    let pack = |input: &str, out: &Path| {
        vec![
            "pack".to_string(),
            "--from".into(),
            "parquet".into(),
            input.into(),
            "--label".into(),
            "label".into(),
            "-o".into(),
            s(out).into(),
        ]
    };
    let (local, remote) = (t.join("local"), t.join("remote"));
    ok(&strs(&pack(s(&data), &local)));
    store.server.reset_stats();
    store.ok(&strs(&pack("s3://bkt/hub/data", &remote)));
    assert_same_dataset(&local, &remote);
    let stats = store.server.stats();
    eprintln!("parquet: {stats:?}");
    assert_eq!((stats.list_requests, stats.get_requests), (1, 2), "{stats:?}");
    // A prefix with no .parquet objects.
    let out = t.join("none");
    let err = store.fails(&strs(&pack("s3://bkt/hub", &out)), &out);
    assert!(
        err.contains("s3://bkt/hub") && err.contains("no .parquet objects under the prefix"),
        "{err}"
    );
}

/// The manifest's class names.
fn label_names(ds: &Path) -> Vec<String> {
    let m = brand_format::manifest::Manifest::load(&ds.join("manifest.toml")).expect("manifest");
    m.label_names
}

#[test]
fn arrow_save_to_disk_and_a_prefix_of_arrow_files_pack_as_their_directories() {
    use brand_testkit::arrow_ipc::{NAMES, file_format, hf_stream, rows, save_to_disk};
    let store = Store::new();
    let t = &store.root;
    // state.json lists 00001 first; class names only in dataset_info.json.
    let hf = t.join("hf/train");
    save_to_disk(
        &hf,
        &[
            ("data-00001-of-00002.arrow", rows(1, 23)),
            ("data-00000-of-00002.arrow", rows(0, 30)),
        ],
        false,
    );
    store.put_dir(&t.join("hf"), "hf");
    // Plain .arrow files (stream and file format), and what a listing
    // skips: another extension, a hidden file, a file one level down.
    let plain = t.join("plain");
    std::fs::create_dir_all(plain.join("sub")).expect("mkdir");
    std::fs::write(plain.join("a.arrow"), hf_stream(&rows(2, 17), 5, Some(&NAMES))).expect("write");
    std::fs::write(
        plain.join("b.arrow"),
        file_format(&hf_stream(&rows(3, 9), 4, Some(&NAMES))),
    )
    .expect("write");
    std::fs::write(plain.join("README.txt"), "not arrow").expect("write");
    std::fs::write(plain.join(".c.arrow"), "hidden").expect("write");
    std::fs::write(plain.join("sub/d.arrow"), "below").expect("write");
    store.put_dir(&plain, "plain");
    let pack = |input: &str, out: &Path| {
        vec![
            "pack".to_string(),
            "--from".into(),
            "arrow".into(),
            input.into(),
            "--field".into(),
            "image".into(),
            "--label".into(),
            "label".into(),
            "-o".into(),
            s(out).into(),
            "--chunk-size".into(),
            "8".into(),
        ]
    };
    for (dir, urls) in [
        (&hf, ["s3://bkt/hf/train", "s3://bkt/hf/train/"]),
        (&plain, ["s3://bkt/plain", "s3://bkt/plain/"]),
    ] {
        let local = t.join(format!(
            "local-{}",
            dir.file_name().and_then(|n| n.to_str()).expect("name")
        ));
        ok(&strs(&pack(s(dir), &local)));
        assert_eq!(label_names(&local), NAMES);
        for (i, url) in urls.iter().enumerate() {
            let out = t.join(format!("{}-{i}", s(&local)));
            store.server.reset_stats();
            store.ok(&strs(&pack(url, &out)));
            assert_same_dataset(&local, &out);
            assert_eq!(label_names(&out), NAMES, "{url}");
            assert_eq!(provenance_inputs(&out), [url.to_string()]);
            let stats = store.server.stats();
            eprintln!("{url}: {stats:?}");
            // One listing; the two data files (and state.json and
            // dataset_info.json) each one GET.
            let gets = if dir == &hf { 4 } else { 2 };
            assert_eq!((stats.list_requests, stats.get_requests), (1, gets), "{url}: {stats:?}");
        }
    }
    // One object by its URL, beside a local file: the same as both local.
    let (local, remote) = (t.join("local-two"), t.join("remote-two"));
    let mut args = pack(s(&plain.join("b.arrow")), &local);
    args.insert(3, s(&plain.join("a.arrow")).into());
    ok(&strs(&args));
    let mut args = pack("s3://bkt/plain/b.arrow", &remote);
    args.insert(3, s(&plain.join("a.arrow")).into());
    store.ok(&strs(&args));
    assert_same_dataset(&local, &remote);

    // A missing prefix, one without .arrow files, a data file missing, a
    // DatasetDict: named errors, nothing left.
    let out = t.join("none");
    let err = store.fails(&strs(&pack("s3://bkt/nothing/here", &out)), &out);
    assert!(
        err.contains("s3://bkt/nothing/here") && err.contains("nothing under this prefix"),
        "{err}"
    );
    store.put("other/notes.txt", b"no arrow here".to_vec());
    let err = store.fails(&strs(&pack("s3://bkt/other", &out)), &out);
    assert!(
        err.contains("s3://bkt/other") && err.contains("no .arrow objects under the prefix (and no state.json)"),
        "{err}"
    );
    store.put("dict/dataset_dict.json", br#"{"splits": ["train", "test"]}"#.to_vec());
    let err = store.fails(&strs(&pack("s3://bkt/dict/", &out)), &out);
    assert!(
        err.contains("s3://bkt/dict/dataset_dict.json")
            && err.contains("DatasetDict of splits [train, test]")
            && err.contains("s3://bkt/dict/train"),
        "{err}"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    use object_store::ObjectStoreExt;
    rt.block_on(
        store
            .client()
            .delete(&object_store::path::Path::from("hf/train/data-00000-of-00002.arrow")),
    )
    .expect("delete");
    let err = store.fails(&strs(&pack("s3://bkt/hf/train", &out)), &out);
    assert!(
        err.contains("s3://bkt/hf/train/state.json")
            && err.contains("s3://bkt/hf/train/data-00000-of-00002.arrow, which does not exist"),
        "{err}"
    );
}

#[test]
fn missing_inputs_refused_keys_and_other_formats_are_named_errors_leaving_nothing() {
    let store = Store::new();
    let t = &store.root;
    tar_shards(&store, &t.join("shards"));
    let out = t.join("out");
    let err = store.fails(&tar_pack("s3://bkt/nothing/here/", s(&out)), &out);
    assert!(
        err.contains("s3://bkt/nothing/here") && err.contains("nothing under this prefix"),
        "{err}"
    );
    let err = store.fails(&tar_pack("s3://bkt/shards/a-00009.tar", s(&out)), &out);
    assert!(
        err.contains("s3://bkt/shards/a-00009.tar") && err.contains("no such object"),
        "{err}"
    );
    let err = store.fails(&tar_pack("s3://nobkt/shards/", s(&out)), &out);
    assert!(err.contains("the bucket nobkt does not exist"), "{err}");
    let o = store
        .command(&tar_pack("s3://bkt/shards/", s(&out)))
        .env("AWS_SECRET_ACCESS_KEY", "wrong-secret-XYZZY")
        .output()
        .expect("run");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("access refused") && err.contains("s3://bkt/shards"),
        "{err}"
    );
    assert!(!err.contains("XYZZY"), "the secret leaked: {err}");
    assert!(!out.exists());
    let err = store.fails(&tar_pack("s3://ak:SECRETPW@bkt/shards/", s(&out)), &out);
    assert!(!err.contains("SECRETPW"), "{err}");
    let err = store.fails(&["pack", "--from", "tfrecord", "s3://bkt/shards/", "-o", s(&out)], &out);
    assert!(err.contains("--from tfrecord reads local files"), "{err}");
}

#[test]
fn an_object_replaced_or_cut_short_during_the_pack_is_an_error_naming_it() {
    let store = Store::new();
    let t = &store.root;
    let big = shard(0, 90, 200 << 10);
    store.put("one/big.tar", big.clone());
    let out = t.join("out");
    // Every attempt of every GET cut after 4 KiB: resumed, then given up.
    store.server.faults().set_key_filter(Some("big"));
    store.server.faults().cut_bodies(1000, 4096);
    let err = store.fails(&tar_pack("s3://bkt/one/big.tar", s(&out)), &out);
    assert!(
        err.contains("s3://bkt/one/big.tar") && err.contains("bytes 0..8388608") && err.contains("after 10 retries"),
        "{err}"
    );
    store.server.faults().clear();

    // Replaced while its GETs are on their way (held at the server): the
    // GETs carry If-Match with the entity tag of the HEAD, so the pack
    // fails, naming the object, instead of mixing two versions.
    store.server.faults().set_key_filter(Some("big"));
    store.server.faults().delay_gets(Duration::from_secs(3));
    store.server.reset_stats();
    let mut child = store
        .command(&tar_pack("s3://bkt/one/big.tar", s(&out)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.server.stats().get_requests == 0 {
        assert!(Instant::now() < deadline, "no GET arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut other = big;
    let last = other.len() - 1;
    other[last] ^= 0xff;
    store.put("one/big.tar", other);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(Instant::now() < deadline, "brand pack did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err).expect("stderr");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("s3://bkt/one/big.tar") && err.contains("the object was replaced while it was read"),
        "{err}"
    );
    assert!(!out.exists() && hidden_entries(t).is_empty());
}
