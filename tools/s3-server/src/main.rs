//! `brand-s3-server --dir DIR [--port P] [--access-key AK] [--secret-key SK]`:
//! serve DIR over S3 on 127.0.0.1, print `endpoint http://127.0.0.1:PORT`
//! once listening, and serve until SIGTERM, SIGINT or the end of stdin.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use brand_s3_server::{Options, Server};
use clap::Parser;

/// An S3-compatible server on 127.0.0.1 for brand's tests and benchmarks,
/// with fault injection and counters under /_admin/ (see README.md).
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The directory to serve; each subdirectory is a bucket. Created if missing.
    #[arg(long)]
    dir: PathBuf,
    /// The port on 127.0.0.1 (0: any free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    #[arg(long, default_value = "brand-test-ak")]
    access_key: String,
    #[arg(long, default_value = "brand-test-sk")]
    secret_key: String,
    /// The region requests must be signed for.
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Serve unsigned requests (a public bucket, for `https://` URLs) instead
    /// of requests signed with the keys above.
    #[arg(long)]
    anonymous: bool,
    /// Do not stop at the end of stdin (by default it does, so that a parent
    /// that dies does not leave it running).
    #[arg(long)]
    no_stdin: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let opts = Options {
        access_key: args.access_key,
        secret_key: args.secret_key,
        port: args.port,
        region: args.region,
        anonymous: args.anonymous,
    };
    let server = match Server::start(&args.dir, opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("brand-s3-server: cannot serve {}: {e}", args.dir.display());
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "endpoint {}", server.endpoint())
        .and_then(|()| out.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    drop(out);

    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("brand-s3-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
        if !args.no_stdin {
            std::thread::spawn(move || {
                let mut sink = [0u8; 4096];
                let mut stdin = std::io::stdin().lock();
                // Read (and ignore) until EOF or an error.
                while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
                let _ = eof_tx.send(());
            });
        }
        let stdin_closed = async {
            if args.no_stdin {
                std::future::pending::<()>().await;
            }
            let _ = eof_rx.await;
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            r = tokio::signal::ctrl_c() => r?,
            () = stdin_closed => {}
        }
        std::io::Result::Ok(())
    });
    drop(server);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("brand-s3-server: {e}");
            ExitCode::FAILURE
        }
    }
}
