//! `delay-relay`: the latency of scripts/netns.py's shaped network (a test
//! tool, not part of brand: this kernel has no netem, so delay comes from user
//! space). A TCP relay: every connection to it is connected on (to the
//! address the client dialled, with `--transparent`, or to `--to`), and each
//! direction's bytes are written on no earlier than `--delay-ms` after they
//! arrived. Reads are up to 1 MiB at a time, so moving bytes costs a few
//! system calls per MiB, not per packet. At most `--limit` bytes wait per
//! direction; then the relay stops reading and TCP's window closes on the
//! sender (back-pressure, as a link's queue gives). A clean end is passed on
//! as one (FIN) after the delay, a reset as a reset.
//!
//!     delay-relay relay --listen 0.0.0.0:7070 --transparent --delay-ms 1
//!     delay-relay relay --listen 127.0.0.1:9000 --to 127.0.0.1:9001 --delay-ms 1
//!     delay-relay sink --listen 10.77.1.2:9100 [--connections N]  # reads each to its end, answers
//!     delay-relay source --to 10.77.1.2:9100 --bytes 1GiB   # prints {"bytes", "secs", "mb_per_s"}
//!     delay-relay probe --delay-ms 1 --bytes 1GiB     # source → relay → sink on 127.0.0.1
//!
//! `relay` prints `relay ready` once it listens.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const READ_BYTES: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("delay-relay: {e}");
        std::process::exit(2);
    }
}

/// The value of `--name`, if given.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn addr(args: &[String], name: &str) -> Result<SocketAddr, String> {
    let v = flag(args, name).ok_or(format!("{name} ADDR:PORT is required"))?;
    v.parse().map_err(|e| format!("{name} {v:?}: {e}"))
}

fn millis(args: &[String], name: &str) -> Result<Duration, String> {
    let v = flag(args, name).unwrap_or("0");
    let ms: f64 = v.parse().map_err(|e| format!("{name} {v:?}: {e}"))?;
    Duration::try_from_secs_f64(ms / 1e3).map_err(|_| format!("{name} {v:?}: milliseconds ≥ 0"))
}

/// A byte count: digits with an optional KiB, MiB or GiB.
fn bytes(args: &[String], name: &str, default: u64) -> Result<u64, String> {
    let Some(v) = flag(args, name) else {
        return Ok(default);
    };
    let (num, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let scale = match unit {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(format!("{name} {v:?}: bytes, KiB, MiB or GiB")),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or(format!("{name} {v:?}: bytes, KiB, MiB or GiB"))
}

fn run(args: &[String]) -> Result<(), String> {
    let cmd = args.first().map(String::as_str).unwrap_or("");
    match cmd {
        "relay" => {
            let listen = addr(args, "--listen")?;
            let to = if args.iter().any(|a| a == "--transparent") {
                None
            } else {
                Some(addr(args, "--to")?)
            };
            let delay = millis(args, "--delay-ms")?;
            let limit = bytes(args, "--limit", 8 << 20)?;
            let ls = listener(listen, to.is_none())?;
            println!("relay ready");
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            relay(ls, to, delay, limit);
            Ok(())
        }
        "sink" => {
            let ls = listener(addr(args, "--listen")?, false)?;
            let n = bytes(args, "--connections", 1)?;
            println!("sink ready");
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            let mut each = Vec::new();
            for _ in 0..n {
                let (c, _) = ls.accept().map_err(|e| e.to_string())?;
                each.push(std::thread::spawn(move || sink(c)));
            }
            for t in each {
                t.join().map_err(|_| "sink panicked".to_string())??;
            }
            Ok(())
        }
        "source" => {
            let r = source(addr(args, "--to")?, bytes(args, "--bytes", 1 << 30)?)?;
            println!("{r}");
            Ok(())
        }
        "probe" => probe(millis(args, "--delay-ms")?, bytes(args, "--bytes", 1 << 30)?),
        _ => Err("usage: delay-relay relay|sink|source|probe (see the source's header)".into()),
    }
}

fn setsockopt<T>(fd: i32, level: i32, name: i32, value: &T) -> std::io::Result<()> {
    // SAFETY: `value` points to a live T of the size passed; fd is a socket
    // this process owns (a bad one is an error return, not UB).
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A listener on `at`; `transparent`: accepting connections to any address
/// routed here (IP_TRANSPARENT, set before bind; needs CAP_NET_ADMIN).
fn listener(at: SocketAddr, transparent: bool) -> Result<TcpListener, String> {
    let SocketAddr::V4(v4) = at else {
        return Err(format!("{at}: IPv4 only"));
    };
    let err = |what: &str| format!("{what} {at}: {}", std::io::Error::last_os_error());
    // SAFETY: socket() has no preconditions; the fd is owned by the listener below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err("socket"));
    }
    // SAFETY: fd is a fresh socket nobody else owns; TcpListener closes it.
    let ls = unsafe { TcpListener::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &one).map_err(|e| format!("SO_REUSEADDR: {e}"))?;
    if transparent {
        setsockopt(fd, libc::SOL_IP, libc::IP_TRANSPARENT, &one).map_err(|e| format!("IP_TRANSPARENT: {e}"))?;
    }
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in of the size passed.
    let r = unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(err("bind"));
    }
    // SAFETY: fd is a bound socket.
    if unsafe { libc::listen(fd, 1024) } != 0 {
        return Err(err("listen"));
    }
    Ok(ls)
}

fn relay(ls: TcpListener, to: Option<SocketAddr>, delay: Duration, limit: u64) {
    for c in ls.incoming() {
        let Ok(c) = c else { continue };
        std::thread::spawn(move || connection(c, to, delay, limit));
    }
}

/// What one direction holds: chunks with the time each may go on, and
/// how the stream ended (None: not yet).
#[derive(Default)]
struct Queue {
    /// Chunks: when each may go on, its buffer and how much of it is data.
    chunks: VecDeque<(Instant, Vec<u8>, usize)>,
    /// Buffers written on, for the reader to fill again (no allocation or
    /// zeroing per read).
    free: Vec<Vec<u8>>,
    held: u64,
    end: Option<(Instant, End)>,
}

#[derive(Clone, Copy)]
enum End {
    Clean,
    Reset,
}

struct Pipe {
    q: Mutex<Queue>,
    cv: Condvar,
}

impl Pipe {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Relays `client` to where it dialled (or `to`), both directions delayed.
fn connection(client: TcpStream, to: Option<SocketAddr>, delay: Duration, limit: u64) {
    let dst = match to {
        Some(a) => a,
        // Transparent: the address the client connected to.
        None => match client.local_addr() {
            Ok(a) => a,
            Err(_) => return,
        },
    };
    let Ok(upstream) = TcpStream::connect_timeout(&dst, Duration::from_secs(10)) else {
        reset(&client);
        return;
    };
    for s in [&client, &upstream] {
        let _ = s.set_nodelay(true);
    }
    let (client, upstream) = (Arc::new(client), Arc::new(upstream));
    let mut threads = Vec::new();
    for (src, dst) in [(client.clone(), upstream.clone()), (upstream.clone(), client.clone())] {
        let pipe = Arc::new(Pipe {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let (p, s) = (pipe.clone(), src.clone());
        threads.push(std::thread::spawn(move || read_side(&s, &p, delay, limit)));
        threads.push(std::thread::spawn(move || write_side(&dst, &src, &pipe)));
    }
    for t in threads {
        let _ = t.join();
    }
}

fn read_side(src: &TcpStream, pipe: &Pipe, delay: Duration, limit: u64) {
    let mut src = src;
    loop {
        let mut buf = pipe.lock().free.pop().unwrap_or_else(|| vec![0u8; READ_BYTES]);
        let got = loop {
            match src.read(&mut buf) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let mut q = pipe.lock();
        while q.held > limit {
            q = pipe.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        let due = Instant::now() + delay;
        match got {
            Ok(0) | Err(_) => {
                q.end = Some((due, if got.is_ok() { End::Clean } else { End::Reset }));
                pipe.cv.notify_all();
                return;
            }
            Ok(n) => {
                q.held += n as u64;
                q.chunks.push_back((due, buf, n));
                pipe.cv.notify_all();
            }
        }
    }
}

/// Writes what `pipe` holds to `dst` once due; passes the end on. If `dst`
/// fails, `src` is reset (its sender learns the connection broke).
fn write_side(dst: &TcpStream, src: &TcpStream, pipe: &Pipe) {
    let mut dst_w = dst;
    loop {
        let mut q = pipe.lock();
        let next_due = q.chunks.front().map(|c| c.0).or(q.end.map(|e| e.0));
        let Some(due) = next_due else {
            drop(pipe.cv.wait(q));
            continue;
        };
        let now = Instant::now();
        if due > now {
            drop(pipe.cv.wait_timeout(q, due - now));
            continue;
        }
        let Some((_, chunk, len)) = q.chunks.pop_front() else {
            // Only the end is left.
            let end = q.end.map(|e| e.1);
            drop(q);
            match end {
                Some(End::Clean) => {
                    let _ = dst.shutdown(Shutdown::Write);
                }
                _ => reset(dst),
            }
            return;
        };
        q.held -= len as u64;
        pipe.cv.notify_all();
        drop(q);
        let written = dst_w.write_all(&chunk[..len]);
        pipe.lock().free.push(chunk);
        if written.is_err() {
            reset(src);
            // Stop the reader of `src` waiting for room.
            let mut q = pipe.lock();
            q.held = 0;
            q.chunks.clear();
            pipe.cv.notify_all();
            return;
        }
    }
}

/// An abortive close: the peer gets a reset, not a clean end. The socket
/// is shut down for reading so this connection's threads end; the reset
/// goes when its last handle closes (SO_LINGER 0).
fn reset(s: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, &linger);
    let _ = s.shutdown(Shutdown::Read);
}

/// Reads until the end, then answers one byte (so the source times the
/// whole path); the byte count.
fn sink(mut c: TcpStream) -> Result<u64, String> {
    let mut buf = vec![0u8; READ_BYTES];
    let mut total = 0u64;
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("sink: {e}")),
        }
    }
    c.write_all(&[1]).map_err(|e| format!("sink: {e}"))?;
    Ok(total)
}

/// Sends `n` bytes to `to`, ends, waits for the sink's answer; a JSON line.
fn source(to: SocketAddr, n: u64) -> Result<String, String> {
    let mut c = TcpStream::connect(to).map_err(|e| format!("{to}: {e}"))?;
    let buf = vec![7u8; READ_BYTES];
    let start = Instant::now();
    let mut left = n;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        c.write_all(&buf[..k]).map_err(|e| format!("{to}: {e}"))?;
        left -= k as u64;
    }
    c.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
    let mut ack = [0u8; 1];
    c.read_exact(&mut ack)
        .map_err(|e| format!("{to}: no answer from the sink: {e}"))?;
    let secs = start.elapsed().as_secs_f64();
    Ok(format!(
        "{{\"bytes\": {n}, \"secs\": {secs:.4}, \"mb_per_s\": {:.1}}}",
        n as f64 / secs / 1e6
    ))
}

/// source → relay (delaying) → sink, all on 127.0.0.1 in this process.
fn probe(delay: Duration, n: u64) -> Result<(), String> {
    let any: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
    let sink_ls = TcpListener::bind(any).map_err(|e| e.to_string())?;
    let sink_at = sink_ls.local_addr().map_err(|e| e.to_string())?;
    let relay_ls = TcpListener::bind(any).map_err(|e| e.to_string())?;
    let relay_at = relay_ls.local_addr().map_err(|e| e.to_string())?;
    let sink_thread =
        std::thread::spawn(move || sink_ls.accept().map_err(|e| e.to_string()).and_then(|(c, _)| sink(c)));
    std::thread::spawn(move || relay(relay_ls, Some(sink_at), delay, 8 << 20));
    let r = source(relay_at, n)?;
    let got = sink_thread.join().map_err(|_| "sink panicked".to_string())??;
    if got != n {
        return Err(format!("the sink got {got} bytes of {n}"));
    }
    println!("{r}");
    Ok(())
}
