//! One job's connection: its hello awaited on a thread of its own, then
//! two threads while it is attached, one taking its messages (releases
//! applied at once) and one answering its requests for batches, waiting
//! for the fill when memory lacks them.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use brand_format::ids::IdBits;

use crate::shared::{Link, Shared, lock};
use crate::shm::send_with_fd;
use crate::state::{Draw, batch_bytes};
use crate::wire::{Hello, ToCache, ToJob, attached_frame_max, hello_frame_max, read_frame_within};

/// A job waits at most this long for a batch without any read or release
/// in between before the cache gives up on it (everything held by batches).
const STUCK_AFTER: Duration = Duration::from_secs(120);
/// A job must introduce itself within this (its whole hello, however
/// slowly its bytes come).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections whose hello is awaited at once, each on its own thread (so
/// one that says nothing holds up no other); more are refused at once.
const MAX_INTRODUCING: usize = 64;

/// Awaits a new connection's hello on a thread of its own: a connection
/// that says nothing, or says it slowly, holds up no other job's attach.
pub(crate) fn introduce(sh: &Arc<Shared>, stream: UnixStream) {
    let link = Arc::new(Link::new(stream));
    if sh.introducing.fetch_add(1, Ordering::SeqCst) >= MAX_INTRODUCING {
        sh.introducing.fetch_sub(1, Ordering::SeqCst);
        let why = format!("{MAX_INTRODUCING} connections are introducing themselves already: try again");
        let _ = link.stream.set_nonblocking(false);
        let _ = refuse(sh, &link, why);
        return;
    }
    let s = sh.clone();
    let spawned = std::thread::Builder::new()
        .name("brand-cache-hello".into())
        .spawn(move || {
            if let Err(e) = attach(&s, link) {
                tracing::warn!("a job could not attach: {e}");
            }
            s.introducing.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        sh.introducing.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("a job could not attach: no thread for its hello: {e}");
    }
}

/// Reads from a stream until `until`, however the bytes are spread out.
struct Until<'a> {
    stream: &'a UnixStream,
    until: Instant,
}

impl io::Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no whole hello within {} s", HELLO_TIMEOUT.as_secs()),
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        io::Read::read(&mut &*self.stream, buf)
    }
}

/// Takes a job's hello and, if it fits, attaches it: its threads start.
fn attach(sh: &Arc<Shared>, link: Arc<Link>) -> io::Result<()> {
    link.stream.set_nonblocking(false)?;
    let mut hello_bytes = Until {
        stream: &link.stream,
        until: Instant::now() + HELLO_TIMEOUT,
    };
    let hello_max = hello_frame_max(sh.ds.index.samples());
    let hello = match read_frame_within(&mut hello_bytes, |_| Ok(hello_max)) {
        Ok(Some((kind, body))) => match ToCache::decode(kind, &body) {
            Ok(ToCache::Hello(h)) => h,
            Ok(_) => return refuse(sh, &link, "expected a hello first".into()),
            Err(why) => return refuse(sh, &link, format!("a malformed hello: {why}")),
        },
        Ok(None) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return refuse(sh, &link, format!("a malformed hello: {e}"));
        }
        Err(e) if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => {
            return refuse(
                sh,
                &link,
                format!("no whole hello within {} s", HELLO_TIMEOUT.as_secs()),
            );
        }
        Err(e) => return Err(e),
    };
    let served = match check_hello(sh, &hello) {
        Ok(served) => served,
        Err(why) => return refuse(sh, &link, why),
    };
    if sh.stop.load(Ordering::SeqCst) {
        return refuse(sh, &link, format!("the cache at {} is stopping", sh.socket.display()));
    }
    let id = lock(&sh.state).attach_job(&hello, served);
    let welcome = ToJob::Welcome {
        memory_len: sh.memory.size() as u64,
    }
    .encode();
    if let Err(e) = send_with_fd(link.stream.as_raw_fd(), &welcome, sh.memfd.as_raw_fd()) {
        lock(&sh.state).remove_job(id);
        return Err(e);
    }
    link.stream.set_read_timeout(None)?;
    let (tx, rx) = mpsc::channel::<()>();
    let (s1, l1) = (sh.clone(), link.clone());
    let (samples, batch_size) = (sh.ds.index.samples(), hello.batch_size);
    let frame_max = move |kind| attached_frame_max(samples, batch_size, kind);
    let taker = std::thread::Builder::new()
        .name(format!("brand-cache-job{id}"))
        .spawn(move || take_messages(&s1, &l1, id, frame_max, tx))?;
    let (s2, l2) = (sh.clone(), link.clone());
    let server = std::thread::Builder::new()
        .name(format!("brand-cache-serve{id}"))
        .spawn(move || serve_requests(&s2, &l2, id, rx))?;
    let mut links = sh.links.lock().unwrap_or_else(|e| e.into_inner());
    links.retain(|(l, threads)| {
        // Forget the links of jobs gone (their threads have ended).
        !(threads.iter().all(|t| t.is_finished()) && Arc::strong_count(l) == 1)
    });
    links.push((link, vec![taker, server]));
    sh.changed.notify_all();
    Ok(())
}

fn refuse(sh: &Shared, link: &Link, why: String) -> io::Result<()> {
    lock(&sh.state).report.jobs_refused += 1;
    link.send(&ToJob::Refused(why))
}

/// The samples the job served already, or why it cannot attach.
fn check_hello(sh: &Shared, h: &Hello) -> std::result::Result<IdBits, String> {
    let name = format!("the cache at {} ({})", sh.socket.display(), sh.ds.dir().display());
    h.check(&sh.digest, &name, sh.memory.size() as u64, |size| {
        batch_bytes(&sh.ds.index, size)
    })
}

/// A job's messages (frames of at most `frame_max` bytes): releases are
/// applied at once, requests go to its server thread. The end of the
/// stream (the job closed, exited or was killed) detaches it; so does a
/// message that is wrong, after a `Failed` answer naming what was wrong.
fn take_messages(
    sh: &Shared,
    link: &Link,
    id: u64,
    frame_max: impl Fn(u8) -> std::result::Result<usize, String>,
    requests: mpsc::Sender<()>,
) {
    loop {
        let frame = match read_frame_within(&mut &link.stream, &frame_max) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let _ = link.send(&ToJob::Failed(format!("the job sent {e}")));
                break;
            }
            Err(_) => break,
        };
        let wrong = match ToCache::decode(frame.0, &frame.1) {
            Ok(ToCache::Next) if link.asking.swap(true, Ordering::SeqCst) => {
                Some("the job sent a request before it had the answer to its last".into())
            }
            Ok(ToCache::Next) => {
                if requests.send(()).is_err() {
                    break;
                }
                None
            }
            Ok(ToCache::Release(ids)) => {
                let mut s = lock(&sh.state);
                let r = s.release(&sh.ds.index, id, &ids);
                drop(s);
                sh.changed.notify_all();
                r.err()
            }
            Ok(ToCache::Hello(_)) => Some("the job sent a second hello (it is attached already)".into()),
            Err(why) => Some(format!("the job sent a malformed message: {why}")),
        };
        if let Some(why) = wrong {
            let _ = link.send(&ToJob::Failed(why));
            break;
        }
    }
    let _ = link.stream.shutdown(std::net::Shutdown::Both);
    lock(&sh.state).remove_job(id);
    sh.changed.notify_all();
}

fn serve_requests(sh: &Shared, link: &Link, id: u64, requests: mpsc::Receiver<()>) {
    for () in requests {
        let reply = next_batch(sh, id);
        // Answered: the job may ask again once it has this.
        link.asking.store(false, Ordering::SeqCst);
        let end = matches!(reply, None | Some(ToJob::Failed(_)));
        if let Some(r) = reply
            && link.send(&r).is_err()
        {
            break;
        }
        if end {
            let _ = link.stream.shutdown(std::net::Shutdown::Both);
            break;
        }
    }
}

/// The job's next batch, waiting for reads; `None` if the job is gone.
fn next_batch(sh: &Shared, id: u64) -> Option<ToJob> {
    let index = &sh.ds.index;
    let mut s = lock(&sh.state);
    let mut seen = (s.progress, Instant::now());
    loop {
        match s.draw(index, id) {
            Draw::Served(batch) => {
                drop(s);
                sh.changed.notify_all();
                return Some(batch);
            }
            Draw::Failed(why) => return Some(ToJob::Failed(why)),
            Draw::Gone => return None,
            // A waiting job lets the reader drop what only laggards need
            // (State::room_for): it should hear of it now, not in 100 ms.
            Draw::Waits { began: true } => sh.changed.notify_all(),
            Draw::Waits { began: false } => {}
        }
        if s.deadlocked(index) {
            return Some(ToJob::Failed(s.deadlock(index)));
        }
        if s.progress != seen.0 {
            seen = (s.progress, Instant::now());
        } else if seen.1.elapsed() > STUCK_AFTER {
            return Some(ToJob::Failed(format!(
                "no progress for {} s: the cache's memory ({} bytes, {} in jobs' live batches) cannot take the samples this job lacks; start the cache with more --memory",
                STUCK_AFTER.as_secs(),
                s.memory_size(),
                s.leased_bytes(index)
            )));
        }
        s = sh
            .changed
            .wait_timeout(s, Duration::from_millis(100))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}
