//! brand's log in Python's `logging`. brand's crates say what a user should
//! know through `tracing` (a store's retries and its cause, `run_length
//! auto`'s choice, a partition packed for other groups, ...); the `brand`
//! command prints it, and here it goes to the logger `brand` at its level
//! (ERROR, WARNING, INFO), so the program's own logging configuration
//! decides what is shown and where.
//!
//! Events are emitted on brand's threads, which may hold brand's locks, and
//! taking the GIL there could deadlock against a Python thread that waits
//! for one of those locks: so an event is only queued (bounded, never
//! blocking; what does not fit is counted and said with the next that
//! does), and a thread of its own takes the GIL and logs. A forked child
//! (a DataLoader worker) starts its own thread at its first event.
//!
//! Installed by the first loader, pack, writer or workers' share a program
//! makes ([`forward`]), not at import: the `brand` command, which the wheel
//! runs in-process, keeps printing to stderr as the CLI does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Events queued for the logging thread before the rest are dropped.
const QUEUE: usize = 1024;

enum Message {
    Record {
        level: u8,
        message: String,
    },
    /// Answered once every record queued before it was logged.
    Flush(SyncSender<()>),
}

/// This process's queue to its logging thread (the process id it was made
/// in: a forked child makes its own).
struct Queue {
    pid: u32,
    tx: SyncSender<Message>,
}

/// The layer that queues brand's events for Python (shared with
/// [`_flush_log`]).
#[derive(Clone)]
struct ToPython(Arc<Queues>);

struct Queues {
    queue: Mutex<Option<Queue>>,
    dropped: AtomicU64,
}

/// The installed layer's queues; None before [`forward`], or when another
/// subscriber had brand's log first.
static FORWARDER: OnceLock<Option<ToPython>> = OnceLock::new();

/// Sends brand's log to Python's logger `brand` from now on in this
/// process (and its forked children). Idempotent; if another subscriber
/// already took brand's log (the `brand` command's), that one keeps it.
pub fn forward() {
    FORWARDER.get_or_init(|| {
        let layer = ToPython(Arc::new(Queues {
            queue: Mutex::new(None),
            dropped: AtomicU64::new(0),
        }));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer.clone()))
            .ok()
            .map(|()| layer)
    });
}

/// Python's level number of a `tracing` level.
fn level_number(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// brand's own events at INFO and above: its dependencies (h2, hyper,
/// reqwest) speak at DEBUG and TRACE of what a user does not need.
fn wanted(meta: &Metadata<'_>) -> bool {
    meta.target().starts_with("brand") && *meta.level() <= Level::INFO
}

impl Queues {
    /// The queue of this process's logging thread, started if there is none
    /// (or only the parent's, after a fork). None if the lock is taken: a
    /// fork while another thread held it leaves it taken for ever in the
    /// child, which must then not wait.
    fn queue(&self) -> Option<SyncSender<Message>> {
        let mut queue = self.queue.try_lock().ok()?;
        let pid = std::process::id();
        if queue.as_ref().is_none_or(|q| q.pid != pid) {
            let (tx, rx) = sync_channel(QUEUE);
            std::thread::Builder::new()
                .name("brand-log".into())
                .spawn(move || log_to_python(rx))
                .ok()?;
            *queue = Some(Queue { pid, tx });
        }
        queue.as_ref().map(|q| q.tx.clone())
    }

    fn send(&self, msg: Message) -> bool {
        let Some(tx) = self.queue() else { return false };
        match tx.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

impl<S: Subscriber> Layer<S> for ToPython {
    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        wanted(meta)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if !wanted(meta) {
            return;
        }
        let mut text = Text::default();
        event.record(&mut text);
        let q = &self.0;
        let dropped = q.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            text.0.push_str(&format!(
                " ({dropped} earlier log lines of brand's were dropped: Python logged too slowly)"
            ));
        }
        let record = Message::Record {
            level: level_number(meta.level()),
            message: text.0,
        };
        if !q.send(record) {
            q.dropped.fetch_add(dropped + 1, Ordering::Relaxed);
        }
    }
}

/// An event's message, then its other fields as `name=value`.
#[derive(Default)]
struct Text(String);

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format_args!("{value:?}"));
    }
}

impl Text {
    fn put(&mut self, field: &Field, value: std::fmt::Arguments<'_>) {
        use std::fmt::Write;
        let sep = if self.0.is_empty() { "" } else { " " };
        let _ = if field.name() == "message" {
            write!(self.0, "{sep}{value}")
        } else {
            write!(self.0, "{sep}{}={value}", field.name())
        };
    }
}

/// The logging thread: each record to `logging.getLogger("brand")`, which
/// applies the program's levels and handlers. Ends with the process, or
/// when Python can no longer be attached to (it is shutting down).
fn log_to_python(rx: Receiver<Message>) {
    while let Ok(msg) = rx.recv() {
        match msg {
            Message::Record { level, message } => {
                let logged = Python::try_attach(|py| {
                    let logged = log_one(py, level, &message);
                    if let Err(e) = logged {
                        // A handler of the program's raised: as logging's own
                        // handleError does, print it and go on.
                        e.print(py);
                    }
                });
                if logged.is_none() {
                    return;
                }
            }
            Message::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn log_one(py: Python<'_>, level: u8, message: &str) -> PyResult<()> {
    let logger = py.import("logging")?.call_method1("getLogger", ("brand",))?;
    if logger.call_method1("isEnabledFor", (level,))?.is_truthy()? {
        // "%s": a message with a % in it is not a format.
        logger.call_method1("log", (level, "%s", message))?;
    }
    Ok(())
}

/// ``_flush_log(timeout=5.0)``: waits (without the GIL, at most
/// ``timeout`` seconds) until every log line brand queued so far in this
/// process has reached ``logging``; whether it did (False too when brand's
/// log does not go to ``logging``). For tests, and for a program that wants
/// brand's last words before it exits.
#[pyfunction]
#[pyo3(signature = (timeout = 5.0))]
pub fn _flush_log(py: Python<'_>, timeout: f64) -> bool {
    let Some(Some(layer)) = FORWARDER.get() else {
        return false;
    };
    let Some(tx) = layer.0.queue() else {
        return false;
    };
    let timeout = std::time::Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
    let (done, wait) = sync_channel(1);
    // Without the GIL: the logging thread needs it to drain the queue.
    py.detach(move || tx.send(Message::Flush(done)).is_ok() && wait.recv_timeout(timeout).is_ok())
}
