//! The relay on 127.0.0.1 (`--to`): bytes pass intact and in order both
//! ways, a clean end is passed on as one, a reset as a reset.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Relay {
    child: Child,
    at: String,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A relay to `upstream` with `delay_ms`, listening on a free port.
fn relay(upstream: &TcpListener, delay_ms: &str) -> Relay {
    let free = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = free.local_addr().expect("addr").to_string();
    drop(free);
    let to = upstream.local_addr().expect("addr").to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_delay-relay"))
        .args([
            "relay",
            "--listen",
            &at,
            "--to",
            &to,
            "--delay-ms",
            delay_ms,
            "--limit",
            "1MiB",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("delay-relay");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready line");
    assert_eq!(line.trim(), "relay ready");
    Relay { child, at }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn bytes_pass_intact_both_ways_and_a_clean_end_is_passed_on() {
    let upstream = TcpListener::bind("127.0.0.1:0").expect("bind");
    let r = relay(&upstream, "2");
    // More than the relay holds (1 MiB): back-pressure, not loss.
    let sent = pattern(5 << 20);
    let mut client = TcpStream::connect(&r.at).expect("connect");
    let writer = {
        let mut c = client.try_clone().expect("clone");
        let sent = sent.clone();
        std::thread::spawn(move || {
            c.write_all(&sent).expect("write");
            c.shutdown(Shutdown::Write).expect("shutdown");
        })
    };
    let (mut server, _) = upstream.accept().expect("accept");
    let mut got = Vec::new();
    server.read_to_end(&mut got).expect("read to the clean end");
    writer.join().expect("writer");
    assert!(
        got == sent,
        "{} bytes came of {}, or not in order",
        got.len(),
        sent.len()
    );
    server.write_all(b"answer").expect("answer");
    drop(server);
    let mut back = Vec::new();
    client.read_to_end(&mut back).expect("the answer, then a clean end");
    assert_eq!(back, b"answer");
}

#[test]
fn a_reset_is_passed_on_as_a_reset() {
    let upstream = TcpListener::bind("127.0.0.1:0").expect("bind");
    let r = relay(&upstream, "1");
    let mut client = TcpStream::connect(&r.at).expect("connect");
    client.write_all(b"some").expect("write");
    let (mut server, _) = upstream.accept().expect("accept");
    let mut four = [0u8; 4];
    server.read_exact(&mut four).expect("the bytes before the reset");
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid linger of the size passed, on the client's own socket.
    let rc = unsafe {
        libc::setsockopt(
            client.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    drop(client);
    server.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut rest = Vec::new();
    let e = server.read_to_end(&mut rest).expect_err("a reset, not a clean end");
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
}
