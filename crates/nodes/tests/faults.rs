//! Peers that are not nodes of this job: a port already taken, a peer that
//! speaks plain HTTP, one that accepts and never answers, one with another
//! dataset. Each is an error naming the node, on every node, within
//! `peer_timeout` (plus slack for two loaded cores).

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::LoaderState;
use brand_nodes::NodeLoader;
use common::Config;

mod common;
use common::{addresses, node_config};

const TIMEOUT: Duration = Duration::from_secs(2);
const SLACK: Duration = Duration::from_secs(4);

fn dataset(root: &std::path::Path, samples: u64) -> Arc<Dataset> {
    Arc::new(Dataset::open(small_dataset(root, samples).expect("gen and pack")).expect("open"))
}

fn config(nodes: &[String], rank: u32) -> Config {
    let mut cfg = node_config(nodes, rank, "faults");
    cfg.nodes.peer_timeout = TIMEOUT;
    cfg
}

/// Opens node `rank` and serves an epoch; the error and how long it took.
fn node_error(ds: Arc<Dataset>, cfg: Config) -> (String, Duration) {
    let start = Instant::now();
    let r = NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default()).and_then(|mut l| {
        while l.next_batch()?.is_some() {}
        Ok(())
    });
    match r {
        Ok(()) => ("no error".into(), start.elapsed()),
        Err(e) => (e.to_string(), start.elapsed()),
    }
}

/// Node 0 of 2 alone against `peer` (a listener on node 1's address that
/// `serve` handles): its error names node 1, within the timeout.
fn against(peer: std::net::TcpListener, serve: impl FnOnce(std::net::TcpListener) + Send + 'static) -> String {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 300);
    let nodes = vec![addresses(1).remove(0), peer.local_addr().expect("addr").to_string()];
    std::thread::spawn(move || serve(peer));
    let (e, took) = node_error(ds, config(&nodes, 0));
    assert!(e.contains(&format!("node 1 ({})", nodes[1])), "{e}");
    assert!(took < TIMEOUT + SLACK, "took {took:?}: {e}");
    e
}

fn listener() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind")
}

#[test]
fn a_peer_that_accepts_and_never_answers_is_named() {
    against(listener(), |l| {
        let mut held = Vec::new();
        // Accept, read what comes and say nothing, until the test ends.
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
}

#[test]
fn a_peer_that_never_accepts_is_named() {
    // The kernel completes the connection (backlog); nobody reads it.
    against(listener(), |l| {
        std::thread::sleep(TIMEOUT + SLACK + SLACK);
        drop(l);
    });
}

#[test]
fn a_peer_speaking_plain_http_is_named() {
    against(listener(), |l| {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
}

#[test]
fn a_port_in_use_is_named_on_every_node() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 300);
    // Node 1's port is taken by something that never answers.
    let taken = listener();
    let nodes = vec![addresses(1).remove(0), taken.local_addr().expect("addr").to_string()];
    let handles: Vec<_> = (0..2)
        .map(|r| {
            let (ds, cfg) = (ds.clone(), config(&nodes, r));
            std::thread::spawn(move || node_error(ds, cfg))
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let (e, took) = h.join().expect("thread");
        assert!(e.contains(&format!("node 1 ({})", nodes[1])), "rank {rank}: {e}");
        assert!(took < TIMEOUT + SLACK, "rank {rank} took {took:?}: {e}");
    }
    drop(taken);
}

#[test]
fn a_peer_with_another_dataset_is_named_on_every_node() {
    let t = tempfile::tempdir().expect("tempdir");
    let a = dataset(&t.path().join("a"), 300);
    let b = dataset(&t.path().join("b"), 330);
    let nodes = addresses(2);
    let handles: Vec<_> = [a, b]
        .into_iter()
        .enumerate()
        .map(|(r, ds)| {
            let cfg = config(&nodes, r as u32);
            std::thread::spawn(move || node_error(ds, cfg))
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let (e, took) = h.join().expect("thread");
        let other = 1 - rank;
        assert!(
            e.contains(&format!("node {other} ({})", nodes[other])),
            "rank {rank}: {e}"
        );
        assert!(e.contains("dataset fingerprint"), "rank {rank}: {e}");
        assert!(took < TIMEOUT + SLACK, "rank {rank} took {took:?}: {e}");
    }
}

/// Node 2 lists another address for itself than nodes 0 and 1 list for it
/// (a typo in one launcher's list). With one job name the lists' digests
/// differ; with the default job (made of the list) the jobs do. Either way
/// every node fails within the timeout: nodes 0 and 1 naming node 2 (never
/// reachable where they look for it, or refused for its list), node 2 saying
/// the node lists differ.
#[test]
fn node_lists_that_differ_are_named_on_every_node() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 300);
    for same_job in [true, false] {
        let listed = addresses(3);
        let mut other = listed.clone();
        other[2] = addresses(1).remove(0);
        let handles: Vec<_> = (0..3u32)
            .map(|r| {
                let list = if r == 2 { &other } else { &listed };
                let mut cfg = config(list, r);
                if !same_job {
                    cfg.nodes.job = format!("brand:{}", list.join(","));
                }
                let ds = ds.clone();
                std::thread::spawn(move || node_error(ds, cfg))
            })
            .collect();
        for (rank, h) in handles.into_iter().enumerate() {
            let (e, took) = h.join().expect("thread");
            if rank < 2 {
                assert!(
                    e.contains(&format!("node 2 ({})", listed[2])),
                    "same job {same_job}: rank {rank}: {e}"
                );
            } else {
                assert!(e.contains("nodes ["), "same job {same_job}: rank 2: {e}");
            }
            assert!(
                took < TIMEOUT + SLACK,
                "same job {same_job}: rank {rank} took {took:?}: {e}"
            );
        }
    }
}
