//! The HTTPS client envtest calls webhooks with, as kube-apiserver's webhook client does:
//! admission webhooks (`admission/`) and CRD conversion webhooks alike.
//!
//! Where it sits: the admission chain (and CRD conversion) builds a review, hands it here with
//! the webhook's `clientConfig` (the `WebhookClientConfig` JSON), and gets the reply's JSON or
//! a [`CallError`] the caller turns into kube-apiserver's message (`failed calling webhook
//! "<name>": <error>`) or skips (failure policy `Ignore`).
//!
//! - `clientConfig.url` is called as is; `clientConfig.service` is resolved through
//!   [`Config::webhook_service`](crate::Config::webhook_service) (envtest has no cluster
//!   network), and its certificate is verified for `<name>.<namespace>.svc`, the name
//!   kube-apiserver verifies.
//! - The server certificate is verified by rustls against `caBundle` (PEM), or the system's
//!   roots when there is none; a mismatch is a failed call.
//! - `?timeout=<n>s` is added to the URL as kube-apiserver does, and the whole call (connect,
//!   handshake, request, reply) is bounded by the timeout.
//! - One connection per call (HTTP/1.1); replies over [`MAX_RESPONSE_BYTES`] are refused.

use base64::Engine;
use bytes::Bytes;
use http::{Request, Uri, header};
use hyper::body::Body;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Largest webhook reply read.
pub(crate) const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Why a webhook call failed; its `Display` is what kube-apiserver puts after
/// `failed calling webhook "<name>": `.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum CallError {
    /// The `clientConfig` cannot be called (no url or service, a malformed URL, a service
    /// envtest has no address for).
    #[error("failed to call webhook: {0}")]
    Config(String),
    /// Connecting, the TLS handshake (certificate verification included) or HTTP failed.
    #[error("failed to call webhook: Post \"{url}\": {reason}")]
    Transport {
        /// The URL called.
        url: String,
        /// What failed.
        reason: String,
    },
    /// No reply within the timeout.
    #[error("failed to call webhook: Post \"{url}\": context deadline exceeded")]
    Timeout {
        /// The URL called.
        url: String,
    },
    /// The webhook answered with a status other than 200.
    #[error("failed to call webhook: the server responded with status code {code}: {body}")]
    Status {
        /// The HTTP status.
        code: u16,
        /// The start of the reply's body.
        body: String,
    },
    /// The reply is not JSON.
    #[error("received invalid webhook response: {0}")]
    Decode(String),
}

/// Where a webhook's `service` reference is reached: `(namespace, name)` → `host:port`.
pub(crate) type ServiceAddresses = BTreeMap<(String, String), String>;

/// The client: service addresses and the system's roots (loaded at the first call that needs
/// them). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct WebhookClient {
    services: Arc<ServiceAddresses>,
    system_roots: Arc<OnceLock<Arc<rustls::RootCertStore>>>,
}

/// Where one call goes.
struct Target {
    /// The URL as kube-apiserver names it in messages (with `?timeout=`).
    url: String,
    /// `host:port` connected to.
    address: String,
    /// The name the certificate is verified for.
    server_name: ServerName<'static>,
    /// Path and query of the request.
    path_and_query: String,
    /// The `Host` header.
    host: String,
}

impl WebhookClient {
    /// A client that reaches services at `services`.
    pub(crate) fn new(services: ServiceAddresses) -> Self {
        WebhookClient {
            services: Arc::new(services),
            system_roots: Arc::default(),
        }
    }

    /// POSTs `body` as JSON to the webhook `client_config` describes and returns its JSON reply.
    pub(crate) async fn post(
        &self,
        client_config: &Value,
        body: &Value,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let target = self.target(client_config, timeout)?;
        let roots = self.roots(client_config)?;
        let url = target.url.clone();
        match tokio::time::timeout(timeout, call(target, roots, body)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(CallError::Timeout { url }),
        }
    }

    /// Resolves `url` or `service` to where the call goes.
    fn target(&self, client_config: &Value, timeout: Duration) -> Result<Target, CallError> {
        let timeout_param = format!("timeout={}s", timeout.as_secs().max(1));
        let with_timeout = |path: &str| {
            if path.contains('?') {
                format!("{path}&{timeout_param}")
            } else {
                format!("{path}?{timeout_param}")
            }
        };
        if let Some(url) = client_config.get("url").and_then(Value::as_str) {
            let uri: Uri = url
                .parse()
                .map_err(|e| CallError::Config(format!("invalid webhook URL {url:?}: {e}")))?;
            if uri.scheme_str() != Some("https") {
                return Err(CallError::Config(format!("webhook URL {url:?} is not https")));
            }
            let host = uri
                .host()
                .ok_or_else(|| CallError::Config(format!("webhook URL {url:?} has no host")))?;
            let port = uri.port_u16().unwrap_or(443);
            let bare_host = host.trim_start_matches('[').trim_end_matches(']');
            let server_name = ServerName::try_from(bare_host.to_owned())
                .map_err(|e| CallError::Config(format!("webhook URL {url:?}: {e}")))?;
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            let path_and_query = with_timeout(path);
            let authority = uri.authority().map_or(host, |a| a.as_str()).to_owned();
            return Ok(Target {
                url: format!("https://{authority}{path_and_query}"),
                address: format!("{host}:{port}"),
                server_name,
                path_and_query,
                host: authority,
            });
        }
        let Some(service) = client_config.get("service").filter(|s| s.is_object()) else {
            return Err(CallError::Config("the webhook has neither url nor service".into()));
        };
        let field = |f: &str| service.get(f).and_then(Value::as_str).unwrap_or("");
        let (namespace, name) = (field("namespace"), field("name"));
        let port = service.get("port").and_then(Value::as_u64).unwrap_or(443);
        let path = match field("path") {
            "" => "/",
            p => p,
        };
        let address = self
            .services
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| {
                CallError::Config(format!(
                    "service \"{namespace}/{name}\" has no address in envtest (see Config::webhook_service)"
                ))
            })?;
        let dns = format!("{name}.{namespace}.svc");
        let server_name = ServerName::try_from(dns.clone())
            .map_err(|e| CallError::Config(format!("service \"{namespace}/{name}\": {e}")))?;
        let path_and_query = with_timeout(path);
        let host = format!("{dns}:{port}");
        Ok(Target {
            url: format!("https://{host}{path_and_query}"),
            address,
            server_name,
            path_and_query,
            host,
        })
    }

    /// The roots the server certificate is verified against: `caBundle`, else the system's.
    fn roots(&self, client_config: &Value) -> Result<Arc<rustls::RootCertStore>, CallError> {
        let bundle = client_config.get("caBundle").and_then(Value::as_str).unwrap_or("");
        if bundle.is_empty() {
            return Ok(self
                .system_roots
                .get_or_init(|| {
                    let mut roots = rustls::RootCertStore::empty();
                    let found = rustls_native_certs::load_native_certs();
                    for e in &found.errors {
                        tracing::warn!(error = %e, "webhook client: loading a system root certificate failed");
                    }
                    roots.add_parsable_certificates(found.certs);
                    Arc::new(roots)
                })
                .clone());
        }
        let pem = base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .map_err(|e| CallError::Config(format!("caBundle is not base64: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| CallError::Config(format!("caBundle holds no valid PEM certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| CallError::Config(format!("caBundle holds an invalid certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(CallError::Config("caBundle holds no certificate".into()));
        }
        Ok(Arc::new(roots))
    }
}

/// One call: connect, handshake, POST, read the reply.
async fn call(target: Target, roots: Arc<rustls::RootCertStore>, body: &Value) -> Result<Value, CallError> {
    let transport = |reason: String| CallError::Transport {
        url: target.url.clone(),
        reason,
    };
    let tcp = tokio::net::TcpStream::connect(&target.address)
        .await
        .map_err(|e| transport(format!("dial tcp {}: {e}", target.address)))?;
    let _ = tcp.set_nodelay(true);
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| transport(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(target.server_name.clone(), tcp)
        .await
        .map_err(|e| transport(format!("tls: {e}")))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| transport(e.to_string()))?;
    // The connection is driven here, beside the request: it ends with this call.
    let request = Request::post(target.path_and_query.as_str())
        .header(header::HOST, target.host.as_str())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(body.to_string())
        .map_err(|e| transport(e.to_string()))?;
    let exchange = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let status = response.status().as_u16();
        let bytes = read_body(response.into_body())
            .await
            .map_err(|e| transport(e.to_string()))?;
        Ok::<_, CallError>((status, bytes))
    };
    tokio::pin!(connection);
    let (status, bytes) = tokio::select! {
        out = exchange => out?,
        end = &mut connection => {
            return Err(transport(match end {
                Ok(()) => "the connection closed before a response".to_owned(),
                Err(e) => e.to_string(),
            }));
        }
    };
    if status != 200 {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(1024)]).into_owned();
        return Err(CallError::Status {
            code: status,
            body: text,
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| CallError::Decode(e.to_string()))
}

/// Reads a reply body, refusing one over [`MAX_RESPONSE_BYTES`].
async fn read_body(mut body: hyper::body::Incoming) -> Result<Bytes, String> {
    let mut out = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > MAX_RESPONSE_BYTES {
                return Err(format!("the response is larger than {MAX_RESPONSE_BYTES} bytes"));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn urls_and_services_resolve_as_kube_apiserver_names_them() {
        let mut services = ServiceAddresses::new();
        services.insert(("ns".into(), "hook".into()), "127.0.0.1:8443".into());
        let client = WebhookClient::new(services);
        let t = client
            .target(
                &json!({"url": "https://127.0.0.1:9443/validate?x=1"}),
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(t.url, "https://127.0.0.1:9443/validate?x=1&timeout=10s");
        assert_eq!(t.address, "127.0.0.1:9443");
        let t = client
            .target(
                &json!({"service": {"namespace": "ns", "name": "hook", "path": "/mutate"}}),
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(t.url, "https://hook.ns.svc:443/mutate?timeout=5s");
        assert_eq!(t.address, "127.0.0.1:8443");
        assert_eq!(t.server_name, ServerName::try_from("hook.ns.svc").unwrap());
        for bad in [
            json!({}),
            json!({"url": "http://127.0.0.1/"}),
            json!({"service": {"namespace": "ns", "name": "unknown"}}),
        ] {
            assert!(
                matches!(client.target(&bad, Duration::from_secs(1)), Err(CallError::Config(_))),
                "{bad}"
            );
        }
    }
}
