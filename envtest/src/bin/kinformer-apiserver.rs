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

/// envtest's API server as a process (see the module doc).
#[derive(clap::Parser)]
#[command(name = "kinformer-apiserver", version)]
struct Args {
    /// Address to listen on (port 0: any free port; the URL is printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server here (mode 0600, created fresh, renamed into place).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Require this bearer token on every request but the health probes (visible in `ps`:
    /// prefer --token-file).
    #[arg(long, conflicts_with = "token_file")]
    token: Option<String>,
    /// Require the bearer token read from this file (surrounding whitespace trimmed).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Events kept per resource for watches that resume from a resourceVersion.
    #[arg(long)]
    watch_cache_size: Option<usize>,
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
    let args = <Args as clap::Parser>::parse();
    let mut config = envtest::Config::default().listen(args.listen);
    let token = match (args.token, args.token_file) {
        (Some(t), _) => Some(t),
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
