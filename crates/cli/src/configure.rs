//! A command's configuration: its `--config` file with its flags over it,
//! resolved by the one configuration path (`brand_reader::Config::resolve`).

use std::path::Path;

use brand_format::{Error, Result};
use brand_reader::Config;
use brand_reader::config::{Env, process_env};

/// A flag's value as the key table holds it.
pub enum Flag<'a> {
    Int(Option<u64>),
    Text(&'a Option<String>),
    Bool(bool),
    List(&'a [String]),
}

/// The configuration of `file` (none: the defaults) with `flags` over it,
/// and the launcher's environment when `with_env`.
pub fn resolve(file: Option<&Path>, flags: &[(&str, Flag<'_>)], with_env: bool) -> Result<Config> {
    let text = match file {
        Some(p) => std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?,
        None => String::new(),
    };
    let mut table = toml::Table::new();
    for (key, flag) in flags {
        let value = match flag {
            Flag::Int(Some(n)) => {
                let n = i64::try_from(*n).map_err(|_| Error::config(format!("--{key} {n} is out of range")))?;
                toml::Value::Integer(n)
            }
            Flag::Text(Some(s)) => toml::Value::String(s.clone()),
            Flag::Bool(b) => toml::Value::Boolean(*b),
            Flag::List(l) if !l.is_empty() => toml::Value::Array(l.iter().cloned().map(toml::Value::String).collect()),
            _ => continue,
        };
        table.insert(key.to_string(), value);
    }
    let no_env = |_: &str| None;
    let env: Env<'_> = if with_env { &process_env } else { &no_env };
    Config::resolve(&text, table, env).map_err(|e| match (file, e) {
        (Some(p), Error::Config(why)) => Error::config(format!("{}: {why}", p.display())),
        (_, e) => e,
    })
}

/// How requests to object storage are bounded and retried, as flags of the
/// commands that reach a store (a dataset or a pack's inputs at a URL):
/// the loader's keys `stall_timeout` and `retries`, read as every
/// configuration is and turned into the store's policy there.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct StoreFlags {
    /// A URL: time without a byte before a request is retried ("10s",
    /// "500ms" or seconds; default 10s).
    #[arg(long, value_name = "DURATION")]
    stall_timeout: Option<String>,
    /// A URL: retries of one request before its error (default 10).
    #[arg(long, value_name = "N")]
    retries: Option<u64>,
}

impl StoreFlags {
    /// The flags as configuration keys, for a command that resolves more.
    pub fn keys(&self) -> [(&'static str, Flag<'_>); 2] {
        [
            ("stall_timeout", Flag::Text(&self.stall_timeout)),
            ("retries", Flag::Int(self.retries)),
        ]
    }

    /// The store's policy these flags make.
    pub fn policy(&self) -> Result<brand_store::GetPolicy> {
        Ok(resolve(None, &self.keys(), false)?.loader.io.store.get_policy())
    }
}
