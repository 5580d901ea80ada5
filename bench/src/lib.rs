//! The side-by-side benchmark suite: kinformer against kube-runtime, `cargo xtask bench`.
//!
//! Not part of the data path: this crate measures it. Three kinds of process take part, so that
//! each client's peak memory is its own and neither shares a runtime with the server:
//!
//! - `bench-server` (`src/bin/bench-server.rs`): a minimal API server for one resource that
//!   serves **pre-encoded** list pages and watch events. Every object is encoded once at start;
//!   a list page is a copy of those bytes and a watch is a stream of them, so serving costs a
//!   `memcpy` and the clients' decode and caching is what gets measured. envtest is not used
//!   here because it encodes every response from its store with serde (it is a test server,
//!   built for fidelity, and at 100k objects its encoding would be a large part of the timing).
//! - `bench-client` (`examples/bench-client.rs`): one client, kinformer or kube-runtime, or the
//!   decode floor, running one workload and printing one [`Outcome`] as a JSON line.
//! - `bench-driver` (`src/bin/bench-driver.rs`): starts servers and clients, alternates the two
//!   clients over several rounds, and writes the tables and plots.
//!
//! The data ([`configmap`], [`pod`]) is generated deterministically, so the floor measurement
//! decodes exactly the bytes the clients receive.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Objects per list page, as both clients ask by default (client-go's and kube-runtime's 500).
pub const PAGE_SIZE: usize = 500;

/// Namespaces the objects are spread over.
const NAMESPACES: usize = 20;

/// The resource a server serves and a client watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// ConfigMaps of about 1.1 KB each.
    ConfigMaps,
    /// Pods of about 4.3 KB each, with labels, annotations, owner, managedFields and status.
    Pods,
    /// The same Pods as `PartialObjectMetadata` (what a server answers a metadata-only client:
    /// kind, apiVersion and the Pod's metadata, managedFields included).
    PodMetadata,
}

impl Kind {
    /// The path of the cluster-wide collection.
    pub fn path(self) -> &'static str {
        match self {
            Kind::ConfigMaps => "/api/v1/configmaps",
            Kind::Pods | Kind::PodMetadata => "/api/v1/pods",
        }
    }

    /// The list's `kind`.
    pub fn list_kind(self) -> &'static str {
        match self {
            Kind::ConfigMaps => "ConfigMapList",
            Kind::Pods => "PodList",
            Kind::PodMetadata => "PartialObjectMetadataList",
        }
    }

    /// The list's `apiVersion`.
    pub fn list_api_version(self) -> &'static str {
        match self {
            Kind::ConfigMaps | Kind::Pods => "v1",
            Kind::PodMetadata => "meta.k8s.io/v1",
        }
    }

    /// Object `i` at resourceVersion `rv`, generation `gen` of its content, encoded as JSON.
    pub fn encode(self, i: usize, rv: u64, generation: u64) -> Vec<u8> {
        let encoded = match self {
            Kind::ConfigMaps => serde_json::to_vec(&configmap(i, rv, generation)),
            Kind::Pods => serde_json::to_vec(&pod(i, rv, generation)),
            Kind::PodMetadata => serde_json::to_vec(&json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": pod(i, rv, generation).metadata,
            })),
        };
        // Serialising a k8s-openapi value into a Vec cannot fail (no maps with non-string keys).
        encoded.unwrap_or_default()
    }
}

/// The namespace of object `i`.
pub fn namespace(i: usize) -> String {
    format!("team-{:02}", i % NAMESPACES)
}

/// ConfigMap `i`: about 1.1 KB encoded, a few labels and one annotation, and a payload that
/// changes with `generation`.
pub fn configmap(i: usize, rv: u64, generation: u64) -> ConfigMap {
    let value = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": format!("config-{i:07}"),
            "namespace": namespace(i),
            "uid": format!("6f1e2d3c-0000-4000-8000-{i:012}"),
            "resourceVersion": rv.to_string(),
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {
                "app.kubernetes.io/name": format!("service-{}", i % 200),
                "app.kubernetes.io/part-of": "storefront",
                "tier": if i.is_multiple_of(3) { "backend" } else { "frontend" },
            },
            "annotations": {"kinformer.dev/checksum": format!("{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ generation)},
        },
        "data": {
            "generation": generation.to_string(),
            "settings.yaml": format!("# service {i}\n{}", "log-level: info\nmax-connections: 512\nfeature-flags: [a, b, c]\n".repeat(9)),
        },
    });
    serde_json::from_value(value).unwrap_or_default()
}

/// Pod `i`: about 4.3 KB encoded, as a Deployment's pod looks when it runs: labels, annotations,
/// an owner reference, two managedFields entries, one container with env, ports, probes,
/// resources and mounts, and a status with conditions and a container status.
pub fn pod(i: usize, rv: u64, generation: u64) -> Pod {
    let app = format!("service-{}", i % 200);
    let hash = format!("{:010x}", (i / 3) as u64 * 7919);
    let name = format!("{app}-{hash}-{:05}", i % 100_000);
    let image = format!("registry.example.com/storefront/{app}:v1.{}.0", i % 7);
    let value = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": format!("{app}-{hash}-"),
            "namespace": namespace(i),
            "uid": format!("0b8c7a61-0000-4000-8000-{i:012}"),
            "resourceVersion": rv.to_string(),
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {"app": app, "pod-template-hash": hash, "tier": "web", "version": "v1"},
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-11-01T09:59:00Z",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
                "kinformer.dev/generation": generation.to_string(),
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-{hash}"),
                "uid": format!("a1b2c3d4-0000-4000-8000-{:012}", i / 3), "controller": true, "blockOwnerDeletion": true,
            }],
            "managedFields": [
                {
                    "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                    "time": "2026-11-01T10:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}, "f:tier": {}, "f:version": {}},
                        "f:ownerReferences": {".": {}, format!("k:{{\"uid\":\"a1b2c3d4-0000-4000-8000-{:012}\"}}", i / 3): {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:env": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:ports": {}, "f:resources": {}, "f:volumeMounts": {}}},
                        "f:dnsPolicy": {}, "f:restartPolicy": {}, "f:schedulerName": {}, "f:terminationGracePeriodSeconds": {}, "f:volumes": {}}},
                },
                {
                    "manager": "kubelet", "operation": "Update", "apiVersion": "v1", "subresource": "status",
                    "time": "2026-11-01T10:00:05Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}},
                },
            ],
        },
        "spec": {
            "containers": [{
                "name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                "args": ["--listen=:8080", "--metrics=:9090"],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                    {"name": "LOG_LEVEL", "value": "info"},
                    {"name": "UPSTREAM", "value": format!("http://{app}.team.svc:8080")},
                ],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}, {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/app"},
                    {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
                ],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            }],
            "volumes": [
                {"name": "config", "configMap": {"name": format!("{app}-config"), "defaultMode": 420}},
                {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ]}},
            ],
            "nodeName": format!("node-{:03}", i % 150), "serviceAccountName": "default", "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-01T10:00:01Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-01T10:00:05Z"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-01T10:00:05Z"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-01T10:00:00Z"},
            ],
            "hostIP": format!("10.0.{}.{}", (i / 250) % 250, i % 250),
            "podIP": format!("10.244.{}.{}", (i / 250) % 250, i % 250),
            "podIPs": [{"ip": format!("10.244.{}.{}", (i / 250) % 250, i % 250)}],
            "startTime": "2026-11-01T10:00:00Z",
            "qosClass": "Burstable",
            "containerStatuses": [{
                "name": "app", "ready": true, "started": true, "restartCount": 0, "image": image,
                "imageID": format!("registry.example.com/storefront/{app}@sha256:{:064x}", i % 7),
                "containerID": format!("containerd://{:064x}", i as u128 * 104_729),
                "state": {"running": {"startedAt": "2026-11-01T10:00:03Z"}},
            }],
        },
    });
    serde_json::from_value(value).unwrap_or_default()
}

/// One resource's data, encoded once: the listed objects and the watch events that follow.
pub struct Encoded {
    /// The list's objects, each encoded, in list order.
    pub items: Vec<Bytes>,
    /// The watch events (`MODIFIED`, one per line), grouped into chunks of about 64 KiB.
    pub events: Vec<Bytes>,
    /// The list's resourceVersion.
    pub list_rv: u64,
}

impl Encoded {
    /// `count` objects at resourceVersions 1..=count, then `updates` MODIFIED events at the
    /// following resourceVersions, update `j` changing object `j % count`.
    pub fn new(kind: Kind, count: usize, updates: usize) -> Self {
        let items: Vec<Bytes> = (0..count)
            .map(|i| Bytes::from(kind.encode(i, i as u64 + 1, 0)))
            .collect();
        let list_rv = count as u64;
        let mut events = Vec::new();
        let mut chunk = BytesMut::with_capacity(64 * 1024);
        for j in 0..updates {
            let i = j % count.max(1);
            chunk.put_slice(b"{\"type\":\"MODIFIED\",\"object\":");
            chunk.put_slice(&kind.encode(i, list_rv + j as u64 + 1, j as u64 + 1));
            chunk.put_slice(b"}\n");
            if chunk.len() >= 64 * 1024 {
                events.push(chunk.split().freeze());
            }
        }
        if !chunk.is_empty() {
            events.push(chunk.freeze());
        }
        Encoded { items, events, list_rv }
    }

    /// The list response for `items[start..start + limit]` (all of them for limit 0), with a
    /// `continue` token (the next offset) when more remain.
    pub fn page(&self, kind: Kind, start: usize, limit: usize) -> Bytes {
        let start = start.min(self.items.len());
        let end = if limit == 0 {
            self.items.len()
        } else {
            (start + limit).min(self.items.len())
        };
        let body: usize = self.items[start..end].iter().map(|b| b.len() + 1).sum();
        let mut out = BytesMut::with_capacity(body + 256);
        let cont = if end < self.items.len() {
            format!(
                ",\"continue\":\"{end}\",\"remainingItemCount\":{}",
                self.items.len() - end
            )
        } else {
            String::new()
        };
        out.put_slice(
            format!(
                "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{}\"{cont}}},\"items\":[",
                kind.list_kind(),
                kind.list_api_version(),
                self.list_rv
            )
            .as_bytes(),
        );
        for (n, item) in self.items[start..end].iter().enumerate() {
            if n > 0 {
                out.put_u8(b',');
            }
            out.put_slice(item);
        }
        out.put_slice(b"]}");
        out.freeze()
    }

    /// Every list page a client asking `limit` objects per page receives, in order.
    pub fn pages(&self, kind: Kind, limit: usize) -> Vec<Bytes> {
        let mut pages = Vec::new();
        let mut start = 0;
        loop {
            pages.push(self.page(kind, start, limit));
            start += if limit == 0 { self.items.len() } else { limit };
            if start >= self.items.len() {
                return pages;
            }
        }
    }

    /// Mean encoded size of a listed object, in bytes.
    pub fn mean_object_bytes(&self) -> usize {
        self.items.iter().map(Bytes::len).sum::<usize>() / self.items.len().max(1)
    }
}

/// What one client process measured in one run, printed as one JSON line on stdout.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// `kinformer`, `kube-runtime` or `floor`.
    pub client: String,
    /// The workload's name.
    pub workload: String,
    /// Objects listed.
    pub count: usize,
    /// The client's global allocator: `glibc` (the system's malloc) or `mimalloc`.
    #[serde(default)]
    pub allocator: String,
    /// Seconds from starting the informer (or watcher) to a synced cache.
    pub list_secs: Option<f64>,
    /// CPU seconds (user + system, every thread of the process) over `list_secs`.
    #[serde(default)]
    pub list_cpu_secs: Option<f64>,
    /// Watch updates applied per second, after the cache synced.
    pub updates_per_sec: Option<f64>,
    /// CPU seconds (user + system) spent applying the watch updates, per update.
    #[serde(default)]
    pub cpu_per_update: Option<f64>,
    /// Growth of the live heap from before the informer started to the synced cache, per object.
    pub heap_per_object: Option<f64>,
    /// The process's peak resident set size (VmHWM), bytes.
    pub peak_rss: Option<u64>,
    /// Further figures of a workload (fan-out rates, latency percentiles, …).
    #[serde(default)]
    pub extra: BTreeMap<String, f64>,
}

/// CPU seconds (user + system) this process has used so far, all threads, live and exited
/// (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`: nanosecond resolution, where `/proc/self/stat`
/// counts 10 ms ticks). The difference of two readings is a phase's CPU time.
pub fn process_cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// A line of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`), where procfs exists.
pub fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::ObjectList;

    #[test]
    fn objects_have_the_sizes_the_workloads_name() {
        let cms = Encoded::new(Kind::ConfigMaps, 100, 0);
        let pods = Encoded::new(Kind::Pods, 100, 0);
        let (cm, pod) = (cms.mean_object_bytes(), pods.mean_object_bytes());
        assert!((1000..1300).contains(&cm), "ConfigMap {cm} bytes");
        assert!((4000..4700).contains(&pod), "Pod {pod} bytes");
    }

    #[test]
    fn pages_decode_to_every_object_once_with_continue_tokens() {
        let enc = Encoded::new(Kind::Pods, 1_234, 10);
        let pages = enc.pages(Kind::Pods, PAGE_SIZE);
        assert_eq!(pages.len(), 3);
        let mut names = Vec::new();
        for (n, page) in pages.iter().enumerate() {
            let list: ObjectList<Pod> = serde_json::from_slice(page).unwrap();
            assert_eq!(list.metadata.resource_version.as_deref(), Some("1234"));
            assert_eq!(list.metadata.continue_.is_some(), n < 2);
            names.extend(list.items.into_iter().map(|p| p.metadata.name.unwrap()));
        }
        assert_eq!(names.len(), 1_234);
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 1_234);
        let events: usize = enc
            .events
            .iter()
            .map(|c| c.iter().filter(|b| **b == b'\n').count())
            .sum();
        assert_eq!(events, 10);
    }
}
