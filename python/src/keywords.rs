//! Python keywords as brand's key table: they go through
//! `brand_reader::Config::resolve`, the one configuration path, so they are
//! checked and reported as a TOML file's keys or the CLI's flags are.

use brand_format::error::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// The keywords as a key table: int → Integer, str → String, bool →
/// Boolean, float → Float, a list or tuple of str → Array; `None` means
/// "not given" (the default, or what the environment says). Any other
/// value is a config error naming its key.
pub fn table(config: Option<&Bound<'_, PyDict>>) -> Result<toml::Table, Error> {
    let mut table = toml::Table::new();
    let Some(config) = config else {
        return Ok(table);
    };
    for (key, value) in config.iter() {
        let key: String = key
            .extract()
            .map_err(|_| Error::config(format!("keyword {key}: not a string")))?;
        if let Some(v) = value_of(&key, &value)? {
            table.insert(key, v);
        }
    }
    Ok(table)
}

fn value_of(key: &str, value: &Bound<'_, PyAny>) -> Result<Option<toml::Value>, Error> {
    if value.is_none() {
        return Ok(None);
    }
    // bool before int: Python's bool is an int.
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(Some(toml::Value::Boolean(b.is_true())));
    }
    if value.is_instance_of::<PyInt>() {
        let n: i64 = value
            .extract()
            .map_err(|_| Error::config(format!("{key} = {value}: outside the range of a 64-bit integer")))?;
        return Ok(Some(toml::Value::Integer(n)));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(Some(toml::Value::Float(f.value())));
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(Some(toml::Value::String(text(key, s)?)));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for item in value.try_iter().map_err(|e| Error::config(format!("{key}: {e}")))? {
            let item = item.map_err(|e| Error::config(format!("{key}: {e}")))?;
            let s = item
                .cast::<PyString>()
                .map_err(|_| Error::config(format!("{key} = {value}: expected a list of strings")))?;
            items.push(toml::Value::String(text(key, s)?));
        }
        return Ok(Some(toml::Value::Array(items)));
    }
    let kind = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(Error::config(format!(
        "{key} = {value}: a {kind} is not a configuration value (expected int, str, bool, float or a list of str)"
    )))
}

fn text(key: &str, s: &Bound<'_, PyString>) -> Result<String, Error> {
    s.extract::<String>()
        .map_err(|e| Error::config(format!("{key}: not valid text: {e}")))
}
