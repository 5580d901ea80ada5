//! A factory's informers under tokio's paused clock (`start_paused = true`): the informer's
//! decoding thread is not one of tokio's, so the clock runs on while it decodes;
//! `decode_on_blocking_pool(true)` holds the clock still for the decode instead. The API
//! server is in memory (a tower `Service` behind `kube::Client`): a network wait would let the
//! paused clock advance on its own.

use std::time::Duration;

use factory::SharedInformerFactory;
use k8s_openapi::api::core::v1::ConfigMap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// An API server in memory: a list of one ConfigMap, and watches that end at once (the
/// reflector re-watches after a backoff of paused time).
#[derive(Clone)]
struct OneConfigMap;

impl tower::Service<http::Request<kube::client::Body>> for OneConfigMap {
    type Response = http::Response<kube::client::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let watch = request
            .uri()
            .query()
            .is_some_and(|query| query.split('&').any(|pair| pair == "watch=true"));
        let body: &'static str = if watch {
            ""
        } else {
            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"a","namespace":"default","resourceVersion":"5"}}]}"#
        };
        std::future::ready(Ok(http::Response::new(body.as_bytes().to_vec().into())))
    }
}

/// A transform that takes real time, as decoding a large list page does; it runs where the
/// page is decoded.
fn slow(cm: ConfigMap) -> ConfigMap {
    std::thread::sleep(Duration::from_millis(300));
    cm
}

/// Paused time from starting a factory's ConfigMap informer to its cache synced.
async fn paused_time_to_sync(decode_on_blocking_pool: bool) -> Duration {
    let factory = SharedInformerFactory::builder(kube::Client::new(OneConfigMap, "default"))
        .transform::<ConfigMap>(slow)
        .decode_on_blocking_pool(decode_on_blocking_pool)
        .build();
    let informer = factory.informer_for::<ConfigMap>().unwrap();
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    let elapsed = start.elapsed();
    assert!(synced.values().all(|ok| *ok), "{synced:?}");
    assert!(informer.indexer().get_by_key("default/a").is_some());
    shutdown.cancel();
    factory.shutdown().await;
    elapsed
}

#[tokio::test(start_paused = true)]
async fn decode_on_blocking_pool_holds_paused_time_still_while_a_page_is_decoded() {
    // On the decoding thread the runtime looks idle during the 300 ms decode, and the clock
    // jumps from timer to timer (wait_for_cache_sync polls every 10 ms of it).
    let on_the_thread = paused_time_to_sync(false).await;
    assert!(on_the_thread >= Duration::from_secs(1), "{on_the_thread:?}");
    // On the blocking pool it stands still until the decode is done.
    let on_the_pool = paused_time_to_sync(true).await;
    assert!(on_the_pool < Duration::from_millis(100), "{on_the_pool:?}");
}
