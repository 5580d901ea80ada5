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
        let (pki, cert_pem, key_pem) = Pki::generate(ca_name);
        // Written aside and renamed in, key first, as a Secret volume's swap is atomic.
        for (name, content) in [("tls.key", key_pem), ("tls.crt", cert_pem)] {
            let aside = dir.join(format!(".{name}.new"));
            std::fs::write(&aside, content).unwrap();
            std::fs::rename(&aside, dir.join(name)).unwrap();
        }
        pki
    }

    /// A new CA and serving pair whose files have exactly the sizes of those in `dir`, written
    /// over them in place (same inodes) with their modification times put back: a rewrite
    /// that a file's modification time and size cannot tell from the previous version.
    pub fn rewrite_same_size_in_place(dir: &Path, ca_name: &str) -> Pki {
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        let (old_cert, old_key) = (
            std::fs::metadata(&cert_path).unwrap(),
            std::fs::metadata(&key_path).unwrap(),
        );
        // ECDSA signatures vary by a byte or two: draw until the sizes match.
        let (pki, cert_pem, key_pem) = std::iter::repeat_with(|| Pki::generate(ca_name))
            .take(1000)
            .find(|(_, cert, key)| cert.len() as u64 == old_cert.len() && key.len() as u64 == old_key.len())
            .expect("a same-size pair within 1000 tries");
        for (path, content, old) in [(&key_path, key_pem, old_key), (&cert_path, cert_pem, old_cert)] {
            std::fs::write(path, content).unwrap();
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.set_modified(old.modified().unwrap()).unwrap();
            let now = std::fs::metadata(path).unwrap();
            assert_eq!(
                (now.modified().unwrap(), now.len()),
                (old.modified().unwrap(), old.len())
            );
        }
        pki
    }

    /// A CA and a serving certificate for 127.0.0.1 it signed: the CA, the certificate's PEM
    /// and the key's PEM.
    fn generate(ca_name: &str) -> (Pki, String, String) {
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
        let pki = Pki {
            ca_der: ca.der().to_vec(),
            ca_pem: ca.pem(),
        };
        (pki, cert.pem(), key.serialize_pem())
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
