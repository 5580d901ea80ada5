//! Defaulting of built-in objects, as kube-apiserver's defaulting functions fill the fields a
//! client left unset on every create, update and patch: a controller that reads
//! `deployment.spec.replicas` sees `1` here as on a cluster.
//!
//! Covered: Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, CronJob (their own fields and
//! their Pod templates), Pod and Service, and CustomResourceDefinitions (`crd::defaults`). Only unset (absent or `null`) fields are filled; a
//! value the client sent is never changed. Not covered: what admission plugins or registries
//! add rather than defaulting (a Service's allocated `clusterIP`, a Pod's default tolerations,
//! a Job's generated selector and labels), and the many rarely read defaults of other kinds.

use serde_json::{Value, json};

/// Fills the unset fields of `obj`, an object of built-in `group`/`kind`; other kinds
/// (custom resources included) are left alone.
pub(crate) fn apply(group: &str, kind: &str, obj: &mut Value) {
    match (group, kind) {
        ("apps", "Deployment") => deployment(obj),
        ("apps", "ReplicaSet") => replica_set(obj),
        ("apps", "StatefulSet") => stateful_set(obj),
        ("apps", "DaemonSet") => daemon_set(obj),
        ("batch", "Job") => job(obj),
        ("batch", "CronJob") => cron_job(obj),
        ("", "Pod") => pod(obj),
        ("", "Service") => service(obj),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration") => {
            crate::admission::default_configuration(kind, obj)
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => crate::crd::defaults(obj),
        _ => {}
    }
}

/// Sets `obj[key]` to `value` unless it holds a non-null value (nothing if `obj` is not an
/// object: a malformed body is the decoder's business, not the defaulter's).
fn default(obj: &mut Value, key: &str, value: Value) {
    if let Some(map) = obj.as_object_mut()
        && map.get(key).is_none_or(Value::is_null)
    {
        map.insert(key.to_owned(), value);
    }
}

/// `obj[key]` as an object, created empty when unset; `None` when either is not an object.
fn child<'a>(obj: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    let entry = obj.as_object_mut()?.entry(key.to_owned()).or_insert_with(|| json!({}));
    if entry.is_null() {
        *entry = json!({});
    }
    entry.is_object().then_some(entry)
}

/// Every object element of the array `obj[key]`, if there is one.
fn each<'a>(obj: &'a mut Value, key: &str) -> impl Iterator<Item = &'a mut Value> {
    obj.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter(|v| v.is_object())
}

fn deployment(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    default(spec, "replicas", json!(1));
    default(spec, "revisionHistoryLimit", json!(10));
    default(spec, "progressDeadlineSeconds", json!(600));
    if let Some(strategy) = child(spec, "strategy") {
        default(strategy, "type", json!("RollingUpdate"));
        if strategy["type"] == "RollingUpdate"
            && let Some(rolling) = child(strategy, "rollingUpdate")
        {
            default(rolling, "maxUnavailable", json!("25%"));
            default(rolling, "maxSurge", json!("25%"));
        }
    }
    pod_template(spec);
}

fn replica_set(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    default(spec, "replicas", json!(1));
    pod_template(spec);
}

fn stateful_set(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    default(spec, "replicas", json!(1));
    default(spec, "podManagementPolicy", json!("OrderedReady"));
    default(spec, "revisionHistoryLimit", json!(10));
    default(
        spec,
        "persistentVolumeClaimRetentionPolicy",
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
    );
    if let Some(strategy) = child(spec, "updateStrategy") {
        default(strategy, "type", json!("RollingUpdate"));
        if strategy["type"] == "RollingUpdate"
            && let Some(rolling) = child(strategy, "rollingUpdate")
        {
            default(rolling, "partition", json!(0));
        }
    }
    pod_template(spec);
}

fn daemon_set(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    default(spec, "revisionHistoryLimit", json!(10));
    if let Some(strategy) = child(spec, "updateStrategy") {
        default(strategy, "type", json!("RollingUpdate"));
        if strategy["type"] == "RollingUpdate"
            && let Some(rolling) = child(strategy, "rollingUpdate")
        {
            default(rolling, "maxUnavailable", json!(1));
            default(rolling, "maxSurge", json!(0));
        }
    }
    pod_template(spec);
}

fn job(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    job_spec(spec);
}

/// A Job's spec: one completion at a time unless told otherwise, six retries.
fn job_spec(spec: &mut Value) {
    if spec.get("completions").is_none_or(Value::is_null) && spec.get("parallelism").is_none_or(Value::is_null) {
        default(spec, "completions", json!(1));
    }
    default(spec, "parallelism", json!(1));
    default(spec, "backoffLimit", json!(6));
    default(spec, "completionMode", json!("NonIndexed"));
    default(spec, "suspend", json!(false));
    let replacement = if spec.get("podFailurePolicy").is_some_and(|p| !p.is_null()) {
        "Failed"
    } else {
        "TerminatingOrFailed"
    };
    default(spec, "podReplacementPolicy", json!(replacement));
    pod_template(spec);
}

fn cron_job(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    default(spec, "concurrencyPolicy", json!("Allow"));
    default(spec, "suspend", json!(false));
    default(spec, "successfulJobsHistoryLimit", json!(3));
    default(spec, "failedJobsHistoryLimit", json!(1));
    if let Some(job) = child(spec, "jobTemplate")
        && let Some(job_spec) = child(job, "spec")
    {
        pod_template(job_spec);
    }
}

fn pod(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    pod_spec(spec);
    default(spec, "enableServiceLinks", json!(true));
    default(spec, "priority", json!(0));
    default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
}

/// `spec.template.spec` of a workload.
fn pod_template(spec: &mut Value) {
    if let Some(template) = child(spec, "template")
        && let Some(pod_spec_value) = child(template, "spec")
    {
        pod_spec(pod_spec_value);
    }
}

fn pod_spec(spec: &mut Value) {
    default(spec, "restartPolicy", json!("Always"));
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "dnsPolicy", json!("ClusterFirst"));
    default(spec, "schedulerName", json!("default-scheduler"));
    default(spec, "securityContext", json!({}));
    for list in ["initContainers", "containers"] {
        for container in each(spec, list) {
            default(container, "terminationMessagePath", json!("/dev/termination-log"));
            default(container, "terminationMessagePolicy", json!("File"));
            default(container, "resources", json!({}));
            let policy = image_pull_policy(container.get("image").and_then(Value::as_str).unwrap_or(""));
            default(container, "imagePullPolicy", json!(policy));
            for port in each(container, "ports") {
                default(port, "protocol", json!("TCP"));
            }
        }
    }
}

/// kube-apiserver's rule: `Always` for an image without a tag or tagged `latest` (and not
/// pinned by digest), else `IfNotPresent`.
fn image_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    // The tag follows the last `:` after the last `/` (a registry port comes before a `/`).
    let last_segment = image.rsplit('/').next().unwrap_or(image);
    match last_segment.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn service(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    default(spec, "type", json!("ClusterIP"));
    default(spec, "sessionAffinity", json!("None"));
    let kind = spec["type"].as_str().unwrap_or("").to_owned();
    if kind != "ExternalName" {
        default(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
        default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    for port in each(spec, "ports") {
        default(port, "protocol", json!("TCP"));
        let unset = match port.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => n.as_u64() == Some(0),
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        if unset && let Some(number) = port.get("port").cloned() {
            port["targetPort"] = number;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_pull_policy_follows_the_tag() {
        for (image, policy) in [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.27", "IfNotPresent"),
            ("registry.local:5000/team/app", "Always"),
            ("registry.local:5000/team/app:v2", "IfNotPresent"),
            ("nginx@sha256:0123", "IfNotPresent"),
        ] {
            assert_eq!(image_pull_policy(image), policy, "{image}");
        }
    }

    #[test]
    fn only_unset_fields_are_filled_and_other_kinds_are_untouched() {
        let mut d = json!({"spec": {"replicas": 3, "strategy": {"type": "Recreate"},
            "template": {"spec": {"containers": [{"name": "c", "image": "nginx:1", "imagePullPolicy": "Never"}]}}}});
        apply("apps", "Deployment", &mut d);
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(
            d["spec"]["strategy"],
            json!({"type": "Recreate"}),
            "no rollingUpdate for Recreate"
        );
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Never");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");

        let mut foo = json!({"spec": {}});
        apply("example.com", "Deployment", &mut foo);
        assert_eq!(foo, json!({"spec": {}}));
        let mut odd = json!({"spec": "not an object"});
        apply("apps", "Deployment", &mut odd);
        assert_eq!(odd, json!({"spec": "not an object"}));
    }

    #[test]
    fn job_completions_and_service_target_ports() {
        let mut j = json!({"spec": {"parallelism": 4}});
        apply("batch", "Job", &mut j);
        assert_eq!(
            j["spec"].get("completions"),
            None,
            "a work queue Job has no completions"
        );
        assert_eq!(
            (j["spec"]["parallelism"].clone(), j["spec"]["backoffLimit"].clone()),
            (json!(4), json!(6))
        );
        let mut s = json!({"spec": {"ports": [{"port": 80}, {"port": 443, "targetPort": "https"}]}});
        apply("", "Service", &mut s);
        assert_eq!(
            s["spec"]["ports"][0],
            json!({"port": 80, "targetPort": 80, "protocol": "TCP"})
        );
        assert_eq!(s["spec"]["ports"][1]["targetPort"], "https");
        assert_eq!(s["spec"]["type"], "ClusterIP");
    }
}
