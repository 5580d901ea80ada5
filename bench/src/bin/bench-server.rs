//! `bench-server --kind configmaps --count N --updates M`: the benchmark's API server.
//!
//! Serves one resource's cluster-wide collection from bytes encoded at start (see the crate
//! doc): `GET <path>?limit=&continue=` lists (the `continue` token is the next offset), and
//! `GET <path>?watch=true` opens a watch that stays quiet until `POST /bench/go`, then streams
//! the M prepared `MODIFIED` events and stays open. Each `go` releases exactly one watch, so
//! a client's update phase starts when it says so (after its cache synced), and a watch it
//! opened early does not race its initial list. Prints `http://127.0.0.1:PORT` on stdout once
//! it listens and serves until killed or until its stdin closes.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use kinformer_bench::{Encoded, Kind};
use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;

/// The benchmark's API server (see the module doc).
#[derive(Parser)]
struct Args {
    /// The resource to serve.
    #[arg(long, value_enum)]
    kind: Kind,
    /// Objects in the list.
    #[arg(long)]
    count: usize,
    /// MODIFIED events a released watch streams.
    #[arg(long, default_value_t = 0)]
    updates: usize,
    /// Port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
}

struct Served {
    kind: Kind,
    data: Encoded,
    /// One permit per `POST /bench/go`; a watch takes one before it streams.
    go: Semaphore,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let served = Arc::new(Served {
        kind: args.kind,
        data: Encoded::new(args.kind, args.count, args.updates),
        go: Semaphore::new(0),
    });
    let app = Router::new()
        .route(args.kind.path(), get(collection))
        .route("/bench/go", post(go))
        .with_state(served);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    println!("http://{}", listener.local_addr()?);
    // As Go's net/http, and so kube-apiserver: no Nagle delay on small writes.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    // The driver reads the URL line by line.
    let stdin_closed = async {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    };
    axum::serve(listener, app).with_graceful_shutdown(stdin_closed).await
}

async fn go(State(served): State<Arc<Served>>) -> StatusCode {
    served.go.add_permits(1);
    StatusCode::OK
}

async fn collection(State(served): State<Arc<Served>>, Query(query): Query<HashMap<String, String>>) -> Response {
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    if watch {
        return watch_response(served).await;
    }
    let number = |key: &str| query.get(key).and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    let page = served.data.page(served.kind, number("continue"), number("limit"));
    ([(header::CONTENT_TYPE, "application/json")], page).into_response()
}

/// Headers at once, as an API server sends them; events once a `go` released this watch.
async fn watch_response(served: Arc<Served>) -> Response {
    let events = futures::stream::once(async move {
        let released = match served.go.acquire().await {
            Ok(permit) => {
                permit.forget();
                true
            }
            Err(_) => false,
        };
        let events = if released {
            served.data.events.clone()
        } else {
            Vec::new()
        };
        futures::stream::iter(events.into_iter().map(Ok::<Bytes, std::io::Error>))
    })
    .flatten()
    .chain(futures::stream::pending());
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(events)).into_response()
}
