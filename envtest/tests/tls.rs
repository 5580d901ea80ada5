//! envtest over HTTPS (`Config::tls`): kube's client verifies the server against the CA the
//! server made, a client that does not trust that CA is refused, a watch streams over TLS, and a
//! client that connects and never finishes its handshake holds up nobody else.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};

fn configmap(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm
}

#[tokio::test]
async fn the_client_verifies_the_server_against_its_ca_and_watches_over_tls() {
    let env = envtest::Server::start(envtest::Config::default().tls().token("s3cret"))
        .await
        .unwrap();
    assert!(env.base_url().starts_with("https://127.0.0.1:"), "{}", env.base_url());
    let pem = env.ca_certificate_pem().unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");

    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let list = api.list(&Default::default()).await.unwrap();
    let mut events = api
        .watch(
            &WatchParams::default(),
            list.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &configmap("over-tls"))
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("an event within 10 s")
        .unwrap();
    match event {
        Some(WatchEvent::Added(cm)) => assert_eq!(cm.metadata.name.as_deref(), Some("over-tls")),
        other => panic!("expected the ADDED event, got {other:?}"),
    }

    // The same server, but a client that trusts only the system's roots: the handshake fails.
    let mut untrusting = env.kube_config();
    untrusting.root_cert = None;
    let api: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(untrusting).unwrap(), "default");
    match api.list(&Default::default()).await {
        Err(kube::Error::Api(status)) => panic!("an HTTP answer without a trusted certificate: {status:?}"),
        Err(_) => {}
        Ok(_) => panic!("a client that does not trust the CA was served"),
    }
    env.shutdown().await;
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_blocks_no_one() {
    let env = envtest::Server::start(envtest::Config::default().tls()).await.unwrap();
    // Ten connections that never send a ClientHello.
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(tokio::net::TcpStream::connect(env.addr()).await.unwrap());
    }
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    tokio::time::timeout(Duration::from_secs(5), api.list(&Default::default()))
        .await
        .expect("served while ten handshakes hang")
        .unwrap();
    drop(silent);
    env.shutdown().await;
}
