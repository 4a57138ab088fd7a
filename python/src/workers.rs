//! What `brand.torch` and `brand.grain` need to share a process's memory
//! among its workers (DESIGN.md §5): each worker's slots
//! ([`brand_reader::workers`]), with the configuration resolved as
//! `brand.Loader` resolves it, and the slots per rank a saved state was
//! taken with.

use std::path::PathBuf;

use brand_format::error::Error;
use brand_reader::Config;
use brand_reader::config::process_env;
use brand_reader::workers::{Batches, split_memory_of};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{InvalidStateError, guarded, to_py};
use crate::keywords;
use crate::loader::checkpoint_of;

/// ``_worker_memory(path, workers, batched, **config)``: how the memory of
/// a process configured by ``config`` (as ``brand.Loader`` takes it) is
/// shared by ``workers`` ranks of its own, which yield brand's batches whole
/// (``batched``) or sample by sample: a dict of ``process_slots`` (what
/// ``memory`` is in slots), ``worker_slots`` (each worker's),
/// ``worker_batch_size`` (each worker's loader's), ``rounded_up`` (None, or
/// what to warn of when a percentage rounded the shares up), and the
/// process's ``rank`` and ``world`` as resolved. ``ConfigError`` when the
/// shares are too small (it names the workers and the least memory).
#[pyfunction]
#[pyo3(signature = (path, workers, batched, **config))]
pub fn _worker_memory<'py>(
    py: Python<'py>,
    path: PathBuf,
    workers: u32,
    batched: bool,
    config: Option<&Bound<'_, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    crate::log::forward();
    let table = keywords::table(config).map_err(to_py)?;
    let config = guarded(|| Config::resolve("", table, &process_env))?;
    if workers > 1 && config.nodes.world() > 1 {
        return Err(to_py(Error::config(format!(
            "a node of a multi-node job ({} nodes) is one process: it cannot be shared by {workers} workers",
            config.nodes.world()
        ))));
    }
    let plan = &config.loader.plan;
    let batch_size = config.loader.batch_size;
    // The index is read without the GIL (a large dataset's takes a while).
    let split = py.detach(|| {
        guarded(|| {
            let ds = brand_store::open_with(&path, &config.loader.io.store.get_policy())?;
            let batches = if batched { Batches::Yielded } else { Batches::Internal };
            split_memory_of(&ds.index, plan, batch_size, workers, batches)
        })
    })?;
    let d = PyDict::new(py);
    d.set_item("process_slots", split.process_slots)?;
    d.set_item("worker_slots", split.worker_slots)?;
    d.set_item("worker_batch_size", split.batch_size)?;
    d.set_item("rounded_up", split.rounded_up)?;
    d.set_item(
        "worker_readahead",
        config.loader.readahead_bytes / u64::from(workers.max(1)),
    )?;
    d.set_item("rank", plan.rank)?;
    d.set_item("world", plan.world)?;
    Ok(d)
}

/// ``_saved_slots(state)``: the slots per rank of the plan a
/// ``brand.Loader.state_dict()`` was saved with.
#[pyfunction]
pub fn _saved_slots(state: &Bound<'_, PyDict>) -> PyResult<u64> {
    let checkpoint = checkpoint_of(state).map_err(InvalidStateError::new_err)?;
    Ok(checkpoint.fingerprint.rank_slots)
}
