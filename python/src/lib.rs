//! brand._brand, the extension module of the `brand` Python package: the
//! loader ([`loader::Loader`]), its batches ([`batch::Batch`]), the
//! `brand` command, `brand.pack` and `brand.Writer` ([`pack`]), brand's
//! errors as exceptions ([`errors`]), the memory of a process's workers
//! ([`workers`], for brand.torch and brand.grain) and brand's log in
//! Python's `logging` ([`log`]). The package's pure-Python modules
//! (brand/__init__.py, brand/torch.py, brand/grain.py) build on it.

mod batch;
mod errors;
mod keywords;
mod loader;
mod log;
mod pack;
mod workers;

use pyo3::prelude::*;

// Linked for its `brand_*` C symbols, which this module exports for brand.tf's
// op (python/brand/tf); nothing here calls them.
use brand as _;

#[pymodule]
fn _brand(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<loader::Loader>()?;
    m.add_class::<batch::Batch>()?;
    m.add_class::<batch::SampleBuffer>()?;
    m.add_class::<pack::_Writer>()?;
    m.add_function(wrap_pyfunction!(pack::main, m)?)?;
    m.add_function(wrap_pyfunction!(pack::_pack, m)?)?;
    m.add("DEFAULT_CHUNK_SIZE", brand_format::DEFAULT_CHUNK_SIZE)?;
    m.add("DEFAULT_SEGMENT_MIB", brand_format::DEFAULT_SEGMENT_BYTES >> 20)?;
    m.add_function(wrap_pyfunction!(workers::_worker_memory, m)?)?;
    m.add_function(wrap_pyfunction!(workers::_saved_slots, m)?)?;
    m.add_function(wrap_pyfunction!(log::_flush_log, m)?)?;
    m.add("BrandError", py.get_type::<errors::BrandError>())?;
    m.add("ConfigError", py.get_type::<errors::ConfigError>())?;
    m.add("NotFoundError", py.get_type::<errors::NotFoundError>())?;
    m.add("IoError", py.get_type::<errors::IoError>())?;
    m.add("FormatError", py.get_type::<errors::FormatError>())?;
    m.add("DataLossError", py.get_type::<errors::DataLossError>())?;
    m.add("InvalidStateError", py.get_type::<errors::InvalidStateError>())?;
    m.add("StateMismatchError", py.get_type::<errors::StateMismatchError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CHECKPOINT_BYTES", brand_loader::Checkpoint::LEN)?;
    // What brand.tf compiles its TensorFlow op from, against the TensorFlow
    // installed where it runs (an op loads only into the TF minor it was
    // built for, so no prebuilt op can ship): carried in the module so that
    // the wheel holds exactly the source its C ABI symbols match.
    m.add("TF_OP_SOURCE", include_str!("../../tf-op/src/brand_dataset_op.cc"))?;
    m.add("BRAND_H", include_str!("../../capi/include/brand.h"))?;
    Ok(())
}
