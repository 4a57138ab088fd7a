//! The multi-node configuration: the keys of the one key table
//! (`brand_loader::config`, where every key is documented and range-checked)
//! resolved with the launcher's environment.
//!
//! Without `nodes`: `BRAND_NODES` ("a:p,b:p,…") with `RANK` (and, if set,
//! `WORLD_SIZE`, which must match), else `TF_CONFIG`: the nodes are the
//! cluster's `chief` (if any) then its `worker`s, in TensorFlow's task order
//! (chief 0, worker i → i + 1 with a chief), each at its TensorFlow port +
//! `tf_port_offset` (default [`DEFAULT_TF_PORT_OFFSET`]): TensorFlow's own
//! server already listens on the port itself. Nothing at all: a single node,
//! which listens nowhere.

use std::time::Duration;

use serde::Deserialize;

use brand_format::error::{Error, Result};
use brand_loader::LoaderConfig;
pub use brand_loader::config::parse_duration;
use brand_loader::config::{ConfigKeys, NodeKeys};

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
}

pub const DEFAULT_REMOTE_MEMORY: u64 = 256 << 20;
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// brand's port for a `TF_CONFIG` task: its TensorFlow port plus this
/// (large enough to clear hand-written configs of consecutive ports).
pub const DEFAULT_TF_PORT_OFFSET: u16 = 1000;

/// A loader configuration and a multi-node one from one TOML text, with the
/// process environment.
pub fn from_toml(text: &str) -> Result<(LoaderConfig, NodeConfig)> {
    from_toml_with_env(text, &|k| std::env::var(k).ok())
}

/// [`from_toml`] with the environment given as a function (for tests).
pub fn from_toml_with_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<(LoaderConfig, NodeConfig)> {
    resolve_keys(ConfigKeys::from_toml(text)?, env)
}

/// [`from_toml_with_env`] from parsed keys (a file's, with flags set on top).
pub fn from_table(table: toml::Table, env: &dyn Fn(&str) -> Option<String>) -> Result<(LoaderConfig, NodeConfig)> {
    let keys: ConfigKeys = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| Error::config(format!("config: {}", e.message().trim())))?;
    resolve_keys(keys, env)
}

/// Splits the keys into the loader's and the multi-node ones, and resolves them.
pub fn resolve_keys(mut keys: ConfigKeys, env: &dyn Fn(&str) -> Option<String>) -> Result<(LoaderConfig, NodeConfig)> {
    let node_keys = keys.take_nodes()?;
    resolve(keys, node_keys, env)
}

/// Applies both key sets: the loader's world and rank follow the node list
/// (a `world` key that disagrees with it is an error).
pub fn resolve(
    loader_keys: ConfigKeys,
    keys: NodeKeys,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(LoaderConfig, NodeConfig)> {
    let explicit_world = loader_keys.world;
    let explicit_rank = loader_keys.rank;
    let mut loader = LoaderConfig::default();
    let (nodes, env_rank) = match keys.nodes {
        Some(n) => (n, None),
        None => nodes_from_env(env, keys.tf_port_offset.unwrap_or(DEFAULT_TF_PORT_OFFSET))?,
    };
    let rank = explicit_rank.or(env_rank).unwrap_or(0);
    let world = nodes.len().max(1) as u32;
    if let Some(w) = explicit_world
        && !nodes.is_empty()
        && w != world
    {
        return Err(Error::config(format!("world {w} but {world} nodes are listed")));
    }
    if !nodes.is_empty() && rank >= world {
        return Err(Error::config(format!("rank {rank} out of range for {world} nodes")));
    }
    let mut loader_keys = loader_keys;
    if !nodes.is_empty() {
        loader_keys.world = Some(world);
        loader_keys.rank = Some(rank);
    }
    loader_keys.apply(&mut loader)?;
    let job = keys
        .job
        .or_else(|| env("BRAND_JOB"))
        .unwrap_or_else(|| format!("brand:{}", nodes.join(",")));
    let dist = NodeConfig {
        nodes,
        rank: loader.plan.rank,
        remote_memory: keys.remote_memory.unwrap_or(DEFAULT_REMOTE_MEMORY),
        peer_timeout: keys.peer_timeout.unwrap_or(DEFAULT_PEER_TIMEOUT),
        job,
    };
    dist.check()?;
    Ok((loader, dist))
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

    pub fn check(&self) -> Result<()> {
        if self.remote_memory == 0 {
            return Err(Error::config("remote_memory must be at least 1 byte"));
        }
        if self.peer_timeout.is_zero() || self.peer_timeout > Duration::from_secs(24 * 3600) {
            return Err(Error::config(format!(
                "peer_timeout {:?} outside (0s, 24h]",
                self.peer_timeout
            )));
        }
        if self.nodes.len() > 1 && self.rank as usize >= self.nodes.len() {
            return Err(Error::config(format!(
                "rank {} out of range for {} nodes",
                self.rank,
                self.nodes.len()
            )));
        }
        Ok(())
    }
}

/// `BRAND_NODES` + `RANK` (+ `WORLD_SIZE`), else `TF_CONFIG`; none: no nodes.
fn nodes_from_env(env: &dyn Fn(&str) -> Option<String>, tf_port_offset: u16) -> Result<(Vec<String>, Option<u32>)> {
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
        check_listed(&nodes, "BRAND_NODES")?;
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
    check_listed(&nodes, "TF_CONFIG")?;
    Ok((nodes, Some(rank)))
}

/// The checks the `nodes` key gets, for a list from the environment.
fn check_listed(nodes: &[String], from: &str) -> Result<()> {
    let mut keys = ConfigKeys {
        nodes: Some(nodes.to_vec()),
        ..Default::default()
    };
    keys.take_nodes()
        .map(drop)
        .map_err(|e| Error::config(format!("environment {from}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn keys_split_between_loader_and_dist() {
        let (l, d) = from_toml_with_env(
            r#"nodes = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
               rank = 2
               batch_size = 7
               remote_memory = "1MiB"
               peer_timeout = "1500ms"
               job = "j""#,
            &no_env,
        )
        .expect("valid");
        assert_eq!((l.plan.rank, l.plan.world, l.io.batch_size), (2, 3, 7));
        assert_eq!(d.rank, 2);
        assert_eq!(d.nodes.len(), 3);
        assert_eq!(d.remote_memory, 1 << 20);
        assert_eq!(d.peer_timeout, Duration::from_millis(1500));
        assert_eq!(d.job, "j");
        let (l, d) = from_toml_with_env("", &no_env).expect("defaults");
        assert_eq!((l.plan.world, d.world(), d.nodes.len()), (1, 1, 0));
    }

    #[test]
    fn environment_gives_the_peers() {
        let env = |k: &str| match k {
            "BRAND_NODES" => Some("h:1,h:2".to_string()),
            "RANK" => Some("1".to_string()),
            "WORLD_SIZE" => Some("2".to_string()),
            _ => None,
        };
        let (l, d) = from_toml_with_env("", &env).expect("valid");
        assert_eq!((l.plan.rank, l.plan.world, d.rank), (1, 2, 1));
        let tf = |k: &str| {
            (k == "TF_CONFIG")
                .then(|| r#"{"cluster":{"worker":["a:1","b:2","c:3"]},"task":{"type":"worker","index":2}}"#.to_string())
        };
        let (l, d) = from_toml_with_env("", &tf).expect("valid");
        assert_eq!((l.plan.rank, l.plan.world), (2, 3));
        assert_eq!(
            d.nodes,
            ["a:1001", "b:1002", "c:1003"],
            "TF's ports + the default offset"
        );
        let (_, d) = from_toml_with_env("tf_port_offset = 5", &tf).expect("valid");
        assert_eq!(d.nodes[2], "c:8");
    }

    #[test]
    fn tf_config_orders_the_chief_first_and_refuses_what_cannot_be_a_node() {
        let env = |text: &'static str| move |k: &str| (k == "TF_CONFIG").then(|| text.to_string());
        let chief = r#"{"cluster":{"chief":["c:10"],"worker":["w:20","w:30"]},"task":{"type":"worker","index":1}}"#;
        let (l, d) = from_toml_with_env("", &env(chief)).expect("valid");
        assert_eq!((l.plan.rank, l.plan.world), (2, 3));
        assert_eq!(d.nodes, ["c:1010", "w:1020", "w:1030"]);
        let is_chief = r#"{"cluster":{"chief":["c:10"],"worker":["w:20"]},"task":{"type":"chief","index":0}}"#;
        assert_eq!(from_toml_with_env("", &env(is_chief)).expect("valid").1.rank, 0);
        for (text, word) in [
            (
                r#"{"cluster":{"worker":["w:20"],"ps":["p:1"]},"task":{"type":"ps","index":0}}"#,
                "\"ps\"",
            ),
            (
                r#"{"cluster":{"worker":["w:20"]},"task":{"type":"worker","index":1}}"#,
                "worker 1",
            ),
            (
                r#"{"cluster":{"worker":["w:65000"]},"task":{"type":"worker","index":0}}"#,
                "past 65535",
            ),
            (
                r#"{"cluster":{"worker":["w"]},"task":{"type":"worker","index":0}}"#,
                "host:port",
            ),
            (
                r#"{"cluster":{},"task":{"type":"worker","index":0}}"#,
                "no \"chief\" or \"worker\"",
            ),
            ("not json", "TF_CONFIG"),
        ] {
            let e = from_toml_with_env("", &env(text)).expect_err(text).to_string();
            assert!(e.contains(word), "{text}: {e}");
        }
    }

    #[test]
    fn bad_keys_are_named() {
        for (text, word) in [
            ("nodes = [\"a:1\", \"b:2\"]\nworld = 3", "world 3"),
            ("nodes = [\"a:1\", \"b:2\"]\nrank = 2", "rank 2"),
            ("nodes = [\"nohost\"]", "nohost"),
            ("remote_memory = \"lots\"", "remote_memory"),
            ("peer_timeout = \"soon\"", "soon"),
            ("peer_timeout = \"0s\"", "0s"),
            ("bogus = 1", "bogus"),
            ("batch_size = 0", "batch_size"),
        ] {
            let e = from_toml_with_env(text, &no_env).expect_err(text).to_string();
            assert!(e.contains(word), "{text}: {e}");
        }
        let bad_env = |k: &str| match k {
            "BRAND_NODES" => Some("h:1,h:2".to_string()),
            "WORLD_SIZE" => Some("3".to_string()),
            _ => None,
        };
        let e = from_toml_with_env("", &bad_env).expect_err("mismatch").to_string();
        assert!(e.contains("WORLD_SIZE"), "{e}");
    }
}
