//! brand's one configuration path: [`Config::resolve`] is the function
//! every entry point calls (`brand read`, `brand serve`, `brand pack
//! --partitions`, the C ABI, the TF op and Python), with a TOML text, the
//! flags or keywords given over it, and the launcher's environment. The
//! multi-node keys are taken out of the key table and parsed by the crate
//! that owns them ([`brand_nodes::config`], which documents them and how the
//! environment gives the nodes); the rest goes to
//! [`LoaderConfig::from_table`], which owns the loader's keys
//! (`brand_loader::config` lists them).

use brand_format::error::{Error, Result};
use brand_loader::LoaderConfig;
use brand_loader::config::{self as loader_keys, Value, parse_table};
use brand_nodes::NodeConfig;
use brand_nodes::config::{
    DEFAULT_PEER_TIMEOUT, DEFAULT_REMOTE_MEMORY, DEFAULT_TF_PORT_OFFSET, KEYS, NodeKeys, nodes_from_env,
};

/// A loader's configuration and the multi-node one: what an open needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub loader: LoaderConfig,
    pub nodes: NodeConfig,
}

/// The launcher's environment, as a lookup (tests pass their own).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// This process's environment.
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

impl Config {
    /// The one configuration path: the keys of the TOML `text`, `flags`
    /// over them (a command line's flags, Python's keywords), then the
    /// launcher's environment for the nodes where no key gives them. Every
    /// key is parsed and range-checked once, here or in the loader's
    /// [`LoaderConfig::set`]/[`LoaderConfig::check`].
    pub fn resolve(text: &str, flags: toml::Table, env: Env<'_>) -> Result<Config> {
        let mut table = parse_table(text)?;
        table.extend(flags);
        let keys = NodeKeys::take(&mut table)?;
        // Named here, not by the loader, so that the error lists every key.
        if let Some(k) = table.keys().find(|k| !loader_keys::KEYS.contains(&k.as_str())) {
            return Err(Error::config(format!(
                "unknown key `{k}`: expected one of {}, {}",
                loader_keys::KEYS.join(", "),
                KEYS.join(", ")
            )));
        }
        let (nodes, env_rank) = match keys.nodes {
            Some(n) => (n, None),
            None => nodes_from_env(env, keys.tf_port_offset.unwrap_or(DEFAULT_TF_PORT_OFFSET))?,
        };
        if !nodes.is_empty() {
            // World and rank follow the node list.
            let world = nodes.len() as u32;
            let given = |key: &str| -> Result<Option<u32>> {
                table.get(key).map(|value| Value { key, value }.whole()).transpose()
            };
            if let Some(w) = given("world")?
                && w != world
            {
                return Err(Error::config(format!("world {w} but {world} nodes are listed")));
            }
            let rank = given("rank")?.or(env_rank).unwrap_or(0);
            if rank >= world {
                return Err(Error::config(format!("rank {rank} out of range for {world} nodes")));
            }
            table.insert("world".into(), toml::Value::Integer(world.into()));
            table.insert("rank".into(), toml::Value::Integer(rank.into()));
        }
        let loader = LoaderConfig::from_table(&table)?;
        let job = keys
            .job
            .or_else(|| env("BRAND_JOB"))
            .unwrap_or_else(|| format!("brand:{}", nodes.join(",")));
        let nodes = NodeConfig {
            nodes,
            rank: loader.plan.rank,
            remote_memory: keys.remote_memory.unwrap_or(DEFAULT_REMOTE_MEMORY),
            peer_timeout: keys.peer_timeout.unwrap_or(DEFAULT_PEER_TIMEOUT),
            job,
            last_epoch: None,
        };
        Ok(Config { loader, nodes })
    }

    /// [`resolve`](Self::resolve) of a TOML text alone, with this process's
    /// environment.
    pub fn from_toml(text: &str) -> Result<Config> {
        Self::resolve(text, toml::Table::new(), &process_env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn from_toml_with_env(text: &str, env: Env<'_>) -> Result<(LoaderConfig, NodeConfig)> {
        Config::resolve(text, toml::Table::new(), env).map(|c| (c.loader, c.nodes))
    }

    #[test]
    fn flags_override_the_text_and_go_through_the_same_checks() {
        let mut flags = toml::Table::new();
        flags.insert("batch_size".into(), toml::Value::Integer(9));
        flags.insert("memory".into(), toml::Value::String("3 slots".into()));
        let c = Config::resolve("batch_size = 7\nseed = 4", flags, &no_env).expect("valid");
        assert_eq!((c.loader.batch_size, c.loader.plan.seed), (9, 4));
        assert_eq!(c.loader.plan.memory, brand_plan::Memory::Slots(3));
        let mut bad = toml::Table::new();
        bad.insert("queue_depth".into(), toml::Value::Integer(0));
        let e = Config::resolve("", bad, &no_env).expect_err("range").to_string();
        assert!(e.contains("queue_depth"), "{e}");
    }

    #[test]
    fn keys_split_between_loader_and_nodes() {
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
        assert_eq!((l.plan.rank, l.plan.world, l.batch_size), (2, 3, 7));
        assert_eq!(d.rank, 2);
        assert_eq!(d.nodes.len(), 3);
        assert_eq!(d.remote_memory, 1 << 20);
        assert_eq!(d.peer_timeout, Duration::from_millis(1500));
        assert_eq!(d.job, "j");
        let (l, d) = from_toml_with_env("", &no_env).expect("defaults");
        assert_eq!((l.plan.world, d.world(), d.nodes.len()), (1, 1, 0));
        let e = from_toml_with_env("remote_memroy = \"1MiB\"", &no_env)
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("remote_memroy"), "{e}");
        for key in brand_loader::config::KEYS.iter().chain(&KEYS) {
            assert!(e.contains(key), "{key} missing from: {e}");
        }
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
            ("nodes = [\"h:0\"]", "port"),
            ("nodes = [\"h:65536\"]", "65536"),
            ("nodes = [\":7\"]", "host:port"),
            ("nodes = 3", "nodes"),
            ("remote_memory = \"0\"", "remote_memory"),
            ("remote_memory = \"2TiB\"", "remote_memory"),
            ("peer_timeout = \"25h\"", "25h"),
            ("peer_timeout = \"90000s\"", "peer_timeout"),
            ("job = \"\"", "job"),
            ("tf_port_offset = 0", "tf_port_offset"),
            ("tf_port_offset = 65536", "tf_port_offset"),
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
