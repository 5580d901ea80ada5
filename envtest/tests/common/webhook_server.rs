//! A test-local HTTPS webhook: a CA and a serving certificate for 127.0.0.1 made with rcgen,
//! served by the `http-serving` crate, answering every POST with what a handler makes of the
//! JSON body. envtest calls it as kube-apiserver calls a webhook: by the URL in a client config,
//! verifying it against the `caBundle`.

use axum::extract::{Request, State};
use axum::response::IntoResponse;
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// What the server does with a request body: `(path, body) -> response body`.
pub type Handler = Arc<dyn Fn(&str, Value) -> Value + Send + Sync>;

struct Shared {
    handler: Handler,
    /// Every request body received, oldest first.
    received: Mutex<Vec<(String, Value)>>,
}

/// A running HTTPS webhook. Dropping it stops it.
pub struct WebhookServer {
    addr: SocketAddr,
    ca_pem: String,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl WebhookServer {
    /// Starts a webhook on 127.0.0.1 (a free port) answering with `handler`.
    pub async fn start(handler: impl Fn(&str, Value) -> Value + Send + Sync + 'static) -> WebhookServer {
        Self::start_for(&[], handler).await
    }

    /// As [`start`](Self::start), with a certificate valid for `dns_names` too (a service's
    /// `<name>.<namespace>.svc`).
    pub async fn start_for(
        dns_names: &[&str],
        handler: impl Fn(&str, Value) -> Value + Send + Sync + 'static,
    ) -> WebhookServer {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.distinguished_name.push(DnType::CommonName, "test webhook CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let mut names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        names.extend(dns_names.iter().map(|n| (*n).to_owned()));
        let mut serving = CertificateParams::new(names).unwrap();
        serving.distinguished_name.push(DnType::CommonName, "test webhook");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        let cert = serving.signed_by(&key, &issuer).unwrap();
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let shared = Arc::new(Shared {
            handler: Arc::new(handler),
            received: Mutex::new(Vec::new()),
        });
        let router = axum::Router::new().fallback(serve).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(http_serving::serve(
            listener,
            router,
            Some(Arc::new(tls)),
            http_serving::ServingConfig::default(),
            cancel.clone(),
        ));
        WebhookServer {
            addr,
            ca_pem: ca.pem(),
            shared,
            cancel,
            task: Some(task),
        }
    }

    /// `127.0.0.1:<port>`: where a service's calls are routed (`Config::webhook_service`).
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// The CA's PEM, base64-encoded: a client config's `caBundle`.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }

    /// A `clientConfig` for `path` on this server: `{url, caBundle}`.
    pub fn client_config(&self, path: &str) -> Value {
        serde_json::json!({"url": self.url(path), "caBundle": self.ca_bundle()})
    }

    /// The bodies received so far, with their paths.
    pub fn received(&self) -> Vec<(String, Value)> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Stops serving: the port refuses connections from now on.
    pub async fn stop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn serve(State(shared): State<Arc<Shared>>, req: Request) -> axum::response::Response {
    let path = req.uri().path().to_owned();
    let body = axum::body::to_bytes(req.into_body(), 16 << 20)
        .await
        .unwrap_or_default();
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return (http::StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    shared.received.lock().unwrap().push((path.clone(), body.clone()));
    let handler = shared.handler.clone();
    let out = handler(&path, body);
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&out).unwrap(),
    )
        .into_response()
}

/// A conversion webhook's answer to `review` (`apiextensions.k8s.io/v1` `ConversionReview`):
/// each object converted by `convert(object, desiredAPIVersion)`, the uid echoed, `Success`.
pub fn conversion_response(review: &Value, convert: impl Fn(Value, &str) -> Value) -> Value {
    let request = &review["request"];
    let desired = request["desiredAPIVersion"].as_str().unwrap_or("");
    let converted: Vec<Value> = request["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| convert(o.clone(), desired))
        .collect();
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "response": {
            "uid": request["uid"],
            "result": {"status": "Success"},
            "convertedObjects": converted,
        },
    })
}
