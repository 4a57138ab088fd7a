//! The multi-node keys, which this crate owns: [`NodeKeys::take`] takes them
//! out of a key table, parses and range-checks them, and the entry crate's
//! configuration path (`brand_reader::Config::resolve`) builds the
//! [`NodeConfig`] from them and the launcher's environment
//! ([`nodes_from_env`]). The keys:
//!
//! ```toml
//! nodes = ["10.0.0.1:7070", "10.0.0.2:7070"]  # every node's host:port by rank, 1..=65536 of them
//! remote_memory = "256MiB"  # pushed samples a node holds ahead of use, 1 byte..=1TiB (≥ the largest sample)
//! peer_timeout = "30s"      # a silent or unreachable peer is an error after this, (0s, 24h]
//! job = "resnet-run-7"      # nodes of different jobs refuse each other; 1..=256 bytes
//! tf_port_offset = 1000     # with TF_CONFIG: brand listens on each worker's port + this, 1..=65535
//! ```
//!
//! With 2 or more nodes this process is node `rank` of a job; `world` and
//! `rank` then follow the node list. Without `nodes`: `BRAND_NODES`
//! ("a:p,b:p,…") with `RANK` (and, if set, `WORLD_SIZE`, which must match),
//! else `TF_CONFIG`: the nodes are the cluster's `chief` (if any) then its
//! `worker`s, in TensorFlow's task order (chief 0, worker i → i + 1 with a
//! chief), each at its TensorFlow port + `tf_port_offset` (default
//! [`DEFAULT_TF_PORT_OFFSET`]): TensorFlow's own server already listens on
//! the port itself. Nothing at all: a single node, which listens nowhere.

use std::time::Duration;

use serde::Deserialize;

use brand_format::error::{Error, Result};
use brand_loader::config::Value;

/// How this node finds and treats its peers.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// Every node's `host:port`, by rank. One entry (or none): single node.
    pub nodes: Vec<String>,
    /// This node's index in `nodes` (the loader's `rank`).
    pub rank: u32,
    /// Bytes of pushed samples a consumer holds ahead of use.
    pub remote_memory: u64,
    pub peer_timeout: Duration,
    pub job: String,
    /// The job's last epoch, where it knows it (`brand serve --epochs`; no
    /// key: a training loop decides when to stop). A node credits the next
    /// epoch's first steps early, while it finishes the current one, so
    /// that epoch starts without waiting; none after `last_epoch`. Without
    /// it, a job that stops at an epoch's end has up to `remote_memory` per
    /// node pushed (and read by its owners) for an epoch it never serves.
    pub last_epoch: Option<u64>,
}

pub const DEFAULT_REMOTE_MEMORY: u64 = 256 << 20;
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// brand's port for a `TF_CONFIG` task: its TensorFlow port plus this
/// (large enough to clear hand-written configs of consecutive ports).
pub const DEFAULT_TF_PORT_OFFSET: u16 = 1000;

/// The multi-node keys of a key table, parsed and range-checked; `None`
/// where the key was not given.
#[derive(Debug, Default)]
pub struct NodeKeys {
    pub nodes: Option<Vec<String>>,
    pub remote_memory: Option<u64>,
    pub peer_timeout: Option<Duration>,
    pub job: Option<String>,
    pub tf_port_offset: Option<u16>,
}

/// The multi-node keys, in the order [`NodeKeys`] lists them.
pub const KEYS: [&str; 5] = ["nodes", "remote_memory", "peer_timeout", "job", "tf_port_offset"];

const MAX_NODES: usize = 1 << 16;
const MAX_REMOTE_MEMORY: u64 = 1 << 40;
const MAX_PEER_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
const MAX_JOB_BYTES: usize = 256;

impl NodeKeys {
    /// Takes the multi-node keys out of `table`, leaving the loader's.
    pub fn take(table: &mut toml::Table) -> Result<Self> {
        Ok(NodeKeys {
            nodes: take_key(table, "nodes", |v| {
                let value = v.value;
                let list = value
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|v| v.as_str().map(str::to_string))
                            .collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| {
                        Error::config(format!("nodes = {value}: expected a list of \"host:port\" strings"))
                    })?;
                check_listed(&list).map_err(|why| Error::config(format!("nodes: {why}")))?;
                Ok(list)
            })?,
            remote_memory: take_key(table, "remote_memory", |v| {
                let b = v.bytes()?;
                if !(1..=MAX_REMOTE_MEMORY).contains(&b) {
                    return Err(Error::config(format!(
                        "remote_memory {} outside 1 byte..=1TiB",
                        v.value
                    )));
                }
                Ok(b)
            })?,
            peer_timeout: take_key(table, "peer_timeout", |v| {
                let d = v.duration()?;
                if d > MAX_PEER_TIMEOUT {
                    return Err(Error::config(format!("peer_timeout {} outside (0s, 24h]", v.value)));
                }
                Ok(d)
            })?,
            job: take_key(table, "job", |v| {
                let j = v.text()?;
                if !(1..=MAX_JOB_BYTES).contains(&j.len()) {
                    return Err(Error::config(format!("job {j:?}: {} bytes, expected 1..=256", j.len())));
                }
                Ok(j.to_string())
            })?,
            tf_port_offset: take_key(table, "tf_port_offset", |v| {
                let v: i64 = v.whole()?;
                u16::try_from(v)
                    .ok()
                    .filter(|&o| o > 0)
                    .ok_or_else(|| Error::config(format!("tf_port_offset {v} outside 1..=65535")))
            })?,
        })
    }
}

/// Removes `key` from `table` and, if it was there, parses it with `parse`
/// (which sees it as the loader's [`Value`], for the same error messages).
fn take_key<T>(table: &mut toml::Table, key: &str, parse: impl FnOnce(Value<'_>) -> Result<T>) -> Result<Option<T>> {
    table
        .remove(key)
        .map(|value| parse(Value { key, value: &value }))
        .transpose()
}

/// The checks every node list gets (the key's or the environment's): at
/// most 65536 entries, each `host:port` with a port in 1..=65535 (IPv6
/// hosts in brackets).
fn check_listed(nodes: &[String]) -> std::result::Result<(), String> {
    if nodes.len() > MAX_NODES {
        return Err(format!("{} listed, at most 65536", nodes.len()));
    }
    for (i, a) in nodes.iter().enumerate() {
        let why = match a.rsplit_once(':') {
            None => Some("expected host:port".to_string()),
            Some((host, _)) if host.trim().is_empty() || host != host.trim() => Some("expected host:port".into()),
            Some((_, port)) => match port.parse::<u16>() {
                Ok(p) if p > 0 => None,
                _ => Some(format!("port {port:?} outside 1..=65535")),
            },
        };
        if let Some(why) = why {
            return Err(format!("node {i} address {a:?}: {why}"));
        }
    }
    Ok(())
}

impl NodeConfig {
    /// A single node: nothing listens, every sample is local.
    pub fn single() -> Self {
        NodeConfig {
            nodes: Vec::new(),
            rank: 0,
            remote_memory: DEFAULT_REMOTE_MEMORY,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            job: "brand".into(),
            last_epoch: None,
        }
    }

    pub fn world(&self) -> u32 {
        self.nodes.len().max(1) as u32
    }

    /// `node R (host:port)`, for messages.
    pub fn name(&self, node: u32) -> String {
        match self.nodes.get(node as usize) {
            Some(a) => format!("node {node} ({a})"),
            None => format!("node {node}"),
        }
    }
}

/// `BRAND_NODES` + `RANK` (+ `WORLD_SIZE`), else `TF_CONFIG`; none: no
/// nodes. The nodes, and this process's rank where the environment says.
pub fn nodes_from_env(env: &dyn Fn(&str) -> Option<String>, tf_port_offset: u16) -> Result<(Vec<String>, Option<u32>)> {
    let int = |key: &str| -> Result<Option<u32>> {
        env(key)
            .map(|v| {
                v.trim()
                    .parse::<u32>()
                    .map_err(|_| Error::config(format!("environment {key}={v:?} is not a number")))
            })
            .transpose()
    };
    if let Some(list) = env("BRAND_NODES") {
        let nodes: Vec<String> = list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(w) = int("WORLD_SIZE")?
            && w as usize != nodes.len()
        {
            return Err(Error::config(format!(
                "WORLD_SIZE={w} but BRAND_NODES lists {} nodes",
                nodes.len()
            )));
        }
        check_listed(&nodes).map_err(|why| Error::config(format!("environment BRAND_NODES: {why}")))?;
        return Ok((nodes, int("RANK")?));
    }
    if let Some(text) = env("TF_CONFIG") {
        return tf_config_nodes(&text, tf_port_offset);
    }
    Ok((Vec::new(), None))
}

/// The nodes of a `TF_CONFIG` cluster (chief, then workers) at brand's
/// ports, and this task's rank among them.
fn tf_config_nodes(text: &str, offset: u16) -> Result<(Vec<String>, Option<u32>)> {
    #[derive(Deserialize)]
    struct Task {
        #[serde(rename = "type")]
        kind: String,
        index: u32,
    }
    #[derive(Deserialize)]
    struct TfConfig {
        cluster: std::collections::HashMap<String, Vec<String>>,
        task: Task,
    }
    let bad = |why: String| Error::config(format!("environment TF_CONFIG: {why}"));
    let tf: TfConfig = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let chiefs = tf.cluster.get("chief").cloned().unwrap_or_default();
    let workers = tf.cluster.get("worker").cloned().unwrap_or_default();
    if chiefs.len() > 1 {
        return Err(bad(format!("{} chiefs; TensorFlow has at most one", chiefs.len())));
    }
    if chiefs.is_empty() && workers.is_empty() {
        return Err(bad("cluster has no \"chief\" or \"worker\" list".into()));
    }
    let (kind, index) = (tf.task.kind.as_str(), tf.task.index);
    let rank = match kind {
        "chief" if index == 0 && !chiefs.is_empty() => 0,
        "worker" if (index as usize) < workers.len() => index + chiefs.len() as u32,
        "chief" | "worker" => return Err(bad(format!("task {kind} {index} is not in the cluster"))),
        _ => {
            return Err(bad(format!("task type {kind:?}: only the chief and workers read data")));
        }
    };
    let mut nodes = Vec::with_capacity(chiefs.len() + workers.len());
    for a in chiefs.iter().chain(&workers) {
        let (host, port) = a
            .rsplit_once(':')
            .ok_or_else(|| bad(format!("task address {a:?}: expected host:port")))?;
        let port: u16 = port
            .parse()
            .map_err(|_| bad(format!("task address {a:?}: port {port:?} is not a port")))?;
        let ours = port.checked_add(offset).ok_or_else(|| {
            bad(format!(
                "task address {a:?}: port {port} + tf_port_offset {offset} is past 65535"
            ))
        })?;
        nodes.push(format!("{host}:{ours}"));
    }
    check_listed(&nodes).map_err(|why| Error::config(format!("environment TF_CONFIG: {why}")))?;
    Ok((nodes, Some(rank)))
}
