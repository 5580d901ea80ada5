//! The manifests that deploy a controller to a cluster: its CRDs, a ServiceAccount, the RBAC
//! its declarations need, and a Deployment that runs the Manager with probes on its ports.
//!
//! Where it sits: outside the data path, at build time. A project's `xtask` (this workspace's
//! `cargo xtask manifests`) builds its controllers as `main` does, without running them,
//! passes each [`BuiltController::permissions`](crate::BuiltController::permissions) to
//! [`Manifests`], and writes [`Manifests::objects`] as YAML for `kubectl apply`. Building a
//! controller makes no request, so the client it is built with may point nowhere.
//!
//! What comes out, in apply order (kubebuilder's `config/default`, trimmed to what a kinformer
//! Manager uses):
//! - the Namespace and the CRDs given;
//! - a ServiceAccount named after the controller;
//! - a ClusterRole with the controllers' [`Permissions`] (sources, declared writes, events: see
//!   [`crate::rbac`]) and its ClusterRoleBinding: a Manager's factory watches every namespace
//!   unless told otherwise;
//! - with leader election, a Role `<name>-leader-election` in the namespace (where the Lease
//!   lives: the binary must be told so, e.g. `--namespace`) granting
//!   [`Permissions::leader_election`], and its RoleBinding;
//! - a Service `<name>-metrics` for the metrics port (for a Prometheus scrape config or a
//!   ServiceMonitor);
//! - the Deployment: one replica (leader election makes more safe, not faster), the
//!   ServiceAccount, ports `metrics` and `health` as the Manager serves them
//!   ([`ManagerBuilder::metrics_addr`](crate::ManagerBuilder::metrics_addr),
//!   [`health_probe_addr`](crate::ManagerBuilder::health_probe_addr)), a liveness probe on
//!   `/healthz` and a readiness probe on `/readyz` of the health port (the Manager's `/readyz`
//!   fails until the caches synced and once shutdown began), the restricted Pod Security
//!   profile (non-root, no privilege escalation, no capabilities, read-only root filesystem,
//!   `RuntimeDefault` seccomp) and a termination grace period 10 s above the Manager's default
//!   30 s graceful shutdown, so the kubelet's SIGKILL never cuts the drain short.
//!
//! controller-runtime projects get the same from `controller-gen rbac` (from hand-written
//! markers) and kustomize; here the rules come from the controller's own declarations, so they
//! cannot drift from the code.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, HTTPGetAction, Namespace, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ResourceRequirements, SeccompProfile, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::rbac::Permissions;

/// The label that selects the controller's pods (and names the app on every object).
pub const NAME_LABEL: &str = "app.kubernetes.io/name";

/// The manifests of one controller binary; see the [module docs](self).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Manifests {
    /// The name of the ServiceAccount, the roles, the Service and the Deployment.
    pub name: String,
    /// The namespace the controller runs in (and its Lease lives in).
    pub namespace: String,
    /// The container image.
    pub image: String,
    /// The container's arguments.
    pub args: Vec<String>,
    /// What the ClusterRole grants.
    pub permissions: Permissions,
    /// Whether the binary runs with leader election (the Lease Role).
    pub leader_election: bool,
    /// The port the Manager serves `/metrics` on.
    pub metrics_port: u16,
    /// The port the Manager serves `/healthz` and `/readyz` on.
    pub health_probe_port: u16,
    /// The CRDs to install with the controller.
    pub crds: Vec<CustomResourceDefinition>,
}

impl Manifests {
    /// The manifests of controller `name` running image `image` in `namespace`, with leader
    /// election, metrics on 8080 and probes on 8081 (controller-runtime's ports), no
    /// permissions, arguments or CRDs yet.
    pub fn new(name: impl Into<String>, namespace: impl Into<String>, image: impl Into<String>) -> Self {
        Manifests {
            name: name.into(),
            namespace: namespace.into(),
            image: image.into(),
            args: Vec::new(),
            permissions: Permissions::new(),
            leader_election: true,
            metrics_port: 8080,
            health_probe_port: 8081,
            crds: Vec::new(),
        }
    }

    /// Adds the access a controller needs: pass each controller's
    /// [`permissions`](crate::BuiltController::permissions).
    #[must_use]
    pub fn permissions(mut self, permissions: &Permissions) -> Self {
        self.permissions.merge(permissions);
        self
    }

    /// The container's arguments (flags that select in-cluster config, the Lease's namespace,
    /// the ports, ...).
    #[must_use]
    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Whether the binary runs with leader election (default true).
    #[must_use]
    pub fn leader_election(mut self, on: bool) -> Self {
        self.leader_election = on;
        self
    }

    /// The metrics port (default 8080).
    #[must_use]
    pub fn metrics_port(mut self, port: u16) -> Self {
        self.metrics_port = port;
        self
    }

    /// The health probe port (default 8081).
    #[must_use]
    pub fn health_probe_port(mut self, port: u16) -> Self {
        self.health_probe_port = port;
        self
    }

    /// The CRDs to install with the controller.
    #[must_use]
    pub fn crds(mut self, crds: impl IntoIterator<Item = CustomResourceDefinition>) -> Self {
        self.crds.extend(crds);
        self
    }

    /// The user the controller's requests run as: `system:serviceaccount:<namespace>:<name>`.
    pub fn service_account_user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }

    /// The name of the leader election Role and RoleBinding.
    pub fn leader_election_role(&self) -> String {
        format!("{}-leader-election", self.name)
    }

    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(NAME_LABEL.to_owned(), self.name.clone())])
    }

    fn meta(&self, name: &str, namespaced: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: namespaced.then(|| self.namespace.clone()),
            labels: Some(self.labels()),
            ..ObjectMeta::default()
        }
    }

    fn subjects(&self) -> Option<Vec<Subject>> {
        Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: self.name.clone(),
            namespace: Some(self.namespace.clone()),
            ..Subject::default()
        }])
    }

    /// The ClusterRole of the controllers' permissions.
    pub fn cluster_role(&self) -> ClusterRole {
        ClusterRole {
            metadata: self.meta(&self.name, false),
            rules: Some(self.permissions.rules()),
            ..ClusterRole::default()
        }
    }

    /// The leader election Role, if the binary runs with leader election.
    pub fn leader_election_role_object(&self) -> Option<Role> {
        self.leader_election.then(|| Role {
            metadata: self.meta(&self.leader_election_role(), true),
            rules: Some(Permissions::leader_election().rules()),
        })
    }

    /// The Deployment.
    pub fn deployment(&self) -> Deployment {
        let port = |name: &str, port: u16| ContainerPort {
            name: Some(name.to_owned()),
            container_port: i32::from(port),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        };
        let probe = |path: &str, initial_delay: i32, period: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.to_owned()),
                port: IntOrString::String("health".into()),
                ..HTTPGetAction::default()
            }),
            initial_delay_seconds: Some(initial_delay),
            period_seconds: Some(period),
            ..Probe::default()
        };
        let quantities = |cpu: &str, memory: &str| {
            Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity(cpu.to_owned())),
                ("memory".to_owned(), Quantity(memory.to_owned())),
            ]))
        };
        let container = Container {
            name: "manager".into(),
            image: Some(self.image.clone()),
            args: (!self.args.is_empty()).then(|| self.args.clone()),
            ports: Some(vec![
                port("metrics", self.metrics_port),
                port("health", self.health_probe_port),
            ]),
            liveness_probe: Some(probe("/healthz", 15, 20)),
            readiness_probe: Some(probe("/readyz", 5, 10)),
            resources: Some(ResourceRequirements {
                requests: quantities("10m", "64Mi"),
                limits: quantities("500m", "128Mi"),
                ..ResourceRequirements::default()
            }),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    ..Capabilities::default()
                }),
                ..SecurityContext::default()
            }),
            ..Container::default()
        };
        Deployment {
            metadata: self.meta(&self.name, true),
            spec: Some(DeploymentSpec {
                replicas: Some(1),
                selector: LabelSelector {
                    match_labels: Some(self.labels()),
                    ..LabelSelector::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(self.labels()),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(self.name.clone()),
                        termination_grace_period_seconds: Some(40),
                        security_context: Some(PodSecurityContext {
                            run_as_non_root: Some(true),
                            seccomp_profile: Some(SeccompProfile {
                                type_: "RuntimeDefault".into(),
                                ..SeccompProfile::default()
                            }),
                            ..PodSecurityContext::default()
                        }),
                        containers: vec![container],
                        ..PodSpec::default()
                    }),
                },
                ..DeploymentSpec::default()
            }),
            ..Deployment::default()
        }
    }

    /// Every object, in apply order, as JSON values with `apiVersion` and `kind` (see the
    /// [module docs](self)).
    pub fn objects(&self) -> Result<Vec<serde_json::Value>, serde_json::Error> {
        let mut out = vec![serde_json::to_value(Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        })?];
        for crd in &self.crds {
            out.push(serde_json::to_value(crd)?);
        }
        out.push(serde_json::to_value(ServiceAccount {
            metadata: self.meta(&self.name, true),
            ..ServiceAccount::default()
        })?);
        out.push(serde_json::to_value(self.cluster_role())?);
        out.push(serde_json::to_value(ClusterRoleBinding {
            metadata: self.meta(&self.name, false),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: self.name.clone(),
            },
            subjects: self.subjects(),
        })?);
        if let Some(role) = self.leader_election_role_object() {
            out.push(serde_json::to_value(role)?);
            out.push(serde_json::to_value(RoleBinding {
                metadata: self.meta(&self.leader_election_role(), true),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: self.leader_election_role(),
                },
                subjects: self.subjects(),
            })?);
        }
        out.push(serde_json::to_value(Service {
            metadata: self.meta(&format!("{}-metrics", self.name), true),
            spec: Some(ServiceSpec {
                selector: Some(self.labels()),
                ports: Some(vec![ServicePort {
                    name: Some("metrics".into()),
                    port: i32::from(self.metrics_port),
                    target_port: Some(IntOrString::String("metrics".into())),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        })?);
        out.push(serde_json::to_value(self.deployment())?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rbac::Verb;

    #[test]
    fn objects_in_apply_order_with_the_permissions_and_probes_on_the_named_ports() {
        let mut permissions = Permissions::new();
        permissions.grant("apps", "deployments", &Verb::READ);
        let manifests = Manifests::new("ctl", "ctl-system", "ctl:dev")
            .permissions(&permissions)
            .args(["--in-cluster"]);
        let objects = manifests.objects().unwrap();
        let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "Service",
                "Deployment"
            ]
        );
        assert_eq!(
            objects[2]["rules"],
            serde_json::json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]}])
        );
        assert_eq!(objects[4]["rules"][0]["resources"], serde_json::json!(["leases"]));
        let container = &objects[7]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(container["livenessProbe"]["httpGet"]["port"], "health");
        assert_eq!(
            container["ports"][1],
            serde_json::json!({"name": "health", "containerPort": 8081, "protocol": "TCP"})
        );
        assert_eq!(manifests.service_account_user(), "system:serviceaccount:ctl-system:ctl");
        let without = Manifests::new("ctl", "ctl-system", "ctl:dev").leader_election(false);
        assert!(!without.objects().unwrap().iter().any(|o| o["kind"] == "Role"));
    }
}
