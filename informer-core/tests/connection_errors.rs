//! A list that gets no answer names the server it went to and why: an informer whose client
//! points at a closed port logs `list failed: connection refused to https://127.0.0.1:<port>
//! (configmaps)`, and the error its watch error handler gets names the request's URL. Alone in
//! its test binary: it installs the process's global `tracing` subscriber to read the lines.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use envtest::logs::Logs;
use informer_core::{ApiListerWatcher, ErrorChain, InformerConfig, ReflectorConfig, SharedIndexInformer};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio_util::sync::CancellationToken;

/// A port nothing listens on: bound, then released.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The informer's first list error, as its watch error handler sees it (the chain, printed
/// once), with the reflector stopped after it.
async fn first_list_error(client: kube::Client) -> String {
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::new(kube::Api::<ConfigMap>::all(client)),
        InformerConfig::default().reflector(ReflectorConfig::default().name("configmaps")),
    );
    let shutdown = CancellationToken::new();
    let seen: Arc<Mutex<Option<String>>> = Arc::default();
    informer
        .set_watch_error_handler({
            let (seen, shutdown) = (seen.clone(), shutdown.clone());
            move |e| {
                seen.lock().unwrap().get_or_insert_with(|| ErrorChain(e).to_string());
                shutdown.cancel();
            }
        })
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), informer.run(shutdown))
        .await
        .expect("the informer stops after its first list error");
    seen.lock()
        .unwrap()
        .take()
        .expect("the watch error handler saw the list's error")
}

#[tokio::test]
async fn a_list_refused_names_the_server_and_the_cause() {
    let logs = Logs::default();
    logs.set_global_default(tracing::Level::WARN).unwrap();

    // A client built by informer_core::client names the server in every transport error.
    let server = format!("https://127.0.0.1:{}", closed_port());
    let client = informer_core::client::from_config(kube::Config::new(server.parse().unwrap())).unwrap();
    let error = first_list_error(client).await;
    assert!(
        error.contains(&format!("GET {server}/api/v1/configmaps?")),
        "the error names the request's URL: {error}"
    );
    assert!(
        error.to_lowercase().contains("connection refused"),
        "and the cause: {error}"
    );
    let text = logs.text();
    let line = text
        .lines()
        .find(|line| line.contains("list failed"))
        .unwrap_or_else(|| panic!("a list failed line in:\n{text}"));
    assert!(
        line.contains(&format!("list failed: connection refused to {server} (configmaps)")),
        "{line}"
    );
    assert!(line.contains(&format!("server={server}")), "{line}");
    assert!(line.contains(" WARN "), "{line}");

    // A client built any other way: the cause and the resource, no server to name.
    let other = format!("https://127.0.0.1:{}", closed_port());
    let client = kube::Client::try_from(kube::Config::new(other.parse().unwrap())).unwrap();
    let error = first_list_error(client).await;
    assert!(error.to_lowercase().contains("connection refused"), "{error}");
    let text = logs.text();
    assert!(
        text.lines()
            .any(|line| line.contains("list failed: connection refused (configmaps)")),
        "{text}"
    );
}
