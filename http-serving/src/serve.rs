//! [`serve`]: the accept loop and one task per connection.
//!
//! The accept loop takes a slot of the connection cap before it accepts, so a connection over
//! the cap waits in the kernel's backlog. Each connection's task sets `TCP_NODELAY` and TCP
//! keep-alive, runs the TLS handshake under its deadline, then serves HTTP/1.1 with hyper while
//! it watches the connection's [`Phase`]: the I/O wrapper reports bytes read, the service
//! reports each request and (through its response body) the end of each response, and the task
//! closes the connection when the phase's deadline passes.

use crate::ServingConfig;
use crate::activity::Phase;
use axum::Router;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Serves `router` on `listener` (HTTPS when `tls` is given, HTTP/1.1 over it) with `config`'s
/// timeouts and connection cap, until `cancel` fires.
///
/// On `cancel`: stops accepting, closes connections with no request in flight at once, lets
/// requests in flight finish (their connections close after the response), and returns when
/// every connection is closed. The future owns every connection task: dropping it (or aborting
/// the task that runs it) closes them all.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    config: ServingConfig,
    cancel: CancellationToken,
) {
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let acceptor = tls.map(TlsAcceptor::from);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = accept_within_cap(&listener, &slots, config.max_connections) => match accepted {
                Ok((tcp, peer, slot)) => {
                    connections.spawn(connection(
                        tcp,
                        peer,
                        slot,
                        acceptor.clone(),
                        router.clone(),
                        config.clone(),
                        cancel.clone(),
                    ));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off a little, as hyper does.
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Waits for a slot under the cap, then for a connection. Cancel-safe: both waits are.
async fn accept_within_cap(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    max_connections: usize,
) -> io::Result<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    if slots.available_permits() == 0 {
        tracing::debug!(
            max_connections,
            "connection cap reached: new connections wait until one closes"
        );
    }
    let slot = slots.clone().acquire_owned().await.map_err(io::Error::other)?;
    let (tcp, peer) = listener.accept().await?;
    Ok((tcp, peer, slot))
}

/// One connection, from its TCP socket to its close. Holds its slot of the cap throughout.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    _slot: OwnedSemaphorePermit,
    acceptor: Option<TlsAcceptor>,
    router: Router,
    config: Arc<ServingConfig>,
    cancel: CancellationToken,
) {
    // TCP_NODELAY on every connection, as Go's net/http (and so kube-apiserver) sets it:
    // without it, Nagle's algorithm holds a small watch event until the previous one is
    // acknowledged, and the client's delayed ACK turns that into milliseconds of latency.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    if let Some(time) = config.tcp_keepalive {
        let keepalive = socket2::TcpKeepalive::new().with_time(time);
        if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive) {
            tracing::debug!(%peer, error = %e, "could not set TCP keep-alive");
        }
    }
    let Some(acceptor) = acceptor else {
        return serve_http(tcp, peer, router, &config, &cancel).await;
    };
    let handshake = tokio::time::timeout(config.tls_handshake_timeout, acceptor.accept(tcp));
    let stream = tokio::select! {
        () = cancel.cancelled() => return,
        result = handshake => match result {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, timeout = ?config.tls_handshake_timeout, "TLS handshake timed out: connection closed");
                return;
            }
        },
    };
    serve_http(stream, peer, router, &config, &cancel).await;
}

/// Serves HTTP/1.1 on `io` until the client closes, a deadline passes, or `cancel` fires.
async fn serve_http<IO>(io: IO, peer: SocketAddr, router: Router, config: &ServingConfig, cancel: &CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tracker = Arc::new(Tracker {
        phase: Mutex::new(Phase::opened(Instant::now())),
        changed: Notify::new(),
    });
    let io = TokioIo::new(Watched {
        io,
        tracker: tracker.clone(),
    });
    let service_tracker = tracker.clone();
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let in_flight = InFlight::start(service_tracker.clone());
        let router = router.clone();
        async move {
            let response = router.oneshot(request).await;
            response.map(|response| {
                response.map(|body| TrackedBody {
                    inner: body,
                    _in_flight: in_flight,
                })
            })
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        // Ours (see activity.rs): hyper's would also cut idle keep-alive connections.
        .header_read_timeout(None)
        .max_header_size(config.max_header_bytes)
        // The read buffer must hold the largest head; hyper requires at least 8 KiB.
        .max_buf_size(config.max_header_bytes.saturating_add(8192).max(8192));
    let conn = http.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut draining = false;
    loop {
        let changed = tracker.changed.notified();
        let deadline = tracker.phase().deadline(config);
        let expired = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = cancel.cancelled(), if !draining => {
                if deadline.is_some() {
                    // Nothing in flight: nothing to finish.
                    return;
                }
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            () = changed => {}
            () = expired => {
                // Re-read: a request may have started since.
                if let Some((at, why)) = tracker.phase().deadline(config)
                    && at <= Instant::now()
                {
                    tracing::debug!(%peer, reason = why.as_str(), "connection closed");
                    return;
                }
            }
        }
    }
}

/// A connection's [`Phase`], shared by its I/O, its service and its task.
struct Tracker {
    phase: Mutex<Phase>,
    /// Woken on every transition, so the task re-reads the deadline.
    changed: Notify,
}

impl Tracker {
    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, step: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let next = step(*phase);
        if next != *phase {
            *phase = next;
            drop(phase);
            self.changed.notify_one();
        }
    }
}

/// One request in flight: made when the handler is called, dropped with the response body
/// (after its last byte is sent, or with the connection) or with the handler's future.
struct InFlight(Arc<Tracker>);

impl InFlight {
    fn start(tracker: Arc<Tracker>) -> InFlight {
        tracker.update(Phase::on_request);
        InFlight(tracker)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = Instant::now();
        self.0.update(|phase| phase.on_response_end(now));
    }
}

/// A response body that keeps its request in flight until hyper drops it.
struct TrackedBody {
    inner: axum::body::Body,
    _in_flight: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's I/O, reporting bytes read to its [`Tracker`].
struct Watched<IO> {
    io: IO,
    tracker: Arc<Tracker>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let now = Instant::now();
            self.tracker.update(|phase| phase.on_read(now));
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
