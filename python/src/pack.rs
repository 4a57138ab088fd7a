//! Making datasets from Python: the `brand` command ([`main`], the wheel's
//! console script), `brand.pack` ([`pack`]) and `brand.Writer` ([`Writer`]).
//!
//! A pack runs on its own thread while the calling thread waits for it
//! without the GIL, in slices, checking for signals and reporting progress
//! between them: Ctrl-C (or an exception from the progress callback) sets
//! the pack's cancel flag, and the pack stops and removes its unfinished
//! output before the exception is raised.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use brand_format::error::Error;
use brand_format::manifest::Manifest;
use brand_import::{Format, ImportOptions};
use brand_pack::source::Source;
use brand_pack::spill::SpillWriter;
use brand_pack::{Destination, PackOptions};
use brand_reader::Config;
use brand_store::{GetPolicy, Location};
use crossbeam_channel::RecvTimeoutError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

use crate::errors::{BrandError, guarded, to_py};
use crate::keywords;

/// How long the waiting thread sleeps before it checks for signals and
/// reports progress.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// Runs the ``brand`` command line with ``argv`` (program name first) and
/// returns its exit status; the GIL is released while it runs. For the
/// wheel's ``brand`` console script: ``brand pack`` blocks SIGINT and SIGTERM
/// in the calling thread and takes them on a thread of its own (so that an
/// interrupt removes the unfinished dataset, then ends the process), and
/// SIGPIPE is reset to its default action, as the ``brand`` binary does.
#[pyfunction]
pub fn main(py: Python<'_>, argv: Vec<OsString>) -> i32 {
    let code = py.detach(|| {
        let code = brand_cli::main_with_args(argv);
        let _ = std::io::stdout().flush();
        code
    });
    if code == ExitCode::SUCCESS { 0 } else { 1 }
}

/// `(samples, chunks, segments, data_bytes, raw_bytes)` of a packed dataset.
type Summary = (u64, u64, usize, u64, u64);

fn summary(m: &Manifest) -> Summary {
    (m.samples, m.chunks, m.segments.len(), m.data_bytes, m.raw_bytes)
}

/// The store policy of a pack's `stall_timeout` and `retries` (None: not
/// given), resolved as `brand.Loader`'s keys and `brand pack`'s flags are,
/// through the one configuration path: what every request of the pack
/// takes, the inputs' and the output's.
fn store_policy(
    py: Python<'_>,
    stall_timeout: Option<Bound<'_, PyAny>>,
    retries: Option<Bound<'_, PyAny>>,
) -> PyResult<GetPolicy> {
    let keys = pyo3::types::PyDict::new(py);
    keys.set_item("stall_timeout", stall_timeout)?;
    keys.set_item("retries", retries)?;
    let table = keywords::table(Some(&keys)).map_err(to_py)?;
    // No environment: a pack is one process, never a node of a world.
    let config = guarded(|| Config::resolve("", table, &|_| None))?;
    Ok(config.loader.io.store.get_policy())
}

/// Checks `out` as `brand pack` does (a URL before any input is read),
/// without the GIL: a pack's first step.
fn prepare(
    py: Python<'_>,
    out: &Path,
    force: bool,
    staging: Option<&Path>,
    policy: &GetPolicy,
) -> PyResult<Destination> {
    Ok(py.detach(|| guarded(|| Destination::prepare(out, force, staging, policy)))?)
}

/// Opens the source and packs it into `dest` on a thread of its own (a
/// source is shared with the packer's threads, not moved between them)
/// while this one waits without the GIL, checks for signals and calls
/// `progress(done, total)`.
fn pack_interruptibly<F>(
    py: Python<'_>,
    open: F,
    dest: Destination,
    opts: &PackOptions,
    progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<Summary>
where
    F: FnOnce() -> Result<Box<dyn Source>, Error> + Send,
{
    let cancel = AtomicBool::new(false);
    let (done, total) = (AtomicU64::new(0), AtomicU64::new(0));
    let (results, outcome) = crossbeam_channel::bounded(1);
    std::thread::scope(|s| {
        let packer = std::thread::Builder::new().name("brand-pack".into());
        let started = packer.spawn_scoped(s, || {
            let r = guarded(|| {
                let source = open()?;
                let hooks = brand_pack::Hooks {
                    progress: &|d, t, _| {
                        total.store(t, Ordering::Relaxed);
                        done.store(d, Ordering::Relaxed);
                    },
                    cancel: &cancel,
                };
                brand_pack::pack_to(source.as_ref(), dest, opts, &hooks)
            });
            let _ = results.send(r);
        });
        if let Err(e) = started {
            return Err(to_py(Error::io("<the brand-pack thread>", e)));
        }
        // The exception that stopped the pack (Ctrl-C, or the callback's).
        let mut stopped_by: Option<PyErr> = None;
        let mut reported = None;
        loop {
            match py.detach(|| outcome.recv_timeout(WAIT_SLICE)) {
                Ok(r) => {
                    if let Some(e) = stopped_by {
                        return Err(e);
                    }
                    let m = r.map_err(PyErr::from)?;
                    if let Some(cb) = progress
                        && reported != Some(m.samples)
                    {
                        cb.call1((m.samples, m.samples))?;
                    }
                    return Ok(summary(&m));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(BrandError::new_err(
                        "internal error: the pack thread ended without a result",
                    ));
                }
            }
            if stopped_by.is_some() {
                continue; // waiting for the pack to remove its output
            }
            let step = py.check_signals().and_then(|()| {
                let (d, t) = (done.load(Ordering::Relaxed), total.load(Ordering::Relaxed));
                match progress {
                    // Reported once the packer has said how many samples there are.
                    Some(cb) if t > 0 && reported != Some(d) => {
                        reported = Some(d);
                        cb.call1((d, t)).map(drop)
                    }
                    _ => Ok(()),
                }
            });
            if let Err(e) = step {
                cancel.store(true, Ordering::Relaxed);
                stopped_by = Some(e);
            }
        }
    })
}

/// The pack options of `brand pack`'s flags.
fn pack_options(
    seed: u64,
    chunk_size: u32,
    zstd: Option<i32>,
    segment_mib: u64,
    force: bool,
    inputs: Vec<String>,
) -> PackOptions {
    PackOptions {
        chunk_size,
        seed,
        zstd,
        segment_bytes: segment_mib.saturating_mul(1 << 20),
        force,
        inputs,
        partitions: None,
    }
}

/// The engine of ``brand.pack`` (see its docstring in brand/_pack.py):
/// returns ``(samples, chunks, segments, data_bytes, raw_bytes)``.
#[pyfunction]
#[pyo3(signature = (inputs, out, *, source, field, label, label_feature, seed, chunk_size, zstd, segment_mib, force, staging, progress, stall_timeout, retries))]
#[allow(clippy::too_many_arguments)]
pub fn _pack(
    py: Python<'_>,
    inputs: Vec<PathBuf>,
    out: PathBuf,
    source: &str,
    field: Option<String>,
    label: Option<String>,
    label_feature: String,
    seed: u64,
    chunk_size: u32,
    zstd: Option<i32>,
    segment_mib: u64,
    force: bool,
    staging: Option<PathBuf>,
    progress: Option<Bound<'_, PyAny>>,
    stall_timeout: Option<Bound<'_, PyAny>>,
    retries: Option<Bound<'_, PyAny>>,
) -> PyResult<Summary> {
    crate::log::forward();
    let format: Format = source.parse().map_err(to_py)?;
    let policy = store_policy(py, stall_timeout, retries)?;
    let scratch_dir = brand_pack::scratch_dir(&out, staging.as_deref()).map_err(to_py)?;
    let opts = pack_options(
        seed,
        chunk_size,
        zstd,
        segment_mib,
        force,
        inputs.iter().map(|p| p.display().to_string()).collect(),
    );
    // As `brand pack`: a pack into a local directory keeps its listing in
    // `.OUT.listing` until it is installed; an error or an interrupt keeps
    // it if it holds a finished input, for the same call to reuse.
    let listing_dir = match Location::of_path(&out).map_err(to_py)? {
        Location::Dir(_) => Some(brand_import::listing::dir_for(&out).map_err(to_py)?),
        Location::Url(_) => None,
    };
    let dest = prepare(py, &out, force, staging.as_deref(), &policy)?;
    let import = ImportOptions {
        label_feature,
        field,
        label,
        spool_dir: scratch_dir,
        store: policy,
        listing: brand_import::listing::ListingOptions {
            dir: listing_dir.clone(),
            on_input: None,
        },
    };
    // Listing a large input takes a while: on the pack's thread, without the GIL.
    let result = pack_interruptibly(
        py,
        || brand_import::open(format, &inputs, &import),
        dest,
        &opts,
        progress.as_ref(),
    );
    if let Some(dir) = &listing_dir {
        let settled = brand_import::listing::settle(dir, result.is_ok());
        // A failed pack's own error is the one to raise.
        if result.is_ok() {
            settled.map_err(to_py)?;
        }
    }
    result
}

/// The engine of ``brand.Writer`` (see brand/_pack.py): samples spilled to
/// an anonymous file, packed by ``close``.
#[pyclass(module = "brand._brand")]
pub struct _Writer {
    /// The dataset's directory or URL.
    out: PathBuf,
    /// A pack to a URL: where segments wait to be sent.
    staging: Option<PathBuf>,
    opts: PackOptions,
    /// The requests of a pack to a URL (`stall_timeout`, `retries`).
    policy: GetPolicy,
    /// None once closed or aborted.
    spill: Option<SpillWriter>,
}

#[pymethods]
impl _Writer {
    #[new]
    #[pyo3(signature = (out, *, seed, chunk_size, zstd, segment_mib, force, spill_dir, staging, stall_timeout, retries))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        out: PathBuf,
        seed: u64,
        chunk_size: u32,
        zstd: Option<i32>,
        segment_mib: u64,
        force: bool,
        spill_dir: Option<PathBuf>,
        staging: Option<PathBuf>,
        stall_timeout: Option<Bound<'_, PyAny>>,
        retries: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        crate::log::forward();
        let policy = store_policy(py, stall_timeout, retries)?;
        let scratch_dir = brand_pack::scratch_dir(&out, staging.as_deref()).map_err(to_py)?;
        let opts = pack_options(seed, chunk_size, zstd, segment_mib, force, Vec::new());
        // Options that cannot work fail now, not after every sample is written.
        brand_pack::check_options(&opts).map_err(to_py)?;
        if matches!(Location::of_path(&out), Ok(Location::Dir(_))) && out.exists() && !force {
            return Err(to_py(Error::config(format!(
                "{} already exists (use force=True to replace it)",
                out.display()
            ))));
        }
        let spill_dir = spill_dir.unwrap_or(scratch_dir);
        let spill = SpillWriter::new(&spill_dir).map_err(to_py)?;
        Ok(_Writer {
            out,
            staging,
            opts,
            policy,
            spill: Some(spill),
        })
    }

    /// Appends one sample (see ``brand.Writer.write``).
    #[pyo3(signature = (data, label, key))]
    fn write(&mut self, py: Python<'_>, data: PyBackedBytes, label: i64, key: Option<&str>) -> PyResult<()> {
        let spill = self.spill.as_mut().ok_or_else(closed)?;
        let key = key.map(str::as_bytes);
        // A large sample is written without the GIL.
        if data.len() >= 1 << 16 {
            py.detach(|| spill.push(&data, label, key)).map_err(to_py)
        } else {
            spill.push(&data, label, key).map_err(to_py)
        }
    }

    fn __len__(&self) -> usize {
        self.spill.as_ref().map_or(0, SpillWriter::len)
    }

    /// Whether close() or abort() was called.
    #[getter]
    fn closed(&self) -> bool {
        self.spill.is_none()
    }

    /// Packs the samples written (see ``brand.Writer.close``).
    #[pyo3(signature = (progress))]
    fn close(&mut self, py: Python<'_>, progress: Option<Bound<'_, PyAny>>) -> PyResult<Summary> {
        let spill = self.spill.take().ok_or_else(closed)?;
        let open = move || spill.finish().map(|s| Box::new(s) as Box<dyn Source>);
        let dest = prepare(py, &self.out, self.opts.force, self.staging.as_deref(), &self.policy)?;
        pack_interruptibly(py, open, dest, &self.opts, progress.as_ref())
    }

    /// Drops the samples written; no dataset is made.
    fn abort(&mut self) {
        self.spill = None;
    }
}

fn closed() -> PyErr {
    to_py(Error::config("this brand.Writer is closed"))
}
