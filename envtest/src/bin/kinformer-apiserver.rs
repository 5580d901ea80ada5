//! `kinformer-apiserver --listen 127.0.0.1:0 --kubeconfig PATH [--token-file FILE | --token T]
//! [--cert-dir DIR] [--insecure-http]`
//!
//! Runs envtest's API server as a process (for kubectl and for examples run by hand): prints the
//! URL on stdout, writes a kubeconfig that kubectl and `kube::Client::try_default()` accept, and
//! serves until SIGINT or SIGTERM.
//!
//! Secure by default, as kube-apiserver: it serves HTTPS (`--tls`, the default) with a CA and
//! serving certificate made at start, and every request but the health probes needs a bearer
//! token. The token is `--token-file FILE`'s (or `--token T`'s, which anyone who can run `ps`
//! sees), else 32 random bytes made at start and written only into the kubeconfig, which
//! `--kubeconfig` then requires. The kubeconfig (server, CA, token) is written mode 0600,
//! created fresh and renamed into place.
//!
//! `--cert-dir DIR` keeps the CA and serving key pair in DIR (`ca.crt`, `ca.key`,
//! `apiserver.crt`, `apiserver.key`, as kube-apiserver's `--cert-dir` and kubeadm name them),
//! created on first start and reused after, and the generated token in `DIR/token` (mode 0600):
//! a kubeconfig written by one run still works against the next, so clients survive a restart.
//!
//! `--insecure-http` serves plain HTTP instead, with no token unless one is given: kubectl sends
//! bearer tokens only over HTTPS (observed with kubectl 1.32: no `Authorization` header on an
//! `http://` server), so a token would lock kubectl out there. The benchmarks use it to measure
//! clients rather than TLS.

#![forbid(unsafe_code)]
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
    /// Serve HTTPS with a CA made at start (the default; the CA goes into the kubeconfig).
    #[arg(long, conflicts_with = "insecure_http")]
    tls: bool,
    /// Serve plain HTTP, with no bearer token unless --token or --token-file gives one
    /// (kubectl sends tokens only over HTTPS). For benchmarks and debugging with curl.
    #[arg(long)]
    insecure_http: bool,
    /// Keep the CA, serving key pair and generated token here (created on first start, reused
    /// after), so kubeconfigs stay valid across restarts. Implies HTTPS.
    #[arg(long, conflicts_with = "insecure_http")]
    cert_dir: Option<PathBuf>,
    /// Connections served at once; more wait until one closes.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Events kept per resource for watches that resume from a resourceVersion.
    #[arg(long)]
    watch_cache_size: Option<usize>,
}

/// 32 bytes from the thread-local CSPRNG (ChaCha, seeded from the OS), hex-encoded.
fn random_token() -> String {
    use std::fmt::Write;
    rand::random::<[u8; 32]>()
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The token kept in `dir/token`, made (32 random bytes, mode 0600) on first use.
fn stored_token(dir: &std::path::Path) -> std::io::Result<String> {
    use std::io::Write;
    let path = dir.join("token");
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_owned()),
        Ok(_) => return Err(std::io::Error::other("the file is empty")),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)?;
    let token = random_token();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&path)?;
    file.write_all(token.as_bytes())?;
    file.sync_all()?;
    Ok(token)
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
        (None, None) if args.insecure_http => None,
        (None, None) => {
            if args.kubeconfig.is_none() {
                eprintln!(
                    "kinformer-apiserver: the generated token is written only into the kubeconfig: \
                     pass --kubeconfig PATH (or --token-file FILE, or --insecure-http)"
                );
                return ExitCode::from(2);
            }
            match &args.cert_dir {
                Some(dir) => match stored_token(dir) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        eprintln!("kinformer-apiserver: the token in {}: {e}", dir.display());
                        return ExitCode::FAILURE;
                    }
                },
                None => Some(random_token()),
            }
        }
    };
    if let Some(t) = token {
        config = config.token(t);
    }
    if !args.insecure_http {
        config = config.tls();
    }
    if let Some(dir) = args.cert_dir {
        config = config.cert_dir(dir);
    }
    if let Some(n) = args.max_connections {
        config = config.serving(envtest::ServingConfig::default().max_connections(n));
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
