//! `kinformer-apiserver --listen 127.0.0.1:0 --kubeconfig PATH [--token-file FILE | --token T]`
//!
//! Runs envtest's API server as a process (for kubectl and for examples run by hand): prints the
//! URL on stdout, writes a kubeconfig that kubectl and `kube::Client::try_default()` accept, and
//! serves until SIGINT or SIGTERM.
//!
//! With `--token-file FILE` (or `--token T`, which anyone who can run `ps` sees) every request
//! but the health probes needs that bearer token, and the kubeconfig carries it. The kubeconfig
//! is written mode 0600, created fresh and renamed into place. Without a token the server is
//! open to every local user: kubectl sends bearer tokens only over HTTPS (observed with kubectl
//! 1.32: no `Authorization` header on an `http://` server), so a token on this plain-HTTP server
//! locks kubectl out, and a random token by default has to wait for TLS serving.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: kinformer-apiserver [--listen 127.0.0.1:0] [--kubeconfig PATH] \
     [--token-file FILE | --token TOKEN] [--watch-cache-size N]";

struct Args {
    listen: SocketAddr,
    kubeconfig: Option<PathBuf>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    watch_cache_size: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        kubeconfig: None,
        token: None,
        token_file: None,
        watch_cache_size: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (flag, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--listen" => {
                args.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?;
            }
            "--kubeconfig" => args.kubeconfig = Some(PathBuf::from(value()?)),
            "--token" => args.token = Some(value()?),
            "--token-file" => args.token_file = Some(PathBuf::from(value()?)),
            "--watch-cache-size" => {
                args.watch_cache_size = Some(value()?.parse().map_err(|e| format!("--watch-cache-size: {e}"))?);
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut config = envtest::Config::default().listen(args.listen);
    let token = match (args.token, args.token_file) {
        (Some(_), Some(_)) => {
            eprintln!("--token and --token-file exclude each other\n{USAGE}");
            return ExitCode::from(2);
        }
        (Some(t), None) => Some(t),
        (None, Some(file)) => match std::fs::read_to_string(&file) {
            Ok(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
            Ok(_) => {
                eprintln!("kinformer-apiserver: {} is empty", file.display());
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("kinformer-apiserver: reading {}: {e}", file.display());
                return ExitCode::from(2);
            }
        },
        (None, None) => None,
    };
    if let Some(t) = token {
        config = config.token(t);
    }
    if let Some(n) = args.watch_cache_size {
        config = config.watch_cache_size(n);
    }
    let server = match envtest::Server::start(config).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kinformer-apiserver: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &args.kubeconfig
        && let Err(e) = server.write_kubeconfig(path)
    {
        eprintln!("kinformer-apiserver: writing {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("{}", server.base_url());
    shutdown_signal().await;
    server.shutdown().await;
    ExitCode::SUCCESS
}
