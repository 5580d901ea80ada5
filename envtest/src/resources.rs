//! The resource table: which group/version/resource envtest serves, with its kind and scope.
//!
//! Built-in resources come from [`builtin`]; a `CustomResourceDefinition` adds its resource when it
//! is created and removes it when it is deleted (see `crd.rs`). Lookups go by (group, version,
//! plural), as the REST paths name them
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris>).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// One served resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceInfo {
    /// API group, `""` for core.
    pub group: String,
    /// Version, e.g. `v1`.
    pub version: String,
    /// Plural resource name used in paths, e.g. `configmaps`.
    pub plural: String,
    /// Singular name, e.g. `configmap`.
    pub singular: String,
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Short names for discovery (`cm`, `ns`, ...).
    pub short_names: Vec<String>,
    /// Whether the `/status` subresource exists (main-resource writes then ignore `.status`).
    pub status_subresource: bool,
    /// Categories for discovery (`all`: what `kubectl get all` lists).
    pub categories: Vec<String>,
    /// Where the `/scale` subresource reads and writes, if the resource has one.
    pub scale: Option<ScalePaths>,
}

/// The fields behind a resource's `/scale` subresource (a CRD's `subresources.scale`), as
/// dotted paths such as `.spec.replicas`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    /// The desired replica count (`Scale.spec.replicas`).
    pub spec_replicas: String,
    /// The observed replica count (`Scale.status.replicas`, `0` when unset).
    pub status_replicas: String,
    /// The label selector (`Scale.status.selector`): a string, or a `LabelSelector` object that
    /// is rendered as one (the built-in workloads' `.spec.selector`).
    pub label_selector: Option<String>,
}

impl ScalePaths {
    /// Deployments', ReplicaSets' and StatefulSets' paths.
    pub fn workload() -> Self {
        ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: Some(".spec.selector".into()),
        }
    }
}

impl ResourceInfo {
    /// `apiVersion` of objects of this resource (`v1`, `apps/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The storage key: `group/plural` (versions share storage). `events.k8s.io` Events share
    /// core Events' storage (`/events`), as kube-apiserver's cohabiting resources do: one
    /// store, two views (see `events.rs`).
    pub fn key(&self) -> String {
        if crate::events::is_event(&self.group, &self.plural) {
            return "/events".to_owned();
        }
        format!("{}/{}", self.group, self.plural)
    }

    /// `plural.group` as kube-apiserver names the resource in messages (`deployments.apps`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

fn res(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    status: bool,
) -> ResourceInfo {
    ResourceInfo {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        kind: kind.into(),
        namespaced,
        short_names: short.iter().map(|s| (*s).to_owned()).collect(),
        status_subresource: status,
        categories: Vec::new(),
        scale: None,
    }
}

/// `r` with the `/scale` subresource of the built-in workloads.
fn scalable(mut r: ResourceInfo) -> ResourceInfo {
    r.scale = Some(ScalePaths::workload());
    r
}

/// `r` in the `all` category, as kube-apiserver puts its workload resources.
fn in_all(mut r: ResourceInfo) -> ResourceInfo {
    r.categories = vec!["all".to_owned()];
    r
}

/// The built-in resources envtest serves: the same list `cargo xtask codegen` generates the
/// factory's typed informers for (`xtask/builtin-resources.txt`; a test keeps the two equal),
/// with kube-apiserver's scope, short names, `/status` and `/scale` subresources and `all`
/// category.
pub fn builtin() -> Vec<ResourceInfo> {
    vec![
        res("", "v1", "namespaces", "Namespace", false, &["ns"], true),
        res("", "v1", "nodes", "Node", false, &["no"], true),
        res("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
        res("", "v1", "secrets", "Secret", true, &[], false),
        in_all(res("", "v1", "pods", "Pod", true, &["po"], true)),
        in_all(res("", "v1", "services", "Service", true, &["svc"], true)),
        res("", "v1", "endpoints", "Endpoints", true, &["ep"], false),
        res("", "v1", "events", "Event", true, &["ev"], false),
        res("", "v1", "serviceaccounts", "ServiceAccount", true, &["sa"], false),
        res(
            "",
            "v1",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            true,
            &["pvc"],
            true,
        ),
        scalable(in_all(res(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
            &["deploy"],
            true,
        ))),
        scalable(in_all(res(
            "apps",
            "v1",
            "replicasets",
            "ReplicaSet",
            true,
            &["rs"],
            true,
        ))),
        scalable(in_all(res(
            "apps",
            "v1",
            "statefulsets",
            "StatefulSet",
            true,
            &["sts"],
            true,
        ))),
        in_all(res("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"], true)),
        in_all(res("batch", "v1", "jobs", "Job", true, &[], true)),
        in_all(res("batch", "v1", "cronjobs", "CronJob", true, &["cj"], true)),
        res("coordination.k8s.io", "v1", "leases", "Lease", true, &[], false),
        res(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "EndpointSlice",
            true,
            &[],
            false,
        ),
        res("events.k8s.io", "v1", "events", "Event", true, &["ev"], false),
        res("networking.k8s.io", "v1", "ingresses", "Ingress", true, &["ing"], true),
        res("rbac.authorization.k8s.io", "v1", "roles", "Role", true, &[], false),
        res(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            false,
        ),
        res(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
            false,
        ),
        res(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
            false,
        ),
        res(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            false,
            &[],
            false,
        ),
        res(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
            &[],
            false,
        ),
        res(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
        ),
    ]
}

/// The live resource table, shared by the router, discovery and the CRD controller.
///
/// Invariant: at most one entry per (group, version, plural).
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<RwLock<Table>>,
}

/// (group, version, plural) → resource.
type Table = BTreeMap<(String, String, String), Arc<ResourceInfo>>;

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// A registry holding the built-in resources.
    pub fn new() -> Self {
        let map = builtin()
            .into_iter()
            .map(|r| ((r.group.clone(), r.version.clone(), r.plural.clone()), Arc::new(r)))
            .collect();
        Registry {
            inner: Arc::new(RwLock::new(map)),
        }
    }

    /// The resource served at (group, version, plural).
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        let map = self.inner.read().unwrap_or_else(|e| e.into_inner());
        map.get(&(group.to_owned(), version.to_owned(), plural.to_owned()))
            .cloned()
    }

    /// Whether the group/version is served at all.
    pub fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.all().iter().any(|r| r.group == group && r.version == version)
    }

    /// Adds or replaces a resource.
    pub fn insert(&self, info: ResourceInfo) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        map.insert(
            (info.group.clone(), info.version.clone(), info.plural.clone()),
            Arc::new(info),
        );
    }

    /// Removes every version of `group/plural`.
    pub fn remove(&self, group: &str, plural: &str) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        map.retain(|(g, _, p), _| !(g == group && p == plural));
    }

    /// All served resources, ordered by (group, version, plural).
    pub fn all(&self) -> Vec<Arc<ResourceInfo>> {
        let map = self.inner.read().unwrap_or_else(|e| e.into_inner());
        map.values().cloned().collect()
    }
}
