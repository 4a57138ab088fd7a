//! brand._brand, the extension module of the `brand` Python package: the
//! loader ([`loader::Loader`]), its batches ([`batch::Batch`]) and brand's
//! errors as exceptions ([`errors`]). The package's pure-Python modules
//! (brand/__init__.py, brand/torch.py, brand/grain.py) build on it.

mod batch;
mod errors;
mod keywords;
mod loader;

use pyo3::prelude::*;

#[pymodule]
fn _brand(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<loader::Loader>()?;
    m.add_class::<batch::Batch>()?;
    m.add_class::<batch::SampleBuffer>()?;
    m.add("BrandError", py.get_type::<errors::BrandError>())?;
    m.add("ConfigError", py.get_type::<errors::ConfigError>())?;
    m.add("NotFoundError", py.get_type::<errors::NotFoundError>())?;
    m.add("IoError", py.get_type::<errors::IoError>())?;
    m.add("FormatError", py.get_type::<errors::FormatError>())?;
    m.add("DataLossError", py.get_type::<errors::DataLossError>())?;
    m.add("InvalidStateError", py.get_type::<errors::InvalidStateError>())?;
    m.add("StateMismatchError", py.get_type::<errors::StateMismatchError>())?;
    m.add("CHECKPOINT_BYTES", brand_loader::Checkpoint::LEN)?;
    Ok(())
}
