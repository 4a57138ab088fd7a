//! A batch as Python sees it: numpy arrays that view brand's sample buffers
//! (no copy), and the samples' ids, labels and keys.

use std::ffi::c_void;
use std::sync::Arc;

use brand_format::buffer::AlignedBuf;
use numpy::npyffi::{self, NpyTypes, PY_ARRAY_API, npy_intp};
use numpy::{Element, PyArray1, PyArrayDescrMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString};

/// One sample's bytes, owned by brand: the base object of the numpy array
/// that views them. While any array (or slice of one) that views it is
/// alive, the buffer is neither freed nor reused.
#[pyclass(module = "brand", frozen)]
pub struct SampleBuffer {
    buf: Arc<AlignedBuf>,
}

#[pymethods]
impl SampleBuffer {
    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// The buffer's address (64-byte aligned).
    #[getter]
    fn address(&self) -> usize {
        self.buf.as_ptr() as usize
    }

    fn __repr__(&self) -> String {
        format!("<brand.SampleBuffer {} bytes at {:#x}>", self.buf.len(), self.address())
    }
}

/// A read-only 1-D uint8 array over `buf`'s bytes, whose base is a
/// `SampleBuffer` holding `buf`. Read-only: a sample that stays in memory
/// across epochs is handed out again from the same buffer.
fn sample_array(py: Python<'_>, buf: &Arc<AlignedBuf>) -> PyResult<Py<PyArray1<u8>>> {
    let owner = Bound::new(py, SampleBuffer { buf: buf.clone() })?;
    let mut dims: [npy_intp; 1] = [npy_intp::try_from(buf.len())
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("sample larger than numpy can index"))?];
    let data = buf.as_ptr() as *mut c_void;
    // SAFETY: PyArray_NewFromDescr with a data pointer makes an array that
    // views `len` bytes at `data` without copying them or taking ownership
    // (flags 0: not writeable, not owning); the dtype reference it steals is
    // a new one from into_dtype_ptr; dims outlives the call; strides NULL
    // means C order. The GIL is held (`py`).
    let array = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, NpyTypes::PyArray_Type),
            u8::get_dtype(py).into_dtype_ptr(),
            1,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data,
            0,
            std::ptr::null_mut(),
        )
    };
    if array.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `array` is a new, non-NULL reference to an ndarray (checked
    // above), owned here from now on.
    let array = unsafe { Bound::from_owned_ptr(py, array) };
    // SAFETY: `array` is an ndarray (made above); SetBaseObject steals the
    // owner's reference (into_ptr gives one), on failure too. From here the
    // array keeps the owner, and so `buf`'s allocation, alive: `data` stays
    // valid as long as the array or any view of it.
    let status = unsafe { PY_ARRAY_API.PyArray_SetBaseObject(py, array.as_ptr().cast(), owner.into_any().into_ptr()) };
    if status < 0 {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyArray_NewFromDescr with the uint8 descriptor and one
    // dimension made a 1-D uint8 array.
    Ok(unsafe { array.cast_into_unchecked::<PyArray1<u8>>() }.unbind())
}

/// A sample key as `str`: keys are bytes in brand (a file's path relative
/// to the packed directory); bytes that are not UTF-8 decode with
/// `surrogateescape`, as Python decodes file names, so
/// `key.encode("utf-8", "surrogateescape")` (or `os.fsencode(key)`) gives
/// the bytes back.
pub fn key_str<'py>(py: Python<'py>, key: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    match std::str::from_utf8(key) {
        Ok(s) => Ok(PyString::new(py, s).into_any()),
        Err(_) => PyBytes::new(py, key).call_method1("decode", ("utf-8", "surrogateescape")),
    }
}

/// A batch of samples of one epoch, in the order brand serves them.
///
/// ``samples``: one read-only 1-D ``numpy.uint8`` array per sample, viewing
/// brand's buffer without a copy (64-byte aligned; ``arr.base`` is the
/// ``brand.SampleBuffer`` that keeps it alive, so arrays stay valid after
/// the batch is gone). ``ids`` (``numpy.uint64``), ``labels``
/// (``numpy.int64``), ``keys`` (``list[str]``, see ``keys``), ``epoch``,
/// ``len(batch)``.
#[pyclass(module = "brand", frozen)]
pub struct Batch {
    batch: brand_loader::Batch,
    /// The arrays, made at the first use of `samples` and kept: every
    /// access gives the same array objects.
    arrays: PyOnceLock<Vec<Py<PyArray1<u8>>>>,
}

impl Batch {
    pub fn new(batch: brand_loader::Batch) -> Self {
        Batch {
            batch,
            arrays: PyOnceLock::new(),
        }
    }
}

#[pymethods]
impl Batch {
    fn __len__(&self) -> usize {
        self.batch.len()
    }

    /// The epoch this batch belongs to.
    #[getter]
    fn epoch(&self) -> u64 {
        self.batch.epoch
    }

    /// One read-only 1-D numpy.uint8 array per sample: zero-copy views of
    /// brand's buffers (``arr.flags.owndata`` is False, ``arr.base`` is a
    /// ``brand.SampleBuffer``), each 64-byte aligned. Copy (``arr.copy()``)
    /// to get a writeable array.
    #[getter]
    fn samples<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let arrays = self.arrays.get_or_try_init(py, || {
            self.batch
                .buffers()
                .iter()
                .map(|b| sample_array(py, b))
                .collect::<PyResult<Vec<_>>>()
        })?;
        PyList::new(py, arrays.iter().map(|a| a.bind(py)))
    }

    /// The samples' ids (their index in the dataset), numpy.uint64.
    #[getter]
    fn ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> {
        PyArray1::from_slice(py, self.batch.ids())
    }

    /// The samples' labels, numpy.int64.
    #[getter]
    fn labels<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let labels: Vec<i64> = self.batch.iter().map(|s| s.label).collect();
        PyArray1::from_vec(py, labels)
    }

    /// The samples' keys as str (brand stores bytes: a file's path relative
    /// to the directory that was packed). Bytes that are not UTF-8 are
    /// decoded with ``surrogateescape``, as Python decodes file names:
    /// ``os.fsencode(key)`` gives the stored bytes back.
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys = self
            .batch
            .iter()
            .map(|s| key_str(py, s.key))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, keys)
    }

    fn __repr__(&self) -> String {
        format!(
            "<brand.Batch epoch {} of {} samples>",
            self.batch.epoch,
            self.batch.len()
        )
    }
}
