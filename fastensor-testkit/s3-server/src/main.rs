//! `fastensor-s3-server`: a local S3-compatible server with fault injection, for fastensor's
//! tests and benchmarks only (never a production store).
//!
//! It serves a directory through `s3s-fs` (each subdirectory a bucket), requires SigV4
//! signatures for one access key, and puts a fault layer in front (`/_faults`, see
//! `layer.rs` and the README). Contract with its parent process: once listening it prints
//! exactly one line to stdout, `http://ADDR:PORT`, and flushes it; it exits with status 0 on
//! SIGTERM or SIGINT, 1 when it cannot start, 2 on a bad command line.

#![forbid(unsafe_code)]

mod access;
mod args;
mod faults;
mod layer;
mod meter;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::server::graceful::GracefulShutdown;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::access::{Anyone, SignedForRegion};
use crate::args::{Args, ArgsError, USAGE};
use crate::layer::FaultLayer;

/// How long in-flight requests may run after a shutdown signal before the process exits.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(ArgsError::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(ArgsError::Invalid(message)) => {
            eprintln!("fastensor-s3-server: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fastensor-s3-server: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fastensor-s3-server: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Sets up the store and the listener, prints the URL, and serves until a signal.
async fn serve(args: Args) -> Result<(), String> {
    let root = args.root.display().to_string();
    std::fs::create_dir_all(&args.root).map_err(|e| format!("cannot create {root}: {e}"))?;
    let fs =
        s3s_fs::FileSystem::new(&args.root).map_err(|e| format!("cannot serve {root}: {e:?}"))?;

    let s3 = {
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(args.access_key, args.secret_key));
        if args.anonymous {
            builder.set_access(Anyone);
        } else {
            builder.set_access(SignedForRegion::new(args.region));
        }
        builder.build()
    };
    let bandwidth = args.bandwidth;
    let layer = FaultLayer::new(s3, meter::Meter::new(bandwidth)).anonymous(args.anonymous);

    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "http://{addr}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot print the URL: {e}"))?;
    }

    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;
    let http = ConnBuilder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();

    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(e) => {
                    // Out of file descriptors and the like: keep serving the others.
                    eprintln!("fastensor-s3-server: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        };
        // Small requests (HEAD, ranged GETs) should not wait on Nagle.
        let _ = socket.set_nodelay(true);
        let layer = layer.clone();
        let service = hyper::service::service_fn(move |req| layer.clone().call(req));
        let conn = http.serve_connection(TokioIo::new(socket), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            // Errors here are closed or aborted connections, faults included.
            let _ = conn.await;
        });
    }

    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {}
    }
    Ok(())
}
