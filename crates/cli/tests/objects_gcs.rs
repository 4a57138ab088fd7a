//! Datasets in Google Cloud Storage (`gs://`), end to end, against a GCS
//! emulator on 127.0.0.1: gcp-storage-emulator, installed by
//! scripts/gcs-emulator.sh, whose python `BRAND_GCS_PYTHON` names (`make
//! rust-test` sets it), run through scripts/gcs_emulator.py, which adds the
//! XML API object_store's GCS client speaks. Each test starts its own
//! emulator on a free port and kills it at the end. Datasets get there
//! through the emulator's JSON API (stored as GCS stores them) and through
//! `brand pack -o gs://…`; the `brand` processes find the emulator the way
//! users point Google's tools at one (`STORAGE_EMULATOR_HOST`).
//!
//! Without `BRAND_GCS_PYTHON` the tests say they did not run and pass,
//! except under CI (`CI` set), where that fails; a set but broken one fails.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{gen_samples_with, s};

const SAMPLES: u64 = 300;
/// How long the emulator may take to start, and one request to answer.
const START_LIMIT: Duration = Duration::from_secs(30);
const REQUEST_LIMIT: Duration = Duration::from_secs(30);
/// How long a refused command may take (the S3 tests allow 20 s).
const FAIL_LIMIT: Duration = Duration::from_secs(20);

/// The emulator, killed on drop, and a scratch directory.
struct Emulator {
    child: Child,
    port: u16,
    tmp: tempfile::TempDir,
}

impl Emulator {
    /// `None` (said on stderr) when `BRAND_GCS_PYTHON` is unset outside CI.
    fn start() -> Option<Emulator> {
        let Some(python) = std::env::var_os("BRAND_GCS_PYTHON").filter(|v| !v.is_empty()) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "BRAND_GCS_PYTHON must name the python of scripts/gcs-emulator.sh under CI"
            );
            eprintln!(
                "objects_gcs: did not run: BRAND_GCS_PYTHON is unset (scripts/gcs-emulator.sh; make rust-test sets it)"
            );
            return None;
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gcs_emulator.py");
        // Its settings go in the scratch directory: it is killed, so it
        // cannot remove a directory of its own.
        let tmp = tempfile::tempdir().expect("tempdir");
        let settings = tmp.path().join("emulator");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(&python)
            .arg(&script)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--settings-dir"])
            .arg(&settings)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {python:?} {}: {e}", script.display()));
        // The first line it prints says it listens; read it on a thread, so
        // a silent emulator fails within START_LIMIT.
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_LIMIT).unwrap_or_default();
        if !line.starts_with("listening on") {
            let _ = child.kill();
            let status = child.wait();
            panic!(
                "the GCS emulator ({python:?} {}) did not say it listens within {START_LIMIT:?} \
                 (its first line: {line:?}; {status:?}; its stderr is above)",
                script.display()
            );
        }
        Some(Emulator { child, port, tmp })
    }

    fn root(&self) -> &Path {
        self.tmp.path()
    }

    /// One HTTP/1.0 request (the emulator answers and closes): status and body.
    fn http(&self, method: &str, target: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let mut conn = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the emulator");
        conn.set_read_timeout(Some(REQUEST_LIMIT)).expect("timeout");
        conn.set_write_timeout(Some(REQUEST_LIMIT)).expect("timeout");
        let head = format!(
            "{method} {target} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            self.port,
            body.len()
        );
        conn.write_all(head.as_bytes()).expect("send");
        conn.write_all(body).expect("send");
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).expect("answer");
        let split = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("{method} {target}: no header end in {answer:?}"));
        let status = String::from_utf8_lossy(&answer[..split])
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status");
        (status, answer[split + 4..].to_vec())
    }

    /// Creates `bucket` through the JSON API (buckets.insert).
    fn create_bucket(&self, bucket: &str) {
        let mut conn = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        conn.set_read_timeout(Some(REQUEST_LIMIT)).expect("timeout");
        let body = format!("{{\"name\": \"{bucket}\"}}");
        let req = format!(
            "POST /storage/v1/b HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(req.as_bytes()).expect("send");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).expect("answer");
        assert!(answer.starts_with("HTTP/1.0 200"), "create bucket {bucket}: {answer}");
    }

    /// Uploads `bytes` as `bucket/name` through the JSON API (objects.insert, uploadType=media).
    fn upload(&self, bucket: &str, name: &str, bytes: &[u8]) {
        let target = format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}", encode(name));
        let (status, body) = self.http("POST", &target, bytes);
        assert_eq!(status, 200, "upload {name}: {}", String::from_utf8_lossy(&body));
    }

    /// `bucket/name` through the JSON API (objects.get, alt=media).
    fn download(&self, bucket: &str, name: &str) -> Vec<u8> {
        let (status, body) = self.http(
            "GET",
            &format!("/storage/v1/b/{bucket}/o/{}?alt=media", encode(name)),
            b"",
        );
        assert_eq!(status, 200, "download {name}: {}", String::from_utf8_lossy(&body));
        body
    }

    /// `brand args…` pointed at the emulator as a user would point it,
    /// with nothing of this machine's Google configuration.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_brand"));
        c.args(args)
            .env("RUST_BACKTRACE", "0")
            .env("STORAGE_EMULATOR_HOST", format!("127.0.0.1:{}", self.port))
            .env("XDG_CACHE_HOME", self.root().join("cache"))
            .env("HOME", self.root())
            .stdin(Stdio::null());
        for (k, _) in std::env::vars_os() {
            if k.to_str().is_some_and(|k| k.starts_with("GOOGLE_")) {
                c.env_remove(k);
            }
        }
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

    /// A command that must fail cleanly and soon: exit 1, no panic, within
    /// `FAIL_LIMIT`. Returns stderr.
    fn fails(&self, cmd: &mut Command) -> String {
        let start = std::time::Instant::now();
        let out = cmd.output().expect("run brand");
        let took = start.elapsed();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(took < FAIL_LIMIT, "{cmd:?} took {took:?}: {err}");
        err
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A query-string value: unreserved characters kept, the rest %XX.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Generated files and a local dataset packed from them (`files`, `ds` under `root`).
fn local_dataset(root: &Path, samples: u64, mean_kib: &str, max_kib: &str) -> (PathBuf, PathBuf) {
    let files = root.join("files");
    gen_samples_with(&files, samples, mean_kib, max_kib, "5", 11);
    let ds = root.join("ds");
    common::ok(&["pack", s(&files), "-o", s(&ds), "--chunk-size", "8", "--seed", "4"]);
    (files, ds)
}

/// The dataset's files, by name.
fn dataset_files(ds: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(ds)
        .expect("dataset dir")
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).expect("read"))
        })
        .collect();
    files.sort();
    assert!(files.iter().any(|(n, _)| n == "manifest.toml"), "{files:?}");
    files
}

/// `brand read URL --json --epochs 2`: every sample once per epoch, the
/// local copy's order, and some samples' bytes equal to the local copy's.
fn reads_like_the_local_copy(emu: &Emulator, url: &str, local: &Path, samples: u64) {
    let out = emu.ok(&["read", url, "--json", "--epochs", "2", "--memory", "10%"]);
    let epochs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("read --json");
    assert_eq!(epochs.len(), 2);
    for e in &epochs {
        assert_eq!(e["samples"].as_u64(), Some(samples), "{e}");
        assert_eq!(e["exactly_once"].as_bool(), Some(true), "{e}");
        assert!(e["metrics"]["store_bytes_fetched"].as_u64() > Some(0), "{e}");
    }
    let same = common::ok(&["read", s(local), "--json", "--epochs", "2", "--memory", "10%"]);
    let same: Vec<serde_json::Value> = serde_json::from_slice(&same.stdout).expect("json");
    for (a, b) in epochs.iter().zip(&same) {
        assert_eq!(a["order"], b["order"]);
    }
    for id in [0, 7, samples / 2, samples - 1] {
        let remote = emu.ok(&["cat", url, &id.to_string()]);
        let here = common::ok(&["cat", s(local), &id.to_string()]);
        assert!(remote.stdout == here.stdout, "sample {id} differs");
    }
    let verify = emu.ok(&["verify", url]);
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(said.contains(&format!("{samples} samples, 0 problem(s)")), "{said}");
}

#[test]
fn a_dataset_uploaded_through_the_json_api_reads_back_exactly_once_with_every_byte_equal() {
    let Some(emu) = Emulator::start() else { return };
    let (_, local) = local_dataset(emu.root(), SAMPLES, "24", "64");
    emu.create_bucket("bkt");
    for (name, bytes) in dataset_files(&local) {
        emu.upload("bkt", &format!("sets/ds/{name}"), &bytes);
    }
    let url = "gs://bkt/sets/ds";
    let inspect = emu.ok(&["inspect", url, "--json"]);
    let info: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("inspect --json");
    assert_eq!(info["samples"].as_u64(), Some(SAMPLES), "{info}");
    reads_like_the_local_copy(&emu, url, &local, SAMPLES);
}

#[test]
fn pack_to_gs_stores_what_a_local_pack_writes_and_reads_back() {
    let Some(emu) = Emulator::start() else { return };
    // ~19 MiB in one segment: over the 8 MiB part size, so its upload is multipart.
    let samples = 400;
    let (files, local) = local_dataset(emu.root(), samples, "48", "96");
    let local_files = dataset_files(&local);
    assert!(
        local_files.iter().any(|(_, b)| b.len() > 8 << 20),
        "no file over a part: {:?}",
        local_files.iter().map(|(n, b)| (n, b.len())).collect::<Vec<_>>()
    );
    emu.create_bucket("bkt");
    let url = "gs://bkt/prefix/ds2";
    let pack = ["pack", s(&files), "-o", url, "--chunk-size", "8", "--seed", "4"];
    let staging = emu.root().join("staging");
    std::fs::create_dir_all(&staging).expect("staging");
    let mut args = pack.to_vec();
    args.extend(["--staging", s(&staging)]);
    emu.ok(&args);
    // What GCS holds, read through the other API, is what was packed locally.
    for (name, bytes) in &local_files {
        let stored = emu.download("bkt", &format!("prefix/ds2/{name}"));
        assert!(
            &stored == bytes,
            "{name} differs ({} bytes stored, {} local)",
            stored.len(),
            bytes.len()
        );
    }
    reads_like_the_local_copy(&emu, url, &local, samples);
    let err = emu.fails(emu.command(&args).stderr(Stdio::piped()));
    assert!(err.contains("already holds a dataset") && err.contains(url), "{err}");
}

#[test]
fn a_missing_bucket_or_prefix_is_an_error_naming_the_url() {
    let Some(emu) = Emulator::start() else { return };
    let (_, local) = local_dataset(emu.root(), 40, "4", "8");
    emu.create_bucket("bkt");
    for (name, bytes) in dataset_files(&local) {
        emu.upload("bkt", &format!("sets/ds/{name}"), &bytes);
    }
    emu.ok(&["inspect", "gs://bkt/sets/ds"]);
    let err = emu.fails(&mut emu.command(&["read", "gs://nobkt/sets/ds"]));
    assert!(
        err.contains("gs://nobkt/sets/ds") && err.contains("bucket nobkt does not exist"),
        "{err}"
    );
    let err = emu.fails(&mut emu.command(&["inspect", "gs://bkt/sets/other"]));
    assert!(
        err.contains("gs://bkt/sets/other") && err.contains("nothing under this prefix"),
        "{err}"
    );
    let err = emu.fails(&mut emu.command(&["read", "gs://bkt/sets"]));
    assert!(err.contains("gs://bkt/sets") && err.contains("not a dataset"), "{err}");
}

#[test]
fn the_emulator_can_be_named_by_base_url_and_plain_http_must_be_allowed() {
    let Some(emu) = Emulator::start() else { return };
    let (_, local) = local_dataset(emu.root(), 40, "4", "8");
    emu.create_bucket("bkt");
    for (name, bytes) in dataset_files(&local) {
        emu.upload("bkt", &format!("sets/ds/{name}"), &bytes);
    }
    let base = format!("http://127.0.0.1:{}", emu.port);
    let inspect = || {
        let mut cmd = emu.command(&["inspect", "gs://bkt/sets/ds"]);
        cmd.env_remove("STORAGE_EMULATOR_HOST").env("GOOGLE_BASE_URL", &base);
        cmd
    };
    // object_store allows plain HTTP for GCS; brand asks, as it does for S3.
    let err = emu.fails(inspect().env("GOOGLE_SKIP_SIGNATURE", "true"));
    assert!(
        err.contains("plain HTTP") && err.contains("GOOGLE_ALLOW_HTTP") && err.contains("gs://bkt"),
        "{err}"
    );
    // Unsigned requests, or a service account key that disables OAuth (the
    // key is a placeholder: nothing is signed with it).
    let out = inspect()
        .env("GOOGLE_ALLOW_HTTP", "true")
        .env("GOOGLE_SKIP_SIGNATURE", "true")
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", stderr(&out));
    let key = r#"{"private_key": "", "private_key_id": "", "client_email": "", "disable_oauth": true}"#;
    let out = inspect()
        .env("GOOGLE_ALLOW_HTTP", "true")
        .env("GOOGLE_SERVICE_ACCOUNT_KEY", key)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("40"));
}
