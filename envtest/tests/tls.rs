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

/// A fresh directory under the system's temp dir for one test.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "envtest-{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A client built from a kubeconfig file, as kubectl or `Client::try_default` would, optionally
/// pointed at another address.
async fn client_from_kubeconfig(path: &std::path::Path, server: Option<&str>) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    if let Some(server) = server {
        config.cluster_url = server.parse().unwrap();
    }
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn a_kubeconfig_written_before_a_restart_works_after_it_with_a_cert_dir() {
    let dir = temp_dir("cert-dir");
    let kubeconfig = dir.with_extension("kubeconfig");
    let first = envtest::Server::start(envtest::Config::default().cert_dir(&dir).token("s3cret"))
        .await
        .unwrap();
    first.write_kubeconfig(&kubeconfig).unwrap();
    let addr = first.addr();
    let ca = first.ca_certificate_pem().unwrap().to_owned();
    first.shutdown().await;
    for file in ["ca.crt", "ca.key", "apiserver.crt", "apiserver.key"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    #[cfg(unix)]
    for key in ["ca.key", "apiserver.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join(key)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }
    let serving = std::fs::read(dir.join("apiserver.crt")).unwrap();

    // Restarted on the same directory and, if it is still free, the same port.
    let second =
        match envtest::Server::start(envtest::Config::default().cert_dir(&dir).token("s3cret").listen(addr)).await {
            Ok(server) => server,
            Err(_) => envtest::Server::start(envtest::Config::default().cert_dir(&dir).token("s3cret"))
                .await
                .unwrap(),
        };
    assert_eq!(
        second.ca_certificate_pem(),
        Some(ca.as_str()),
        "a new CA after a restart"
    );
    assert_eq!(
        std::fs::read(dir.join("apiserver.crt")).unwrap(),
        serving,
        "the serving certificate was reused"
    );
    let moved = (second.addr() != addr).then(|| second.base_url().to_owned());
    let api: Api<ConfigMap> = Api::namespaced(client_from_kubeconfig(&kubeconfig, moved.as_deref()).await, "default");
    api.create(&PostParams::default(), &configmap("after-restart"))
        .await
        .unwrap();
    second.shutdown().await;

    // On an address its serving certificate does not name: a new one, signed by the same CA.
    let third = envtest::Server::start(
        envtest::Config::default()
            .cert_dir(&dir)
            .token("s3cret")
            .listen("127.0.0.2:0".parse().unwrap()),
    )
    .await
    .unwrap();
    assert_eq!(third.ca_certificate_pem(), Some(ca.as_str()));
    assert_ne!(std::fs::read(dir.join("apiserver.crt")).unwrap(), serving);
    let api: Api<ConfigMap> = Api::namespaced(
        client_from_kubeconfig(&kubeconfig, Some(third.base_url())).await,
        "default",
    );
    api.list(&Default::default()).await.unwrap();
    third.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&kubeconfig);
}

#[tokio::test]
async fn a_cert_dir_with_half_a_ca_is_refused_not_replaced() {
    let dir = temp_dir("half-ca");
    let server = envtest::Server::start(envtest::Config::default().cert_dir(&dir))
        .await
        .unwrap();
    server.shutdown().await;
    std::fs::remove_file(dir.join("ca.key")).unwrap();
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    assert!(
        envtest::Server::start(envtest::Config::default().cert_dir(&dir))
            .await
            .is_err()
    );
    assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), ca);
    let _ = std::fs::remove_dir_all(&dir);
}
