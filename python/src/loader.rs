//! `brand.Loader`: a brand reader (a loader alone or a node of a multi-node
//! job) behind Python's iterator protocol.
//!
//! Why a worker thread: a batch can take long (a cold read, a slow or hung
//! device, a peer). The reader's `next_batch` runs on the loader's own
//! thread while the calling Python thread waits for it without the GIL, in
//! slices of [`WAIT_SLICE`], checking for signals between them: Ctrl-C
//! raises `KeyboardInterrupt` at once. The batch that was being awaited is
//! not lost: the next call returns it, and a state saved in between counts
//! it as not yet handed out.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use brand_format::error::Error;
use brand_loader::{Checkpoint, LoaderState, Resume};
use brand_reader::config::process_env;
use brand_reader::{Config, Reader};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::batch::Batch;
use crate::errors::{Failure, InvalidStateError, guarded, to_py};
use crate::keywords;

/// How long a waiting call sleeps before it checks for signals: Ctrl-C is
/// seen within this (plus the time Python's handler takes).
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// What the worker thread hands back for one request.
type Outcome = Result<Option<brand_loader::Batch>, Failure>;

/// The version of the dict `state_dict` returns.
const STATE_DICT_VERSION: i64 = 1;

/// A brand loader over the dataset ``path`` (made by ``brand pack``): a
/// directory, or a URL in object storage (``s3://bucket/prefix``, ``gs://…``,
/// ``az://…``, ``https://…``; credentials and endpoint from the
/// environment, as the cloud's tools read them).
///
/// ``Loader(path, **config)``: every key of brand's configuration as a
/// keyword (``batch_size``, ``memory``, ``policy``, ``seed``, ``rank``,
/// ``world``, ``drop_last``, ``readahead``, ``queue_depth``, ``read_gap``,
/// ``run_length``, ``verify``, ``direct``, ``io_backend``,
/// ``decode_threads``, ``io_timeout``, for a URL ``gets_in_flight``,
/// ``get_size``, ``stall_timeout``, ``retries``, ``disk_cache`` (a directory on a
/// local disk keeping its chunks, shared by the machine's processes; when it is
/// full, its space goes to the datasets whose jobs wait for the store most:
/// ``metrics()``'s ``tier_benefit``, ``tier_owed_bytes``, ``tier_evicted_bytes``) and
/// ``disk_cache_limit``, ``on_corrupt``, ``cache`` (the
/// socket of a ``brand cache`` to attach to), and for a multi-node job ``nodes``,
/// ``remote_memory``, ``peer_timeout``, ``job``, ``tf_port_offset``), checked
/// as a TOML config file's keys are; a keyword given as None is not given.
/// Without ``nodes``, the launcher's environment (``BRAND_NODES`` with
/// ``RANK``, or ``TF_CONFIG``) is read as everywhere in brand.
///
/// Iterating yields the batches (``brand.Batch``) of one epoch, in brand's order;
/// iterating again yields the next epoch (a loop left early continues where
/// it stopped). ``len(loader)`` is the batches per epoch. Waiting for a
/// batch releases the GIL and Ctrl-C interrupts it (the batch is not lost:
/// the next iteration returns it).
///
/// ``state_dict()`` / ``load_state_dict(d)`` save and restore the exact
/// position, also across worlds of different sizes (see
/// ``load_state_dict``). ``metrics()`` returns the loader's counters.
///
/// A loader belongs to the process that opened it: used in a forked child
/// it raises ``ConfigError``; open a new one there. ``close()`` (or ``with
/// brand.Loader(...) as loader:``) frees its memory and threads at once.
#[pyclass(module = "brand", frozen)]
pub struct Loader {
    path: PathBuf,
    config: Config,
    /// The process that opened it (see the fork rule above).
    opened_by: u32,
    slot: Mutex<Slot>,
    /// What `set_last_epoch` named (kept for the reader `load_state_dict` opens).
    last_epoch: Mutex<Option<u64>>,
}

enum Slot {
    Open(Box<Open>),
    /// Why there is no reader: closed by the user, or a reopen failed.
    Closed(String),
}

/// An open reader and the thread that calls its `next_batch`.
struct Open {
    reader: Arc<Mutex<Reader>>,
    epoch_len: u64,
    requests: Sender<()>,
    results: Receiver<Outcome>,
    /// A request was sent and its outcome not yet received.
    pending: bool,
    /// An outcome received but not yet handed out (its wait was interrupted).
    ready: Option<Outcome>,
    /// The reader's state before the request in flight or `ready`: what the
    /// Python side has been handed out so far.
    before: Option<LoaderState>,
    /// The reader's state before the batch last handed out (a position
    /// inside it is `state_dict(taken=k)`).
    handed: Option<LoaderState>,
    /// A panic inside brand leaves the reader unusable.
    broken: Option<String>,
}

impl Open {
    fn start(py: Python<'_>, path: &Path, config: &Config, resume: Resume, last_epoch: Option<u64>) -> PyResult<Self> {
        let mut reader = py.detach(|| guarded(|| Reader::open(path, config, resume)))?;
        reader.set_last_epoch(last_epoch);
        let epoch_len = reader.epoch_len();
        let reader = Arc::new(Mutex::new(reader));
        let (requests, results) = spawn_worker(reader.clone()).map_err(to_py)?;
        Ok(Open {
            reader,
            epoch_len,
            requests,
            results,
            pending: false,
            ready: None,
            before: None,
            handed: None,
            broken: None,
        })
    }

    /// The reader, when no request is in flight (the worker holds it then).
    fn reader(&self) -> PyResult<MutexGuard<'_, Reader>> {
        debug_assert!(!self.pending);
        self.reader
            .lock()
            .map_err(|_| InvalidStateError::new_err("brand's loader panicked earlier: open a new loader"))
    }

    fn check_usable(&self) -> PyResult<()> {
        match &self.broken {
            Some(why) => Err(InvalidStateError::new_err(format!(
                "this loader stopped after an internal error and cannot be used: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Receives the outcome of the request in flight, if any, into `ready`
    /// (interruptible).
    fn settle(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.pending {
            let outcome = wait(py, &self.results)?;
            self.pending = false;
            self.ready = Some(outcome);
        }
        Ok(())
    }

    /// Asks the worker for the next batch; `before` is the state until it is handed out.
    fn request(&mut self) -> PyResult<()> {
        let state = self.reader()?.state();
        self.before = Some(state);
        self.requests
            .send(())
            .map_err(|_| InvalidStateError::new_err("brand's loader thread is gone: open a new loader"))?;
        self.pending = true;
        Ok(())
    }

    fn next(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        self.check_usable()?;
        if self.ready.is_none() && !self.pending {
            self.request()?;
        }
        self.settle(py)?;
        let before = self.before.take();
        self.handed = None;
        match self.ready.take() {
            Some(Ok(Some(batch))) => {
                self.handed = before;
                // The next batch is fetched while Python works on this one:
                // the worker's hand-off (two thread wake-ups) then overlaps
                // with the consumer instead of adding to its wait (measured:
                // 0.85x `brand read`'s bytes/s without). Not past the end of
                // an epoch: the next epoch starts when it is asked for.
                self.request()?;
                Ok(Some(Batch::new(batch)))
            }
            Some(Ok(None)) | None => Ok(None),
            Some(Err(Failure::Panic(why))) => {
                self.broken = Some(why.clone());
                Err(Failure::Panic(why).into())
            }
            Some(Err(f)) => Err(f.into()),
        }
    }

    /// What the Python side has been handed out: a batch received but not
    /// yet returned (an interrupted wait) does not count. With `taken`, only
    /// that many samples of the batch last handed out count.
    fn checkpoint(&self, taken: Option<u64>) -> PyResult<Checkpoint> {
        let reader = self.reader()?;
        let state = match (taken, self.handed) {
            (None, _) => self.before.unwrap_or_else(|| reader.state()),
            (Some(k), Some(h)) => LoaderState {
                epoch: h.epoch,
                served: h.served + k,
            },
            (Some(_), None) => {
                return Err(InvalidStateError::new_err(
                    "state_dict(taken=...): no batch was handed out since the loader was opened, restored or moved to another epoch",
                ));
            }
        };
        // The reader's rule, not a blob put together here: an attached
        // job's state mid-epoch is the bitmap of what the user was handed.
        reader.checkpoint_at(state).map_err(to_py)
    }
}

/// Starts the thread that calls `next_batch` for each request (panics
/// caught: they come back as [`Failure::Panic`]). It ends when the loader
/// drops its sender.
fn spawn_worker(reader: Arc<Mutex<Reader>>) -> Result<(Sender<()>, Receiver<Outcome>), Error> {
    let (requests, request_rx) = crossbeam_channel::bounded::<()>(1);
    let (result_tx, results) = crossbeam_channel::bounded::<Outcome>(1);
    std::thread::Builder::new()
        .name("brand-py-loader".into())
        .spawn(move || {
            while request_rx.recv().is_ok() {
                let outcome = match reader.lock() {
                    Ok(mut r) => guarded(|| r.next_batch()),
                    Err(_) => Err(Failure::Panic("brand's loader panicked earlier".into())),
                };
                if result_tx.send(outcome).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Error::io("brand-py-loader thread", e))?;
    Ok((requests, results))
}

/// Waits for the worker's outcome without the GIL, checking for signals
/// every [`WAIT_SLICE`]: a signal handler's exception (KeyboardInterrupt)
/// ends the wait; the outcome is then received by the next call.
fn wait(py: Python<'_>, results: &Receiver<Outcome>) -> PyResult<Outcome> {
    loop {
        // First: a Ctrl-C that came before the wait interrupts it too.
        py.check_signals()?;
        match py.detach(|| results.recv_timeout(WAIT_SLICE)) {
            Ok(outcome) => return Ok(outcome),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                return Ok(Err(Failure::Panic("brand's loader thread ended unexpectedly".into())));
            }
        }
    }
}

impl Loader {
    /// The open reader, after the fork and one-call-at-a-time checks.
    fn open(&self) -> PyResult<MutexGuard<'_, Slot>> {
        let now = std::process::id();
        if now != self.opened_by {
            return Err(to_py(Error::config(format!(
                "this loader was opened by process {} and cannot be used after fork() (in process {now}): open a new loader in the child",
                self.opened_by
            ))));
        }
        match self.slot.try_lock() {
            Ok(slot) => Ok(slot),
            Err(TryLockError::WouldBlock) => Err(InvalidStateError::new_err(
                "this brand.Loader is in use by another thread: use a loader from one thread at a time",
            )),
            Err(TryLockError::Poisoned(_)) => Err(InvalidStateError::new_err(
                "this brand.Loader failed inside a call earlier: open a new loader",
            )),
        }
    }

    fn with_open<T>(&self, body: impl FnOnce(&mut Open) -> PyResult<T>) -> PyResult<T> {
        let mut slot = self.open()?;
        match &mut *slot {
            Slot::Open(open) => body(open),
            Slot::Closed(why) => Err(InvalidStateError::new_err(format!(
                "this brand.Loader is closed: {why}"
            ))),
        }
    }

    /// Replaces the reader with one opened where `resume` says.
    fn reopen(&self, py: Python<'_>, resume: Resume) -> PyResult<()> {
        let mut slot = self.open()?;
        let old = std::mem::replace(&mut *slot, Slot::Closed("closed".into()));
        // The old reader's memory and threads go before the new one takes
        // its own (dropping it waits for its reads: without the GIL).
        py.detach(move || drop(old));
        let last_epoch = self.last_epoch.lock().map(|l| *l).unwrap_or(None);
        match Open::start(py, &self.path, &self.config, resume, last_epoch) {
            Ok(open) => {
                *slot = Slot::Open(Box::new(open));
                Ok(())
            }
            Err(e) => {
                *slot = Slot::Closed(format!("load_state_dict failed: {e}"));
                Err(e)
            }
        }
    }
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (path, **config))]
    fn new(py: Python<'_>, path: PathBuf, config: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        crate::log::forward();
        let table = keywords::table(config).map_err(to_py)?;
        let config = guarded(|| Config::resolve("", table, &process_env))?;
        let open = Open::start(py, &path, &config, Resume::At(LoaderState::default()), None)?;
        Ok(Loader {
            path,
            config,
            opened_by: std::process::id(),
            slot: Mutex::new(Slot::Open(Box::new(open))),
            last_epoch: Mutex::new(None),
        })
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        self.with_open(|open| open.next(py))
    }

    /// Batches per epoch: ceil(epoch_len / batch_size).
    fn __len__(&self) -> PyResult<usize> {
        let samples = self.epoch_len()?;
        Ok(samples.div_ceil(self.config.loader.batch_size as u64) as usize)
    }

    /// Samples this loader (this rank) serves per epoch.
    #[getter]
    fn epoch_len(&self) -> PyResult<u64> {
        self.with_open(|open| Ok(open.epoch_len))
    }

    /// Samples per batch (the last batch of an epoch may have fewer).
    #[getter]
    fn batch_size(&self) -> usize {
        self.config.loader.batch_size
    }

    /// This loader's rank and world (after the environment is applied).
    #[getter]
    fn rank(&self) -> u32 {
        self.config.loader.plan.rank
    }

    #[getter]
    fn world(&self) -> u32 {
        self.config.loader.plan.world
    }

    /// The dataset directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Jumps to the start of ``epoch`` (anything read ahead is dropped; a
    /// batch received but not yet returned is discarded). The next
    /// iteration yields that epoch. A node of a multi-node job can only jump
    /// before its first batch (every node must start at the same place).
    fn start_epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<()> {
        self.with_open(|open| {
            open.check_usable()?;
            open.settle(py)?;
            open.ready = None;
            open.before = None;
            open.handed = None;
            let mut reader = open.reader()?;
            let reader: &mut Reader = &mut reader;
            // It waits for the reads in flight: without the GIL.
            py.detach(|| guarded(|| reader.start_epoch(epoch)))?;
            Ok(())
        })
    }

    /// Reads ahead no further than the end of ``epoch``, the last epoch
    /// this run takes (``None``, the default: every epoch is read ahead into
    /// the next, so its first batch does not wait). Only what is fetched
    /// changes: read-ahead into an epoch nobody takes is up to ``readahead``
    /// bytes read for nothing (GETs, from object storage). An epoch asked
    /// for after it is served as ever, its reads starting then. Kept across
    /// ``load_state_dict``. A node of a multi-node job, or a loader attached
    /// to a cache, reads what its job reads: the hint does not change it.
    #[pyo3(signature = (epoch))]
    fn set_last_epoch(&self, py: Python<'_>, epoch: Option<u64>) -> PyResult<()> {
        self.with_open(|open| {
            open.check_usable()?;
            open.settle(py)?;
            open.reader()?.set_last_epoch(epoch);
            Ok(())
        })?;
        if let Ok(mut last) = self.last_epoch.lock() {
            *last = epoch;
        }
        Ok(())
    }

    /// The position as a small JSON-serialisable dict: ``checkpoint`` (the
    /// brand state blob, hex: bound to the dataset and the plan config;
    /// ``CHECKPOINT_BYTES`` long, or for a loader attached to a cache
    /// mid-epoch longer: it holds which samples were served, one bit each,
    /// because an attached loader's order depends on timing), and for
    /// people ``epoch``, ``served`` (samples of that epoch handed out),
    /// ``rank``, ``world`` and ``version``. Saved right after the last batch
    /// of an epoch, it resumes at that epoch's end (the next iteration ends
    /// the epoch, the one after starts the next).
    ///
    /// ``taken=k``: the position after only the first ``k`` samples of the
    /// batch last returned (for a consumer that hands a batch on sample by
    /// sample; the rest of it counts as not served). A loader attached to a
    /// cache cannot read a batch again, so this is how its state inside a
    /// batch is saved.
    #[pyo3(signature = (taken=None))]
    fn state_dict<'py>(&self, py: Python<'py>, taken: Option<u64>) -> PyResult<Bound<'py, PyDict>> {
        let checkpoint = self.with_open(|open| open.checkpoint(taken))?;
        let d = PyDict::new(py);
        d.set_item("version", STATE_DICT_VERSION)?;
        d.set_item("checkpoint", hex(&checkpoint.to_bytes()))?;
        d.set_item("epoch", checkpoint.state.epoch)?;
        d.set_item("served", checkpoint.state.served)?;
        d.set_item("rank", checkpoint.fingerprint.rank)?;
        d.set_item("world", checkpoint.fingerprint.world)?;
        Ok(d)
    }

    /// Continues exactly where the loader that saved ``state`` stopped: the
    /// next batch starts with the first sample it had not handed out.
    ///
    /// ``state`` is either one ``state_dict()`` of this rank, saved with the
    /// same dataset and the same plan config (policy, seed, memory, rank,
    /// world, drop_last; I/O settings and batch_size may differ; a state of
    /// a loader attached to a cache resumes attached, with ``cache``, or
    /// alone, without: each sample once in that epoch either way), or
    /// ``{"world": [state_dict of rank 0, rank 1, ...]}``: the state dicts
    /// of EVERY rank of a world of any size, saved after the same number of
    /// batches (elastic resume). The ranks of this world then serve the
    /// rest of that epoch's global order together, every sample once, and
    /// later epochs as this world would. The total memory (world × memory
    /// per rank) must be the saved world's. ``StateMismatchError`` says what
    /// differs; ``InvalidStateError`` is a dict that is not a brand state.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = state
            .cast::<PyDict>()
            .map_err(|_| InvalidStateError::new_err("a brand state must be a dict (from brand.Loader.state_dict())"))?;
        let resume = match state.get_item("world")? {
            Some(world) if world.cast::<PyList>().is_ok() || world.is_instance_of::<pyo3::types::PyTuple>() => {
                let mut checkpoints = Vec::new();
                for (i, rank_state) in world.try_iter()?.enumerate() {
                    let rank_state = rank_state?;
                    let d = rank_state.cast::<PyDict>().map_err(|_| {
                        InvalidStateError::new_err(format!("world state {i}: not a dict (from state_dict())"))
                    })?;
                    let c =
                        checkpoint_of(d).map_err(|e| InvalidStateError::new_err(format!("world state {i}: {e}")))?;
                    checkpoints.push(c);
                }
                Resume::Elastic(checkpoints)
            }
            _ => Resume::Checkpoint(checkpoint_of(state).map_err(InvalidStateError::new_err)?),
        };
        self.reopen(py, resume)
    }

    /// The loader's counters since it was opened (bytes and samples read
    /// and served, stalls waiting for I/O and their percentiles, peak
    /// memory, the I/O backend in use, ...), as a dict.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = self.with_open(|open| {
            open.check_usable()?;
            open.settle(py)?;
            let metrics = open.reader()?.metrics();
            serde_json::to_string(&metrics).map_err(|e| InvalidStateError::new_err(e.to_string()))
        })?;
        py.import("json")?.call_method1("loads", (PyString::new(py, &text),))
    }

    /// Frees the loader's memory and threads now (it waits for reads in
    /// flight). Batches already returned stay valid. Using the loader
    /// afterwards raises InvalidStateError.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let now = std::process::id();
        if now != self.opened_by {
            return Ok(());
        }
        let mut slot = self.open()?;
        let old = std::mem::replace(&mut *slot, Slot::Closed("close() was called".into()));
        py.detach(move || drop(old));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<brand.Loader {} batch_size={} rank={} world={}>",
            self.path.display(),
            self.config.loader.batch_size,
            self.config.loader.plan.rank,
            self.config.loader.plan.world
        )
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if std::process::id() != self.opened_by {
            // A forked child: the worker and engine threads are not here and
            // their locks may be held by threads that were: leave it all.
            if let Ok(slot) = self.slot.get_mut() {
                std::mem::forget(std::mem::replace(slot, Slot::Closed(String::new())));
            }
        }
    }
}

/// The checkpoint of one `state_dict()`.
pub fn checkpoint_of(d: &Bound<'_, PyDict>) -> Result<Checkpoint, String> {
    let text: String = d
        .get_item("checkpoint")
        .map_err(|e| e.to_string())?
        .ok_or("no \"checkpoint\" key: not a dict from brand.Loader.state_dict()")?
        .extract()
        .map_err(|_| "\"checkpoint\" is not a str".to_string())?;
    let bytes = unhex(&text).ok_or("\"checkpoint\" is not a hex string")?;
    Checkpoint::from_bytes(&bytes).map_err(|e| e.to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
