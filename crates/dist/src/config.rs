//! The multi-node keys, read from the same TOML text as the loader's keys
//! (which are handed on to [`ConfigKeys`]) and from the launcher's
//! environment.
//!
//! ```toml
//! nodes = ["10.0.0.1:7070", "10.0.0.2:7070"]  # every node's address; this node is `rank`
//! remote_memory = "256MiB"  # pushed samples a node holds ahead of use (≥ the largest sample)
//! peer_timeout = "30s"      # a silent or unreachable peer is an error after this long
//! job = "resnet-run-7"      # nodes of different jobs refuse each other
//! ```
//!
//! Without `nodes`: `BRAND_NODES` ("a:p,b:p,…") with `RANK` (and, if set,
//! `WORLD_SIZE`, which must match), else `TF_CONFIG`'s worker list and task
//! index. Nothing at all: a single node, which listens nowhere.

use std::time::Duration;

use serde::Deserialize;

use brand_format::error::{Error, Result};
use brand_loader::LoaderConfig;
use brand_loader::config::ConfigKeys;

/// How this node finds and treats its peers.
#[derive(Debug, Clone, PartialEq)]
pub struct DistConfig {
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

/// The keys this module owns; everything else in the text is the loader's.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistKeys {
    pub nodes: Option<Vec<String>>,
    pub remote_memory: Option<String>,
    pub peer_timeout: Option<String>,
    pub job: Option<String>,
}

impl DistKeys {
    pub const NAMES: [&'static str; 4] = ["nodes", "remote_memory", "peer_timeout", "job"];
}

/// A loader configuration and a multi-node one from one TOML text, with the
/// process environment.
pub fn from_toml(text: &str) -> Result<(LoaderConfig, DistConfig)> {
    from_toml_with_env(text, &|k| std::env::var(k).ok())
}

/// [`from_toml`] with the environment given as a function (for tests).
pub fn from_toml_with_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<(LoaderConfig, DistConfig)> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| Error::config(format!("config: {}", e.message().trim())))?;
    from_table(table, env)
}

/// [`from_toml_with_env`] from parsed keys (a file's, with flags set on top).
pub fn from_table(mut table: toml::Table, env: &dyn Fn(&str) -> Option<String>) -> Result<(LoaderConfig, DistConfig)> {
    let bad = |e: toml::de::Error| Error::config(format!("config: {}", e.message().trim()));
    let mut dist = toml::Table::new();
    for k in DistKeys::NAMES {
        if let Some(v) = table.remove(k) {
            dist.insert(k.to_string(), v);
        }
    }
    let loader_keys: ConfigKeys = toml::Value::Table(table).try_into().map_err(bad)?;
    let dist_keys: DistKeys = toml::Value::Table(dist).try_into().map_err(bad)?;
    resolve(loader_keys, dist_keys, env)
}

/// Applies both key sets: the loader's world and rank follow the node list
/// (a `world` key that disagrees with it is an error).
pub fn resolve(
    loader_keys: ConfigKeys,
    keys: DistKeys,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(LoaderConfig, DistConfig)> {
    let explicit_world = loader_keys.world;
    let explicit_rank = loader_keys.rank;
    let mut loader = LoaderConfig::default();
    let (nodes, env_rank) = match keys.nodes {
        Some(n) => (n, None),
        None => nodes_from_env(env)?,
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
    for (i, n) in nodes.iter().enumerate() {
        if n.trim().is_empty() || !n.contains(':') {
            return Err(Error::config(format!("node {i} address {n:?}: expected host:port")));
        }
    }
    let remote_memory = match keys.remote_memory {
        Some(v) => {
            brand_format::units::parse_bytes(&v).map_err(|why| Error::config(format!("remote_memory {v:?}: {why}")))?
        }
        None => DEFAULT_REMOTE_MEMORY,
    };
    let peer_timeout = match keys.peer_timeout {
        Some(v) => parse_duration(&v)?,
        None => DEFAULT_PEER_TIMEOUT,
    };
    let job = keys
        .job
        .or_else(|| env("BRAND_JOB"))
        .unwrap_or_else(|| format!("brand:{}", nodes.join(",")));
    let dist = DistConfig {
        nodes,
        rank: loader.plan.rank,
        remote_memory,
        peer_timeout,
        job,
    };
    dist.check()?;
    Ok((loader, dist))
}

impl DistConfig {
    /// A single node: nothing listens, every sample is local.
    pub fn single() -> Self {
        DistConfig {
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
fn nodes_from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<(Vec<String>, Option<u32>)> {
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
        return Ok((nodes, int("RANK")?));
    }
    if let Some(text) = env("TF_CONFIG") {
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
        let tf: TfConfig =
            serde_json::from_str(&text).map_err(|e| Error::config(format!("environment TF_CONFIG: {e}")))?;
        let workers = tf.cluster.get("worker").cloned().unwrap_or_default();
        if workers.is_empty() {
            return Err(Error::config("environment TF_CONFIG: cluster has no \"worker\" list"));
        }
        if tf.task.kind != "worker" {
            return Err(Error::config(format!(
                "environment TF_CONFIG: task type {:?}, only workers read data",
                tf.task.kind
            )));
        }
        return Ok((workers, Some(tf.task.index)));
    }
    Ok((Vec::new(), None))
}

/// `"30s"`, `"500ms"`, `"2m"`, or plain seconds (`"1.5"`).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let bad = || Error::config(format!("duration {s:?}: expected e.g. \"30s\", \"500ms\", \"2m\""));
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let secs = v * scale;
    if !(secs.is_finite() && secs > 0.0 && secs <= 1e9) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
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
        assert_eq!(d.nodes[2], "c:3");
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
