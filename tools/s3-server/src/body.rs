//! A GetObject body that counts the bytes it hands on and, when told to,
//! stops early: cut (an error, so the connection is dropped) or stalled
//! (nothing more until the stalls are released or the server stops), or
//! slows down: trickled (the rest at a few bytes at a time, never stalling),
//! or arrives damaged: one byte flipped.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use s3s::StdError;
use s3s::dto::StreamingBlob;
use s3s::stream::{ByteStream, RemainingLength};
use tokio::sync::watch;

use crate::{Plan, Shared};

/// How long a cut body waits between its last bytes and the cut.
const CUT_FLUSH: Duration = Duration::from_millis(50);

/// A trickled body's pace: 20 ms, then a fiftieth of its rate, and so on.
const TRICKLE_TICK: Duration = Duration::from_millis(20);

type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

pub(crate) struct FaultBody {
    inner: StreamingBlob,
    /// Bytes before the cut or the stall; `None`: no fault (any more).
    left: Option<u64>,
    cut: bool,
    /// Bytes per second once `left` runs out, for a trickled body: each
    /// piece then comes after a `TRICKLE_TICK` pause (`due`: the pause
    /// before the next piece is over).
    trickle: Option<u64>,
    due: bool,
    /// The body offset of the byte to invert, and the bytes sent so far.
    flip: Option<u64>,
    sent: u64,
    /// While stalled: the release to wait for (for a cut: a short pause
    /// before it). In a mutex only to make the
    /// body `Sync`; polled through `get_mut`, never locked.
    stalled: Option<Mutex<Wait>>,
    release: Option<watch::Receiver<u64>>,
    /// The part of a chunk held back by the stall.
    held: Option<Bytes>,
    done: bool,
    remaining: Option<usize>,
    shared: Arc<Shared>,
}

impl FaultBody {
    pub(crate) fn new(inner: StreamingBlob, plan: Plan, release: watch::Receiver<u64>, shared: Arc<Shared>) -> Self {
        let remaining = inner.remaining_length().exact();
        let (left, cut, trickle, flip) = match plan {
            Plan::Serve => (None, false, None, None),
            Plan::Cut(n) => (Some(n), true, None, None),
            Plan::Stall(n) => (Some(n), false, None, None),
            Plan::Trickle { after, rate } => (Some(after), false, Some(rate), None),
            Plan::Flip(at) => (None, false, None, Some(at)),
        };
        FaultBody {
            inner,
            left,
            cut,
            trickle,
            due: false,
            flip,
            sent: 0,
            stalled: None,
            release: Some(release),
            held: None,
            done: false,
            remaining,
            shared,
        }
    }

    /// Trickling: a trickled body whose bytes at full speed are sent.
    fn pacing(&self) -> bool {
        self.trickle.is_some() && self.left.is_none()
    }

    fn emit(&mut self, mut b: Bytes) -> Poll<Option<Result<Bytes, StdError>>> {
        if self.pacing()
            && let Some(rate) = self.trickle
        {
            let piece = usize::try_from(rate / 50).unwrap_or(usize::MAX).max(1);
            if b.len() > piece {
                self.held = Some(b.split_off(piece));
            }
            self.due = false;
        }
        let n = b.len();
        if let Some(at) = self.flip
            && let Some(i) = at.checked_sub(self.sent).and_then(|i| usize::try_from(i).ok())
            && i < n
        {
            let mut damaged = b.to_vec();
            damaged[i] ^= 0xff;
            b = Bytes::from(damaged);
            self.flip = None;
        }
        self.sent += n as u64;
        self.shared.counters.get_bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.remaining = self.remaining.map(|r| r.saturating_sub(n));
        Poll::Ready(Some(Ok(b)))
    }
}

impl Stream for FaultBody {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(wait) = &mut this.stalled {
                let wait = wait.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
                match wait.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) => this.stalled = None,
                }
                if this.cut {
                    this.done = true;
                    return Poll::Ready(Some(Err(Box::new(io::Error::other("body cut by brand-s3-server")))));
                }
            }
            if this.left == Some(0) {
                this.left = None;
                if this.cut {
                    // hyper drops what it has not written yet when a body
                    // fails: give it time to flush the bytes before the cut.
                    this.stalled = Some(Mutex::new(Box::pin(tokio::time::sleep(CUT_FLUSH))));
                } else if this.trickle.is_none()
                    && let Some(mut release) = this.release.take()
                {
                    this.stalled = Some(Mutex::new(Box::pin(async move {
                        // An error is the sender gone: the server is stopping.
                        let _ = release.changed().await;
                    })));
                }
                continue;
            }
            if this.pacing() && !this.due {
                this.due = true;
                this.stalled = Some(Mutex::new(Box::pin(tokio::time::sleep(TRICKLE_TICK))));
                continue;
            }
            if let Some(b) = this.held.take() {
                return this.emit(b);
            }
            let mut chunk = match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => chunk,
                other => return other,
            };
            if let Some(left) = &mut this.left {
                let len = chunk.len() as u64;
                if len > *left {
                    let rest = chunk.split_off(usize::try_from(*left).unwrap_or(usize::MAX));
                    if !this.cut {
                        this.held = Some(rest);
                    }
                    *left = 0;
                } else {
                    *left -= len;
                }
                if chunk.is_empty() {
                    continue;
                }
            }
            return this.emit(chunk);
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self.remaining {
            Some(r) => (0, Some(r)),
            None => (0, None),
        }
    }
}

impl ByteStream for FaultBody {
    fn remaining_length(&self) -> RemainingLength {
        match self.remaining {
            Some(r) => RemainingLength::new_exact(r),
            None => RemainingLength::unknown(),
        }
    }
}

/// Bytes read for a GET at a time. s3s-fs reads 4 KiB per blocking-pool
/// round trip, which held a GET to about 80 MiB/s here; benchmarks need more.
const READ_CHUNK: usize = 1 << 20;

/// A GET body read straight from the object's file, `READ_CHUNK` at a time.
pub(crate) struct FileBody {
    file: Arc<std::fs::File>,
    offset: u64,
    remaining: u64,
    reading: Option<tokio::task::JoinHandle<io::Result<Bytes>>>,
}

impl FileBody {
    pub(crate) fn new(file: std::fs::File, offset: u64, len: u64) -> Self {
        FileBody {
            file: Arc::new(file),
            offset,
            remaining: len,
            reading: None,
        }
    }
}

impl Stream for FileBody {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        use std::os::unix::fs::FileExt;
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let reading = this.reading.get_or_insert_with(|| {
            let (file, offset) = (Arc::clone(&this.file), this.offset);
            let n = usize::try_from(this.remaining).map_or(READ_CHUNK, |r| r.min(READ_CHUNK));
            tokio::task::spawn_blocking(move || {
                let mut buf = vec![0; n];
                file.read_exact_at(&mut buf, offset)?;
                Ok(Bytes::from(buf))
            })
        });
        let read = match Pin::new(reading).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        this.reading = None;
        match read {
            Ok(Ok(b)) => {
                this.offset += b.len() as u64;
                this.remaining -= b.len() as u64;
                Poll::Ready(Some(Ok(b)))
            }
            Ok(Err(e)) => {
                this.remaining = 0;
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Err(e) => {
                this.remaining = 0;
                Poll::Ready(Some(Err(Box::new(e))))
            }
        }
    }
}

impl ByteStream for FileBody {
    fn remaining_length(&self) -> RemainingLength {
        usize::try_from(self.remaining).map_or_else(|_| RemainingLength::unknown(), RemainingLength::new_exact)
    }
}
