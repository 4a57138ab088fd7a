//! `brand serve` on a real network: three nodes, each in a network
//! namespace of its own made by `scripts/netns.py` (veth links shaped by
//! `tc tbf` at 1 Gbit/s with 0.1 % packet loss, and a relay adding 1 ms of
//! round trip). They serve two epochs over it, then stop together after a
//! few batches; every sample pushed crosses the shaped links. Needs root
//! (and python3): skipped, saying so, otherwise. The network goes when the
//! test ends, however it ends: netns.py tears it down when its stdin closes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use brand_import::synthetic::small_dataset;

const SAMPLES: u64 = 900;

fn netns_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns.py")
}

/// Why this machine cannot run the test, if it cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (ip netns, tc)".into());
    }
    for tool in ["ip", "tc", "python3"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("needs {tool}"));
        }
    }
    None
}

/// The network while it lives: dropping it closes netns.py's stdin, which
/// deletes every namespace it made.
struct Network {
    child: Child,
    stdin: Option<ChildStdin>,
    prefix: String,
    nodes: Vec<String>,
    namespaces: Vec<String>,
}

impl Network {
    fn up() -> Network {
        let mut child = Command::new("python3")
            .arg(netns_script())
            .args([
                "up",
                "--nodes",
                "3",
                "--rate",
                "1gbit",
                "--delay-ms",
                "0.5",
                "--loss",
                "0.1",
                "--port",
                "7070",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("netns.py");
        let stdin = child.stdin.take();
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("netns.py's JSON line");
        let info: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("netns.py up: {e}: {line:?}"));
        let strings = |k: &str| -> Vec<String> {
            info[k]
                .as_array()
                .expect("list")
                .iter()
                .map(|v| v.as_str().expect("string").to_string())
                .collect()
        };
        Network {
            prefix: info["prefix"].as_str().expect("prefix").to_string(),
            nodes: strings("nodes"),
            namespaces: strings("node_namespaces"),
            child,
            stdin,
        }
    }

    /// Bytes the links carried from the nodes towards the relay, and
    /// packets they dropped.
    fn link_totals(&self) -> (u64, u64) {
        let out = Command::new("python3")
            .arg(netns_script())
            .args(["stats", &self.prefix])
            .output()
            .expect("netns.py stats");
        let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
        let links = stats.as_object().expect("per node");
        let sum = |dir: &str, key: &str| {
            links
                .values()
                .map(|l| l[dir][key].as_u64().expect("count"))
                .sum::<u64>()
        };
        (sum("up", "bytes"), sum("up", "dropped") + sum("down", "dropped"))
    }

    fn serve(&self, ds: &Path, rank: usize, extra: &[&str]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.namespaces[rank]])
            .arg(env!("CARGO_BIN_EXE_brand"))
            .arg("serve")
            .arg(ds)
            .args(["--nodes", &self.nodes.join(","), "--rank", &rank.to_string()])
            .args([
                "--memory",
                "64 slots",
                "--batch",
                "8",
                "--peer-timeout",
                "10s",
                "--json",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ip netns exec brand serve")
    }

    fn close(mut self) -> Vec<String> {
        self.stdin.take();
        let start = Instant::now();
        while self.child.try_wait().expect("wait").is_none() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let list = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .filter(|l| l.starts_with(&format!("{}-", self.prefix)))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Closing stdin is the signal; wait for the teardown.
        self.stdin.take();
        let _ = self.child.wait();
    }
}

/// Every node's report, or the first failure.
fn reports(children: Vec<Child>) -> Vec<serde_json::Value> {
    children
        .into_iter()
        .enumerate()
        .map(|(rank, c)| {
            let out = c.wait_with_output().expect("output");
            assert!(
                out.status.success(),
                "rank {rank}: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).expect("json")
        })
        .collect()
}

#[test]
fn three_serve_processes_in_network_namespaces_over_shaped_lossy_links() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let t = tempfile::tempdir().expect("tempdir");
    let ds = small_dataset(t.path(), SAMPLES).expect("gen and pack");
    let net = Network::up();
    let (wire_before, _) = net.link_totals();
    let children = (0..3).map(|r| net.serve(&ds, r, &["--epochs", "2"])).collect();
    let mut pushed = 0;
    for (rank, r) in reports(children).iter().enumerate() {
        for e in r["epochs"].as_array().expect("epochs") {
            assert_eq!(e["samples"], SAMPLES / 3, "rank {rank}");
        }
        let m = &r["closed"];
        assert!(
            m["samples_received"].as_u64().expect("received") > 0,
            "rank {rank}: {m}"
        );
        pushed += m["bytes_pushed"].as_u64().expect("pushed");
    }
    let (wire, _) = net.link_totals();
    // Every pushed byte went over the links (plus framing, headers, retransmissions).
    assert!(
        wire - wire_before >= pushed,
        "links carried {} bytes, {pushed} pushed",
        wire - wire_before
    );
    // All stopping after 5 batches, as a job stopped at a step.
    let children = (0..3)
        .map(|r| net.serve(&ds, r, &["--epochs", "2", "--batches", "5"]))
        .collect();
    for (rank, r) in reports(children).iter().enumerate() {
        assert_eq!(r["epochs"][0]["samples"], 40, "rank {rank}");
    }
    let left = net.close();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}
