//! kube-apiserver's columns for the built-in kinds (kubernetes'
//! `pkg/printers/internalversion/printers.go`): one column list per resource, each column a
//! definition and the function that computes its cell from the stored JSON object.
//!
//! The server sends every column, `priority: 1` ones included (kube-apiserver's table
//! convertor prints with `Wide: true`); kubectl hides the priority-1 columns unless `-o wide`.
//! Cells are computed as the Go printers compute them: a Pod's `Status` from its phase, reason,
//! init and app container states and deletion, `Restarts` with `(<age> ago)` of the last
//! termination, an Event's `Last Seen` from `series`, `lastTimestamp`, `firstTimestamp` or
//! `eventTime`. Kinds not listed here (and CRDs themselves) get `Name` and `Created At`
//! (apiserver's default table convertor).
//!
//! Names, order, types and priorities are checked against Kubernetes 1.32's `AddHandlers`
//! (a test pins them for Deployments, ConfigMaps, Secrets, ReplicaSets and ClusterRoleBindings).
//! Types follow the Go declarations even where the cells are integers: a Deployment's
//! `Up-to-date` and `Available`, a ConfigMap's or Secret's `Data` are declared `string`. The
//! remaining differences are listed in the crate docs ("Differences from kube-apiserver").

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// Computes one cell from an object (the stored JSON) at `now`.
pub(super) type CellFn = fn(&Value, Timestamp) -> Value;

/// Where a column's description comes from.
#[derive(Clone, Copy)]
pub(super) enum Doc {
    /// Written out, as the Go printer writes it.
    Text(&'static str),
    /// The `SwaggerDoc` of a field of a Kubernetes type (its schema's description).
    Field(fn() -> Value, &'static str),
}

/// One column of a built-in kind.
#[derive(Clone, Copy)]
pub(super) struct BuiltinColumn {
    pub(super) name: &'static str,
    pub(super) ty: &'static str,
    pub(super) format: &'static str,
    /// `1`: shown by kubectl only with `-o wide`.
    pub(super) priority: u8,
    pub(super) doc: Doc,
    pub(super) cell: CellFn,
}

/// The JSON schema of `T` (for its fields' descriptions).
fn schema<T: schemars::JsonSchema>() -> Value {
    schemars::schema_for!(T).as_value().clone()
}

use k8s_openapi::api::{apps::v1 as apps, core::v1 as core};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const fn col(name: &'static str, ty: &'static str, doc: Doc, cell: CellFn) -> BuiltinColumn {
    BuiltinColumn {
        name,
        ty,
        format: "",
        priority: 0,
        doc,
        cell,
    }
}

const fn wide(mut c: BuiltinColumn) -> BuiltinColumn {
    c.priority = 1;
    c
}

const NAME: BuiltinColumn = BuiltinColumn {
    name: "Name",
    ty: "string",
    format: "name",
    priority: 0,
    doc: Doc::Field(schema::<ObjectMeta>, "name"),
    cell: |o, _| json!(crate::object::name(o)),
};
const AGE: BuiltinColumn = col(
    "Age",
    "string",
    Doc::Field(schema::<ObjectMeta>, "creationTimestamp"),
    |o, now| json!(since(str_at(o, &["metadata", "creationTimestamp"]), now)),
);
const CONTAINERS: BuiltinColumn = wide(col(
    "Containers",
    "string",
    Doc::Text("Names of each container in the template."),
    |o, _| json!(template_containers(o, "name")),
));
const IMAGES: BuiltinColumn = wide(col(
    "Images",
    "string",
    Doc::Text("Images referenced by each container in the template."),
    |o, _| json!(template_containers(o, "image")),
));
const SELECTOR: fn(fn() -> Value) -> BuiltinColumn = |spec| {
    wide(col("Selector", "string", Doc::Field(spec, "selector"), |o, _| {
        json!(label_selector(&o["spec"]["selector"]))
    }))
};
const CREATED_AT: BuiltinColumn = col(
    "Created At",
    "date",
    Doc::Field(schema::<ObjectMeta>, "creationTimestamp"),
    |o, _| json!(str_at(o, &["metadata", "creationTimestamp"])),
);

/// An integer column whose cell is the object's `.<part>.<field>` (0 when absent), described by
/// the `field` property of `schema`'s type, as the Go printers' integer columns are.
macro_rules! int_col {
    ($name:literal, $schema:ty, $part:literal, $field:literal) => {
        col($name, "integer", Doc::Field(schema::<$schema>, $field), |o, _| {
            json!(int_at(o, &[$part, $field]))
        })
    };
}

/// As [`int_col!`], for a column the Go printer declares `string` while its cells are integers.
macro_rules! str_int_col {
    ($name:literal, $schema:ty, $part:literal, $field:literal) => {
        col($name, "string", Doc::Field(schema::<$schema>, $field), |o, _| {
            json!(int_at(o, &[$part, $field]))
        })
    };
}

/// The columns of the built-in resource `group/plural`; a resource the Go printers do not
/// cover gets apiserver's default table convertor's `Name` and `Created At`.
pub(super) fn columns(group: &str, plural: &str) -> Vec<BuiltinColumn> {
    match (group, plural) {
        ("", "pods") => vec![
            NAME,
            col(
                "Ready",
                "string",
                Doc::Text("The aggregate readiness state of this pod for accepting traffic."),
                |o, _| {
                    let p = pod_summary(o);
                    json!(format!("{}/{}", p.ready, p.total))
                },
            ),
            col(
                "Status",
                "string",
                Doc::Text("The aggregate status of the containers in this pod."),
                |o, _| json!(pod_summary(o).reason),
            ),
            col(
                "Restarts",
                "string",
                Doc::Text(
                    "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                ),
                |o, now| {
                    let p = pod_summary(o);
                    match p.last_restart {
                        Some(at) if p.restarts != 0 => json!(format!("{} ({} ago)", p.restarts, since(&at, now))),
                        _ => json!(p.restarts.to_string()),
                    }
                },
            ),
            AGE,
            wide(col(
                "IP",
                "string",
                Doc::Field(schema::<core::PodStatus>, "podIP"),
                |o, _| json!(or_none(str_at(o, &["status", "podIPs", "0", "ip"]))),
            )),
            wide(col(
                "Node",
                "string",
                Doc::Field(schema::<core::PodSpec>, "nodeName"),
                |o, _| json!(or_none(str_at(o, &["spec", "nodeName"]))),
            )),
            wide(col(
                "Nominated Node",
                "string",
                Doc::Field(schema::<core::PodStatus>, "nominatedNodeName"),
                |o, _| json!(or_none(str_at(o, &["status", "nominatedNodeName"]))),
            )),
            wide(col(
                "Readiness Gates",
                "string",
                Doc::Field(schema::<core::PodSpec>, "readinessGates"),
                |o, _| json!(readiness_gates(o)),
            )),
        ],
        ("apps", "deployments") => vec![
            NAME,
            col(
                "Ready",
                "string",
                Doc::Text("Number of the pod with ready state"),
                |o, _| {
                    json!(format!(
                        "{}/{}",
                        int_at(o, &["status", "readyReplicas"]),
                        int_at(o, &["spec", "replicas"])
                    ))
                },
            ),
            // The Go printer declares these two "string" (and fills them with integers).
            str_int_col!("Up-to-date", apps::DeploymentStatus, "status", "updatedReplicas"),
            str_int_col!("Available", apps::DeploymentStatus, "status", "availableReplicas"),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR(schema::<apps::DeploymentSpec>),
        ],
        ("apps", "replicasets") => vec![
            NAME,
            int_col!("Desired", apps::ReplicaSetSpec, "spec", "replicas"),
            int_col!("Current", apps::ReplicaSetStatus, "status", "replicas"),
            int_col!("Ready", apps::ReplicaSetStatus, "status", "readyReplicas"),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR(schema::<apps::ReplicaSetSpec>),
        ],
        ("apps", "statefulsets") => vec![
            NAME,
            col(
                "Ready",
                "string",
                Doc::Text("Number of the pod with ready state"),
                |o, _| {
                    json!(format!(
                        "{}/{}",
                        int_at(o, &["status", "readyReplicas"]),
                        int_at(o, &["spec", "replicas"])
                    ))
                },
            ),
            AGE,
            CONTAINERS,
            IMAGES,
        ],
        ("apps", "daemonsets") => vec![
            NAME,
            int_col!("Desired", apps::DaemonSetStatus, "status", "desiredNumberScheduled"),
            int_col!("Current", apps::DaemonSetStatus, "status", "currentNumberScheduled"),
            int_col!("Ready", apps::DaemonSetStatus, "status", "numberReady"),
            int_col!("Up-to-date", apps::DaemonSetStatus, "status", "updatedNumberScheduled"),
            int_col!("Available", apps::DaemonSetStatus, "status", "numberAvailable"),
            col(
                "Node Selector",
                "string",
                Doc::Field(schema::<core::PodSpec>, "nodeSelector"),
                |o, _| json!(labels(&o["spec"]["template"]["spec"]["nodeSelector"])),
            ),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR(schema::<apps::DaemonSetSpec>),
        ],
        ("batch", "jobs") => vec![
            NAME,
            col("Status", "string", Doc::Text("Status of the job."), |o, _| {
                json!(job_status(o))
            }),
            col(
                "Completions",
                "string",
                Doc::Field(schema::<k8s_openapi::api::batch::v1::JobStatus>, "succeeded"),
                |o, _| {
                    let succeeded = int_at(o, &["status", "succeeded"]);
                    json!(match o["spec"]["completions"].as_i64() {
                        Some(c) => format!("{succeeded}/{c}"),
                        None => match o["spec"]["parallelism"].as_i64() {
                            Some(p) if p > 1 => format!("{succeeded}/1 of {p}"),
                            _ => format!("{succeeded}/1"),
                        },
                    })
                },
            ),
            col(
                "Duration",
                "string",
                Doc::Text("Time required to complete the job."),
                |o, now| {
                    let Ok(start) = str_at(o, &["status", "startTime"]).parse::<Timestamp>() else {
                        return json!("");
                    };
                    let end = str_at(o, &["status", "completionTime"])
                        .parse::<Timestamp>()
                        .unwrap_or(now);
                    json!(super::human_duration(end.as_second() - start.as_second()))
                },
            ),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR(schema::<k8s_openapi::api::batch::v1::JobSpec>),
        ],
        ("batch", "cronjobs") => vec![
            NAME,
            col(
                "Schedule",
                "string",
                Doc::Field(schema::<k8s_openapi::api::batch::v1::CronJobSpec>, "schedule"),
                |o, _| json!(str_at(o, &["spec", "schedule"])),
            ),
            col(
                "Timezone",
                "string",
                Doc::Field(schema::<k8s_openapi::api::batch::v1::CronJobSpec>, "timeZone"),
                |o, _| json!(or_none(str_at(o, &["spec", "timeZone"]))),
            ),
            col(
                "Suspend",
                "boolean",
                Doc::Field(schema::<k8s_openapi::api::batch::v1::CronJobSpec>, "suspend"),
                |o, _| {
                    json!(match o["spec"]["suspend"].as_bool() {
                        Some(true) => "True",
                        Some(false) => "False",
                        None => "<unset>",
                    })
                },
            ),
            col(
                "Active",
                "integer",
                Doc::Field(schema::<k8s_openapi::api::batch::v1::CronJobStatus>, "active"),
                |o, _| json!(len_at(o, &["status", "active"])),
            ),
            col(
                "Last Schedule",
                "string",
                Doc::Field(schema::<k8s_openapi::api::batch::v1::CronJobStatus>, "lastScheduleTime"),
                |o, now| match str_at(o, &["status", "lastScheduleTime"]) {
                    "" => json!("<none>"),
                    t => json!(since(t, now)),
                },
            ),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR(schema::<k8s_openapi::api::batch::v1::JobSpec>),
        ],
        ("", "services") => vec![
            NAME,
            col(
                "Type",
                "string",
                Doc::Field(schema::<core::ServiceSpec>, "type"),
                |o, _| json!(str_at(o, &["spec", "type"])),
            ),
            col(
                "Cluster-IP",
                "string",
                Doc::Field(schema::<core::ServiceSpec>, "clusterIP"),
                |o, _| json!(or_none(str_at(o, &["spec", "clusterIP"]))),
            ),
            col(
                "External-IP",
                "string",
                Doc::Field(schema::<core::ServiceSpec>, "externalIPs"),
                |o, _| json!(service_external_ip(o)),
            ),
            col(
                "Port(s)",
                "string",
                Doc::Field(schema::<core::ServiceSpec>, "ports"),
                |o, _| json!(service_ports(o)),
            ),
            AGE,
            wide(col(
                "Selector",
                "string",
                Doc::Field(schema::<core::ServiceSpec>, "selector"),
                |o, _| json!(labels(&o["spec"]["selector"])),
            )),
        ],
        ("", "configmaps") => vec![
            NAME,
            col(
                "Data",
                "string",
                Doc::Field(schema::<core::ConfigMap>, "data"),
                |o, _| json!(len_at(o, &["data"]) + len_at(o, &["binaryData"])),
            ),
            AGE,
        ],
        ("", "secrets") => vec![
            NAME,
            col("Type", "string", Doc::Field(schema::<core::Secret>, "type"), |o, _| {
                json!(str_at(o, &["type"]))
            }),
            col("Data", "string", Doc::Field(schema::<core::Secret>, "data"), |o, _| {
                json!(len_at(o, &["data"]))
            }),
            AGE,
        ],
        ("", "namespaces") => vec![
            NAME,
            col("Status", "string", Doc::Text("The status of the namespace"), |o, _| {
                json!(str_at(o, &["status", "phase"]))
            }),
            AGE,
        ],
        ("", "nodes") => vec![
            NAME,
            col("Status", "string", Doc::Text("The status of the node"), |o, _| {
                json!(node_status(o))
            }),
            col("Roles", "string", Doc::Text("The roles of the node"), |o, _| {
                json!(node_roles(o))
            }),
            AGE,
            col(
                "Version",
                "string",
                Doc::Field(schema::<core::NodeSystemInfo>, "kubeletVersion"),
                |o, _| json!(str_at(o, &["status", "nodeInfo", "kubeletVersion"])),
            ),
            wide(col(
                "Internal-IP",
                "string",
                Doc::Field(schema::<core::NodeStatus>, "addresses"),
                |o, _| json!(node_address(o, "InternalIP")),
            )),
            wide(col(
                "External-IP",
                "string",
                Doc::Field(schema::<core::NodeStatus>, "addresses"),
                |o, _| json!(node_address(o, "ExternalIP")),
            )),
            wide(col(
                "OS-Image",
                "string",
                Doc::Field(schema::<core::NodeSystemInfo>, "osImage"),
                |o, _| json!(or_unknown(str_at(o, &["status", "nodeInfo", "osImage"]))),
            )),
            wide(col(
                "Kernel-Version",
                "string",
                Doc::Field(schema::<core::NodeSystemInfo>, "kernelVersion"),
                |o, _| json!(or_unknown(str_at(o, &["status", "nodeInfo", "kernelVersion"]))),
            )),
            wide(col(
                "Container-Runtime",
                "string",
                Doc::Field(schema::<core::NodeSystemInfo>, "containerRuntimeVersion"),
                |o, _| {
                    json!(or_unknown(str_at(
                        o,
                        &["status", "nodeInfo", "containerRuntimeVersion"]
                    )))
                },
            )),
        ],
        // Both Event views print the core printer's columns, as kube-apiserver's (one
        // registry); the cells read the core form the object is stored in.
        ("" | "events.k8s.io", "events") => vec![
            col(
                "Last Seen",
                "string",
                Doc::Field(schema::<core::Event>, "lastTimestamp"),
                |o, now| json!(event_times(o, now).1),
            ),
            col("Type", "string", Doc::Field(schema::<core::Event>, "type"), |o, _| {
                json!(str_at(o, &["type"]))
            }),
            col(
                "Reason",
                "string",
                Doc::Field(schema::<core::Event>, "reason"),
                |o, _| json!(str_at(o, &["reason"])),
            ),
            col(
                "Object",
                "string",
                Doc::Field(schema::<core::Event>, "involvedObject"),
                |o, _| {
                    let kind = str_at(o, &["involvedObject", "kind"]).to_lowercase();
                    json!(match str_at(o, &["involvedObject", "name"]) {
                        "" => kind,
                        name => format!("{kind}/{name}"),
                    })
                },
            ),
            wide(col(
                "Subobject",
                "string",
                Doc::Field(schema::<core::ObjectReference>, "fieldPath"),
                |o, _| json!(str_at(o, &["involvedObject", "fieldPath"])),
            )),
            wide(col(
                "Source",
                "string",
                Doc::Field(schema::<core::Event>, "source"),
                |o, _| json!(event_source(o)),
            )),
            col(
                "Message",
                "string",
                Doc::Field(schema::<core::Event>, "message"),
                |o, _| json!(str_at(o, &["message"]).trim()),
            ),
            wide(col(
                "First Seen",
                "string",
                Doc::Field(schema::<core::Event>, "firstTimestamp"),
                |o, now| json!(event_times(o, now).0),
            )),
            wide(col(
                "Count",
                "string",
                Doc::Field(schema::<core::Event>, "count"),
                |o, _| json!(event_count(o)),
            )),
            wide(NAME),
        ],
        ("", "serviceaccounts") => vec![
            NAME,
            col(
                "Secrets",
                "string",
                Doc::Field(schema::<core::ServiceAccount>, "secrets"),
                |o, _| json!(len_at(o, &["secrets"])),
            ),
            AGE,
        ],
        ("", "persistentvolumeclaims") => vec![
            NAME,
            col(
                "Status",
                "string",
                Doc::Field(schema::<core::PersistentVolumeClaimStatus>, "phase"),
                |o, _| {
                    json!(if o["metadata"]["deletionTimestamp"].is_string() {
                        "Terminating"
                    } else {
                        str_at(o, &["status", "phase"])
                    })
                },
            ),
            col(
                "Volume",
                "string",
                Doc::Field(schema::<core::PersistentVolumeClaimSpec>, "volumeName"),
                |o, _| json!(str_at(o, &["spec", "volumeName"])),
            ),
            col(
                "Capacity",
                "string",
                Doc::Field(schema::<core::PersistentVolumeClaimStatus>, "capacity"),
                |o, _| json!(str_at(o, &["status", "capacity", "storage"])),
            ),
            col(
                "Access Modes",
                "string",
                Doc::Field(schema::<core::PersistentVolumeClaimStatus>, "accessModes"),
                |o, _| json!(access_modes(&o["status"]["accessModes"])),
            ),
            col(
                "StorageClass",
                "string",
                Doc::Text("StorageClass of the pvc"),
                |o, _| json!(str_at(o, &["spec", "storageClassName"])),
            ),
            col(
                "VolumeAttributesClass",
                "string",
                Doc::Text("VolumeAttributesClass of the pvc"),
                |o, _| {
                    json!(match str_at(o, &["spec", "volumeAttributesClassName"]) {
                        "" => "<unset>",
                        c => c,
                    })
                },
            ),
            AGE,
            wide(col(
                "VolumeMode",
                "string",
                Doc::Field(schema::<core::PersistentVolumeClaimSpec>, "volumeMode"),
                |o, _| {
                    json!(match str_at(o, &["spec", "volumeMode"]) {
                        "" => "<unset>",
                        m => m,
                    })
                },
            )),
        ],
        ("", "endpoints") => vec![
            NAME,
            col(
                "Endpoints",
                "string",
                Doc::Field(schema::<core::Endpoints>, "subsets"),
                |o, _| json!(endpoints(o)),
            ),
            AGE,
        ],
        ("coordination.k8s.io", "leases") => vec![
            NAME,
            col(
                "Holder",
                "string",
                Doc::Field(
                    schema::<k8s_openapi::api::coordination::v1::LeaseSpec>,
                    "holderIdentity",
                ),
                |o, _| json!(str_at(o, &["spec", "holderIdentity"])),
            ),
            AGE,
        ],
        ("networking.k8s.io", "ingresses") => vec![
            NAME,
            col(
                "Class",
                "string",
                Doc::Text("The name of the IngressClass resource that should be used for additional configuration"),
                |o, _| {
                    json!(match str_at(o, &["spec", "ingressClassName"]) {
                        "" => "<none>",
                        c => c,
                    })
                },
            ),
            col(
                "Hosts",
                "string",
                Doc::Text("Hosts that incoming requests are matched against before the ingress rule"),
                |o, _| json!(ingress_hosts(o)),
            ),
            col(
                "Address",
                "string",
                Doc::Text("Address is a list containing ingress points for the load-balancer"),
                |o, _| json!(load_balancer(&o["status"]["loadBalancer"]["ingress"]).join(",")),
            ),
            col(
                "Ports",
                "string",
                Doc::Text("Ports of TLS configurations that open"),
                |o, _| {
                    json!(if len_at(o, &["spec", "tls"]) > 0 {
                        "80, 443"
                    } else {
                        "80"
                    })
                },
            ),
            AGE,
        ],
        ("rbac.authorization.k8s.io", "roles" | "clusterroles") => vec![NAME, CREATED_AT],
        ("rbac.authorization.k8s.io", "rolebindings") => role_binding_columns(
            Doc::Field(schema::<k8s_openapi::api::rbac::v1::RoleBinding>, "roleRef"),
            [
                "Users in the roleBinding",
                "Groups in the roleBinding",
                "ServiceAccounts in the roleBinding",
            ],
        ),
        ("rbac.authorization.k8s.io", "clusterrolebindings") => role_binding_columns(
            Doc::Field(schema::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>, "roleRef"),
            [
                "Users in the clusterRoleBinding",
                "Groups in the clusterRoleBinding",
                "ServiceAccounts in the clusterRoleBinding",
            ],
        ),
        ("discovery.k8s.io", "endpointslices") => vec![
            NAME,
            col(
                "AddressType",
                "string",
                Doc::Field(schema::<k8s_openapi::api::discovery::v1::EndpointSlice>, "addressType"),
                |o, _| json!(str_at(o, &["addressType"])),
            ),
            col(
                "Ports",
                "string",
                Doc::Field(schema::<k8s_openapi::api::discovery::v1::EndpointSlice>, "ports"),
                |o, _| {
                    let ports = o["ports"].as_array().into_iter().flatten().map(|p| {
                        match (p["port"].as_i64(), p["name"].as_str()) {
                            (Some(port), _) => port.to_string(),
                            (None, Some(name)) => name.to_owned(),
                            (None, None) => "*".to_owned(),
                        }
                    });
                    json!(list_with_more(ports.collect()))
                },
            ),
            col(
                "Endpoints",
                "string",
                Doc::Field(schema::<k8s_openapi::api::discovery::v1::EndpointSlice>, "endpoints"),
                |o, _| {
                    let addresses = o["endpoints"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
                        .map(|a| a.as_str().unwrap_or("").to_owned());
                    json!(list_with_more(addresses.collect()))
                },
            ),
            AGE,
        ],
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations" | "validatingwebhookconfigurations") => vec![
            NAME,
            col(
                "Webhooks",
                "integer",
                Doc::Text("Webhooks indicates the number of webhooks registered in this configuration"),
                |o, _| json!(len_at(o, &["webhooks"])),
            ),
            AGE,
        ],
        _ => vec![NAME, CREATED_AT],
    }
}

/// A RoleBinding's or ClusterRoleBinding's columns: the Go printer words the subjects' columns
/// after the kind.
fn role_binding_columns(role_ref: Doc, subjects_docs: [&'static str; 3]) -> Vec<BuiltinColumn> {
    let [users, groups, service_accounts] = subjects_docs;
    vec![
        NAME,
        col("Role", "string", role_ref, |o, _| {
            json!(format!(
                "{}/{}",
                str_at(o, &["roleRef", "kind"]),
                str_at(o, &["roleRef", "name"])
            ))
        }),
        AGE,
        wide(col("Users", "string", Doc::Text(users), |o, _| {
            json!(subjects(o, "User"))
        })),
        wide(col("Groups", "string", Doc::Text(groups), |o, _| {
            json!(subjects(o, "Group"))
        })),
        wide(col("ServiceAccounts", "string", Doc::Text(service_accounts), |o, _| {
            json!(subjects(o, "ServiceAccount"))
        })),
    ]
}

/// The first three items joined by `,`, then ` + <n> more...`; `<unset>` for none (the Go
/// printers' `listWithMoreString`).
fn list_with_more(items: Vec<String>) -> String {
    const MAX: usize = 3;
    match items.len() {
        0 => "<unset>".to_owned(),
        n if n > MAX => format!("{} + {} more...", items[..MAX].join(","), n - MAX),
        _ => items.join(","),
    }
}

/// The string at `path` (`""` when absent or not a string); a numeric step indexes an array.
fn str_at<'a>(o: &'a Value, path: &[&str]) -> &'a str {
    value_at(o, path).and_then(Value::as_str).unwrap_or("")
}

fn value_at<'a>(o: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(o, |v, step| match step.parse::<usize>() {
        Ok(i) => v.get(i),
        Err(_) => v.get(*step),
    })
}

/// The integer at `path` (`0` when absent, as Go's zero value).
fn int_at(o: &Value, path: &[&str]) -> i64 {
    value_at(o, path).and_then(Value::as_i64).unwrap_or(0)
}

/// The number of entries of the array or map at `path`.
fn len_at(o: &Value, path: &[&str]) -> usize {
    match value_at(o, path) {
        Some(Value::Array(a)) => a.len(),
        Some(Value::Object(m)) => m.len(),
        _ => 0,
    }
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "<none>" } else { s }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "<unknown>" } else { s }
}

/// `translateTimestampSince`: the age of an RFC 3339 time, `<unknown>` when unset.
fn since(t: &str, now: Timestamp) -> String {
    super::age(t, now)
}

/// A pod template's containers' `field` (`name`, `image`), comma-separated.
fn template_containers(o: &Value, field: &str) -> String {
    o["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c[field].as_str().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(",")
}

/// A label map as `labels.FormatLabels` prints it: `k=v` sorted by key, comma-separated;
/// `<none>` when empty.
fn labels(map: &Value) -> String {
    let Some(m) = map.as_object().filter(|m| !m.is_empty()) else {
        return "<none>".into();
    };
    // serde_json's map is ordered by key.
    m.iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join(",")
}

/// A `LabelSelector` as `LabelSelectorAsSelector(..).String()`: requirements sorted by key
/// (`app=web`, `tier in (a,b)`, `x notin (y)`, `k`, `!k`); `<none>` for a nil selector, `""`
/// for the empty one.
fn label_selector(selector: &Value) -> String {
    if selector.is_null() {
        return "<none>".into();
    }
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(m) = selector["matchLabels"].as_object() {
        for (k, v) in m {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for e in selector["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or("");
        let mut values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        values.sort_unstable();
        let text = match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other}"),
        };
        reqs.push((key.to_owned(), text));
    }
    reqs.sort();
    reqs.into_iter().map(|(_, t)| t).collect::<Vec<_>>().join(",")
}

/// What a Pod's `Ready`, `Status` and `Restarts` cells show.
struct PodSummary {
    ready: usize,
    total: usize,
    reason: String,
    restarts: i64,
    /// The latest `lastState.terminated.finishedAt` of the containers counted.
    last_restart: Option<String>,
}

fn is_true_condition(o: &Value, ty: &str) -> bool {
    o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == ty && c["status"] == "True")
}

fn latest(current: Option<String>, candidate: &Value) -> Option<String> {
    let Some(t) = candidate["lastState"]["terminated"]["finishedAt"].as_str() else {
        return current;
    };
    match current {
        Some(c) if c.as_str() >= t => Some(c),
        _ => Some(t.to_owned()),
    }
}

/// `printPod`'s computation: the phase (or `status.reason`), then the first init container
/// not done (`Init:<reason>`, `Init:ExitCode:N`, `Init:i/n`), then the app containers' waiting or
/// terminated reasons (the first container's wins), `Completed` with a running container back to
/// `Running`/`NotReady`, and `Terminating` for a pod being deleted. Restartable (sidecar) init
/// containers count among the containers.
fn pod_summary(o: &Value) -> PodSummary {
    let status = &o["status"];
    let spec_init: Vec<&Value> = o["spec"]["initContainers"].as_array().into_iter().flatten().collect();
    let sidecar = |name: &str| {
        spec_init
            .iter()
            .any(|c| c["name"] == name && c["restartPolicy"] == "Always")
    };
    let total =
        len_at(o, &["spec", "containers"]) + spec_init.iter().filter(|c| c["restartPolicy"] == "Always").count();
    let phase = status["phase"].as_str().unwrap_or("");
    let mut reason = match status["reason"].as_str() {
        Some(r) if !r.is_empty() => r.to_owned(),
        _ => phase.to_owned(),
    };
    if status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated")
    {
        reason = "SchedulingGated".into();
    }
    let (mut ready, mut restarts, mut last_restart) = (0usize, 0i64, None::<String>);
    let (mut sidecar_restarts, mut sidecar_last) = (0i64, None::<String>);
    let mut initializing = false;
    for (i, c) in status["initContainerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let count = c["restartCount"].as_i64().unwrap_or(0);
        restarts += count;
        last_restart = latest(last_restart, c);
        let is_sidecar = sidecar(c["name"].as_str().unwrap_or(""));
        if is_sidecar {
            sidecar_restarts += count;
            sidecar_last = latest(sidecar_last, c);
            if c["started"] == true && c["ready"] == true {
                ready += 1;
            }
        }
        let terminated = &c["state"]["terminated"];
        let waiting = &c["state"]["waiting"];
        if terminated.is_object() && terminated["exitCode"].as_i64().unwrap_or(0) == 0 {
            continue;
        }
        if is_sidecar && c["started"] == true {
            continue;
        }
        initializing = true;
        reason = if terminated.is_object() {
            match terminated["reason"].as_str().unwrap_or("") {
                "" => match terminated["signal"].as_i64().unwrap_or(0) {
                    0 => format!("Init:ExitCode:{}", terminated["exitCode"].as_i64().unwrap_or(0)),
                    s => format!("Init:Signal:{s}"),
                },
                r => format!("Init:{r}"),
            }
        } else {
            match waiting["reason"].as_str().unwrap_or("") {
                r if !r.is_empty() && r != "PodInitializing" => format!("Init:{r}"),
                _ => format!("Init:{i}/{}", spec_init.len()),
            }
        };
        break;
    }
    if !initializing || is_true_condition(o, "Initialized") {
        restarts = sidecar_restarts;
        last_restart = sidecar_last;
        let mut has_running = false;
        let statuses: Vec<&Value> = status["containerStatuses"].as_array().into_iter().flatten().collect();
        for c in statuses.iter().rev() {
            restarts += c["restartCount"].as_i64().unwrap_or(0);
            last_restart = latest(last_restart, c);
            let waiting = c["state"]["waiting"]["reason"].as_str().unwrap_or("");
            let terminated = &c["state"]["terminated"];
            if !waiting.is_empty() {
                reason = waiting.to_owned();
            } else if terminated.is_object() {
                reason = match terminated["reason"].as_str().unwrap_or("") {
                    "" => match terminated["signal"].as_i64().unwrap_or(0) {
                        0 => format!("ExitCode:{}", terminated["exitCode"].as_i64().unwrap_or(0)),
                        s => format!("Signal:{s}"),
                    },
                    r => r.to_owned(),
                };
            } else if c["ready"] == true && c["state"]["running"].is_object() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = if is_true_condition(o, "Ready") {
                "Running"
            } else {
                "NotReady"
            }
            .into();
        }
    }
    let deleting = o["metadata"]["deletionTimestamp"].is_string();
    if deleting && status["reason"] == "NodeLost" {
        reason = "Unknown".into();
    } else if deleting && !matches!(phase, "Succeeded" | "Failed") {
        reason = "Terminating".into();
    }
    PodSummary {
        ready,
        total,
        reason,
        restarts,
        last_restart,
    }
}

/// `true/total` of a Pod's readiness gates, `<none>` without gates.
fn readiness_gates(o: &Value) -> String {
    let gates: Vec<&str> = o["spec"]["readinessGates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["conditionType"].as_str())
        .collect();
    if gates.is_empty() {
        return "<none>".into();
    }
    let met = gates.iter().filter(|g| is_true_condition(o, g)).count();
    format!("{met}/{}", gates.len())
}

/// A Job's status as the 1.32 printer names it.
fn job_status(o: &Value) -> &'static str {
    for (condition, shown) in [
        ("Complete", "Complete"),
        ("Failed", "Failed"),
        ("FailureTarget", "FailureTarget"),
        ("SuccessCriteriaMet", "SuccessCriteriaMet"),
        ("Suspended", "Suspended"),
    ] {
        if is_true_condition(o, condition) {
            return shown;
        }
    }
    if o["metadata"]["deletionTimestamp"].is_string() {
        "Terminating"
    } else {
        "Running"
    }
}

/// Load-balancer ingress points: IPs, else hostnames.
fn load_balancer(ingress: &Value) -> Vec<String> {
    ingress
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["ip"].as_str().or_else(|| i["hostname"].as_str()))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `getServiceExternalIP`.
fn service_external_ip(o: &Value) -> String {
    let external: Vec<String> = o["spec"]["externalIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    match str_at(o, &["spec", "type"]) {
        "ClusterIP" | "NodePort" | "" => {
            if external.is_empty() {
                "<none>".into()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            let mut all = load_balancer(&o["status"]["loadBalancer"]["ingress"]);
            all.extend(external);
            if all.is_empty() {
                "<pending>".into()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => str_at(o, &["spec", "externalName"]).to_owned(),
        _ => "<unknown>".into(),
    }
}

/// `makePortString`: `port[:nodePort]/protocol`, comma-separated; `<none>` without ports.
fn service_ports(o: &Value) -> String {
    let ports: Vec<String> = o["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let protocol = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64() {
                Some(n) if n > 0 => format!("{}:{n}/{protocol}", p["port"]),
                _ => format!("{}/{protocol}", p["port"]),
            }
        })
        .collect();
    if ports.is_empty() {
        "<none>".into()
    } else {
        ports.join(",")
    }
}

/// A Node's `Ready` condition (`Ready`, `NotReady`, `Unknown`), with `SchedulingDisabled`.
fn node_status(o: &Value) -> String {
    let mut out: Vec<&str> = Vec::new();
    for c in o["status"]["conditions"].as_array().into_iter().flatten() {
        if c["type"] == "Ready" {
            out.push(match c["status"].as_str() {
                Some("True") => "Ready",
                Some("False") => "NotReady",
                _ => "Unknown",
            });
        }
    }
    if out.is_empty() {
        out.push("Unknown");
    }
    if o["spec"]["unschedulable"] == true {
        out.push("SchedulingDisabled");
    }
    out.join(",")
}

/// A Node's roles from its `node-role.kubernetes.io/<role>` and `kubernetes.io/role` labels.
fn node_roles(o: &Value) -> String {
    let mut roles: Vec<&str> = Vec::new();
    for (k, v) in o["metadata"]["labels"].as_object().into_iter().flatten() {
        if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
            if !role.is_empty() {
                roles.push(role);
            }
        } else if k == "kubernetes.io/role"
            && let Some(role) = v.as_str().filter(|r| !r.is_empty())
        {
            roles.push(role);
        }
    }
    roles.sort_unstable();
    roles.dedup();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
}

fn node_address(o: &Value, ty: &str) -> String {
    o["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == ty)
        .and_then(|a| a["address"].as_str())
        .unwrap_or("<none>")
        .to_owned()
}

/// An Event's (`First Seen`, `Last Seen`): `firstTimestamp` (else `eventTime`), and
/// `series.lastObservedTime`, else `lastTimestamp`, else the first.
fn event_times(o: &Value, now: Timestamp) -> (String, String) {
    let first = match str_at(o, &["firstTimestamp"]) {
        "" => since(str_at(o, &["eventTime"]), now),
        t => since(t, now),
    };
    let last = if o["series"].is_object() {
        since(str_at(o, &["series", "lastObservedTime"]), now)
    } else {
        match str_at(o, &["lastTimestamp"]) {
            "" => first.clone(),
            t => since(t, now),
        }
    };
    (first, last)
}

/// An Event's count: `series.count`, else `count`, else 1.
fn event_count(o: &Value) -> i64 {
    if o["series"].is_object() {
        return int_at(o, &["series", "count"]);
    }
    match int_at(o, &["count"]) {
        0 => 1,
        c => c,
    }
}

/// `formatEventSource`: the source component (else `reportingComponent`) and host (else
/// `reportingInstance`), as `component, host`.
fn event_source(o: &Value) -> String {
    let component = match str_at(o, &["source", "component"]) {
        "" => str_at(o, &["reportingComponent"]),
        c => c,
    };
    let host = match str_at(o, &["source", "host"]) {
        "" => str_at(o, &["reportingInstance"]),
        h => h,
    };
    match host {
        "" => component.to_owned(),
        h => format!("{component}, {h}"),
    }
}

/// `RWO`, `ROX`, `RWX`, `RWOP`, comma-separated.
fn access_modes(modes: &Value) -> String {
    let mut out: Vec<&str> = Vec::new();
    for m in modes.as_array().into_iter().flatten().filter_map(Value::as_str) {
        let short = match m {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            _ => continue,
        };
        if !out.contains(&short) {
            out.push(short);
        }
    }
    out.join(",")
}

/// `formatEndpoints`: `ip:port` pairs, at most three then ` + N more...`; `<none>`.
fn endpoints(o: &Value) -> String {
    let mut all: Vec<String> = Vec::new();
    for subset in o["subsets"].as_array().into_iter().flatten() {
        let ports: Vec<String> = subset["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p["port"].to_string())
            .collect();
        for a in subset["addresses"].as_array().into_iter().flatten() {
            let ip = a["ip"].as_str().unwrap_or("");
            if ports.is_empty() {
                all.push(ip.to_owned());
            }
            for p in &ports {
                all.push(format!("{ip}:{p}"));
            }
        }
    }
    if all.is_empty() {
        return "<none>".into();
    }
    let more = all.len().saturating_sub(3);
    all.truncate(3);
    let mut out = all.join(",");
    if more > 0 {
        out.push_str(&format!(" + {more} more..."));
    }
    out
}

/// An Ingress's rule hosts, at most four then ` + N more...`; `*` when no rule names one.
fn ingress_hosts(o: &Value) -> String {
    let hosts: Vec<&str> = o["spec"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["host"].as_str())
        .filter(|h| !h.is_empty())
        .collect();
    if hosts.is_empty() {
        return "*".into();
    }
    let mut out = hosts.iter().take(4).copied().collect::<Vec<_>>().join(",");
    if hosts.len() > 4 {
        out.push_str(&format!(" + {} more...", hosts.len() - 4));
    }
    out
}

/// A binding's subjects of `kind`, comma-separated (`namespace/name` for service accounts).
fn subjects(o: &Value, kind: &str) -> String {
    o["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == kind)
        .map(|s| match (kind, s["namespace"].as_str()) {
            ("ServiceAccount", Some(ns)) => format!("{ns}/{}", s["name"].as_str().unwrap_or("")),
            _ => s["name"].as_str().unwrap_or("").to_owned(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(group: &str, plural: &str, o: &Value) -> Vec<Value> {
        let now: Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        columns(group, plural).iter().map(|c| (c.cell)(o, now)).collect()
    }

    #[test]
    fn pod_cells_follow_the_go_printer() {
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.1"}], "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
                 "lastState": {"terminated": {"finishedAt": "2026-01-01T00:55:00Z"}}},
                {"name": "b", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert_eq!(
            cells("", "pods", &pod),
            json!([
                "p",
                "1/2",
                "CrashLoopBackOff",
                "2 (5m ago)",
                "60m",
                "10.0.0.1",
                "n1",
                "<none>",
                "<none>"
            ])
            .as_array()
            .unwrap()
            .clone()
        );
        let init = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}],
            "initContainers": [{"name": "i0"}, {"name": "i1"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i0", "state": {"terminated": {"exitCode": 0}}},
                {"name": "i1", "state": {"running": {}}}]}});
        assert_eq!(pod_summary(&init).reason, "Init:1/2");
        let deleting = json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Running"}});
        assert_eq!(pod_summary(&deleting).reason, "Terminating");
    }

    #[test]
    fn selectors_and_labels_print_sorted() {
        let sel = json!({"matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [{"key": "c", "operator": "In", "values": ["y", "x"]}]});
        assert_eq!(label_selector(&sel), "a=1,b=2,c in (x,y)");
        assert_eq!(labels(&json!({})), "<none>");
    }

    #[test]
    fn event_cells_read_series_and_fallbacks() {
        let ev = json!({"metadata": {"name": "e"}, "type": "Normal", "reason": "Scaled",
            "involvedObject": {"kind": "Deployment", "name": "web"}, "message": " up ",
            "eventTime": "2026-01-01T00:50:00.000000Z", "reportingComponent": "ctl"});
        assert_eq!(
            cells("", "events", &ev),
            json!([
                "10m",
                "Normal",
                "Scaled",
                "deployment/web",
                "",
                "ctl",
                "up",
                "10m",
                1,
                "e"
            ])
            .as_array()
            .unwrap()
            .clone()
        );
    }

    #[test]
    fn endpoint_slice_cells_list_three_then_count_the_rest() {
        let slice = json!({"metadata": {"name": "s", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "addressType": "IPv4", "ports": [{"port": 80}, {"name": "http"}, {}],
            "endpoints": [{"addresses": ["10.0.0.1", "10.0.0.2"]}, {"addresses": ["10.0.0.3", "10.0.0.4"]}]});
        assert_eq!(
            cells("discovery.k8s.io", "endpointslices", &slice),
            vec![
                json!("s"),
                json!("IPv4"),
                json!("80,http,*"),
                json!("10.0.0.1,10.0.0.2,10.0.0.3 + 1 more..."),
                json!("60m")
            ]
        );
        let empty = json!({"metadata": {"name": "e"}, "addressType": "IPv6"});
        assert_eq!(
            cells("discovery.k8s.io", "endpointslices", &empty)[2..4],
            [json!("<unset>"), json!("<unset>")]
        );
    }

    /// Column names, types and -o wide priorities as printers.go declares them.
    #[test]
    fn column_types_and_priorities_match_the_go_printers() {
        let shape = |group: &str, plural: &str| -> Vec<(&'static str, &'static str, u8)> {
            columns(group, plural)
                .iter()
                .map(|c| (c.name, c.ty, c.priority))
                .collect()
        };
        assert_eq!(
            shape("apps", "deployments"),
            [
                ("Name", "string", 0),
                ("Ready", "string", 0),
                ("Up-to-date", "string", 0),
                ("Available", "string", 0),
                ("Age", "string", 0),
                ("Containers", "string", 1),
                ("Images", "string", 1),
                ("Selector", "string", 1)
            ]
        );
        assert_eq!(shape("", "configmaps")[1], ("Data", "string", 0));
        assert_eq!(shape("", "secrets")[2], ("Data", "string", 0));
        assert_eq!(shape("apps", "replicasets")[1], ("Desired", "integer", 0));
        let crb = columns("rbac.authorization.k8s.io", "clusterrolebindings");
        assert!(matches!(crb[3].doc, Doc::Text("Users in the clusterRoleBinding")));
        assert_eq!(crb[3].priority, 1);
    }
}
