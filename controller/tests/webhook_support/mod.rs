//! Shared by the webhook tests: the test CRD in two versions (hub `v1`, spoke `v1alpha1`), a
//! CA with a serving certificate written as cert-manager does, a temporary directory, and
//! kube's HTTPS client trusting one CA.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use controller::BoxError;
use controller::webhook::Convertible;
use kube::CustomResource;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod v1 {
    use super::*;

    /// The hub version.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
    #[kube(group = "webhook.kinformer.dev", version = "v1", kind = "Foo", namespaced)]
    pub struct FooSpec {
        pub replicas: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub image: Option<String>,
    }
}

pub mod v1alpha1 {
    use super::*;

    /// A spoke: `size` is a string there.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
    #[kube(group = "webhook.kinformer.dev", version = "v1alpha1", kind = "Foo", namespaced)]
    pub struct FooSpec {
        pub size: String,
    }
}

impl Convertible<v1::Foo> for v1alpha1::Foo {
    fn to_hub(self) -> Result<v1::Foo, BoxError> {
        let replicas = self
            .spec
            .size
            .parse::<i32>()
            .map_err(|e| format!("size {:?}: {e}", self.spec.size))?;
        Ok(v1::Foo {
            metadata: self.metadata,
            spec: v1::FooSpec { replicas, image: None },
        })
    }

    fn from_hub(hub: v1::Foo) -> Result<Self, BoxError> {
        Ok(v1alpha1::Foo {
            metadata: hub.metadata,
            spec: v1alpha1::FooSpec {
                size: hub.spec.replicas.to_string(),
            },
        })
    }
}

/// A CA and a serving certificate for 127.0.0.1 it signed, written as `tls.crt`/`tls.key`.
pub struct Pki {
    pub ca_der: Vec<u8>,
    /// For a webhook configuration's `caBundle`.
    pub ca_pem: String,
}

impl Pki {
    pub fn write(dir: &Path, ca_name: &str) -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.distinguished_name.push(DnType::CommonName, ca_name);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let mut serving = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        serving.distinguished_name.push(DnType::CommonName, "webhook");
        let key = KeyPair::generate().unwrap();
        let cert = serving.signed_by(&key, &issuer).unwrap();
        // Written aside and renamed in, key first, as a Secret volume's swap is atomic.
        for (name, content) in [("tls.key", key.serialize_pem()), ("tls.crt", cert.pem())] {
            let aside = dir.join(format!(".{name}.new"));
            std::fs::write(&aside, content).unwrap();
            std::fs::rename(&aside, dir.join(name)).unwrap();
        }
        Pki {
            ca_der: ca.der().to_vec(),
            ca_pem: ca.pem(),
        }
    }
}

/// A fresh directory under the temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "kinformer-webhook-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// kube's HTTPS client for `addr`, trusting only `ca_der`.
pub fn https_client(addr: SocketAddr, ca_der: &[u8]) -> kube::Client {
    let mut config = kube::Config::new(format!("https://{addr}").parse().unwrap());
    config.root_cert = Some(vec![ca_der.to_vec()]);
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(60));
    kube::Client::try_from(config).unwrap()
}
