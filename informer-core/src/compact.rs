//! Giving back the spare capacity decoding leaves in the objects a cache keeps.
//!
//! serde decodes a JSON array into a `Vec` that grows by doubling (from 4 elements, or from 1
//! for elements over 1 KB), so a decoded object holds room for elements it does not have: a
//! Pod's one owner reference sits in room for four, its three volumes in room for four
//! `Volume`s of ~1.7 KB each. The cache keeps every object for its lifetime, so the lists are
//! shrunk to their length once, right after decoding (on the list decoder's thread for list
//! pages). kube-runtime's store gets the same effect by cloning each object (a clone has no
//! spare capacity), which costs a second allocation of everything and the free of the first.
//!
//! Every object's metadata lists are shrunk. The lists inside the rest of an object are
//! type-specific; this module walks them for `Pod`, the kind whose caches are the largest in
//! most clusters. Other kinds keep the rest as decoded.

use std::any::Any;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, EphemeralContainer, Pod};
use kube::Resource;

/// Shrinks the lists of a freshly decoded object to their length (see the module doc).
pub(crate) fn compact<K: Resource + 'static>(obj: &mut K) {
    let meta = obj.meta_mut();
    shrink(&mut meta.owner_references);
    shrink(&mut meta.finalizers);
    shrink(&mut meta.managed_fields);
    if let Some(pod) = (obj as &mut dyn Any).downcast_mut::<Pod>() {
        compact_pod(pod);
    }
}

fn shrink<T>(list: &mut Option<Vec<T>>) {
    if let Some(list) = list {
        list.shrink_to_fit();
    }
}

fn compact_pod(pod: &mut Pod) {
    if let Some(spec) = &mut pod.spec {
        spec.containers.shrink_to_fit();
        spec.containers.iter_mut().for_each(compact_container);
        shrink(&mut spec.init_containers);
        spec.init_containers.iter_mut().flatten().for_each(compact_container);
        shrink(&mut spec.ephemeral_containers);
        spec.ephemeral_containers
            .iter_mut()
            .flatten()
            .for_each(compact_ephemeral_container);
        shrink(&mut spec.volumes);
        for volume in spec.volumes.iter_mut().flatten() {
            if let Some(projected) = &mut volume.projected {
                shrink(&mut projected.sources);
            }
        }
        shrink(&mut spec.tolerations);
        shrink(&mut spec.image_pull_secrets);
        shrink(&mut spec.host_aliases);
        shrink(&mut spec.topology_spread_constraints);
        shrink(&mut spec.readiness_gates);
        shrink(&mut spec.resource_claims);
        shrink(&mut spec.scheduling_gates);
    }
    if let Some(status) = &mut pod.status {
        shrink(&mut status.conditions);
        shrink(&mut status.pod_ips);
        shrink(&mut status.host_ips);
        for statuses in [
            &mut status.container_statuses,
            &mut status.init_container_statuses,
            &mut status.ephemeral_container_statuses,
        ] {
            shrink(statuses);
            statuses.iter_mut().flatten().for_each(compact_container_status);
        }
    }
}

/// Shrinks the lists of a `Container` or an `EphemeralContainer` (the same fields, two types).
macro_rules! compact_container_lists {
    ($container:expr) => {{
        let container = $container;
        shrink(&mut container.args);
        shrink(&mut container.command);
        shrink(&mut container.env);
        shrink(&mut container.env_from);
        shrink(&mut container.ports);
        shrink(&mut container.volume_mounts);
        shrink(&mut container.volume_devices);
    }};
}

fn compact_container(container: &mut Container) {
    compact_container_lists!(container);
}

fn compact_ephemeral_container(container: &mut EphemeralContainer) {
    compact_container_lists!(container);
}

fn compact_container_status(status: &mut ContainerStatus) {
    shrink(&mut status.volume_mounts);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    /// Every `Vec` this test reaches whose capacity is not its length, by path.
    fn spare(pod: &Pod) -> Vec<String> {
        fn check<T>(path: &str, list: Option<&Vec<T>>, out: &mut Vec<String>) {
            if let Some(list) = list
                && list.capacity() != list.len()
            {
                out.push(format!("{path}: {} of {}", list.len(), list.capacity()));
            }
        }
        let mut out = Vec::new();
        check("ownerReferences", pod.metadata.owner_references.as_ref(), &mut out);
        let spec = pod.spec.as_ref().expect("spec");
        check("containers", Some(&spec.containers), &mut out);
        for c in &spec.containers {
            check("env", c.env.as_ref(), &mut out);
            check("ports", c.ports.as_ref(), &mut out);
            check("args", c.args.as_ref(), &mut out);
        }
        check("volumes", spec.volumes.as_ref(), &mut out);
        check("tolerations", spec.tolerations.as_ref(), &mut out);
        let status = pod.status.as_ref().expect("status");
        check("conditions", status.conditions.as_ref(), &mut out);
        check("containerStatuses", status.container_statuses.as_ref(), &mut out);
        out
    }

    #[test]
    fn a_decoded_pod_keeps_no_spare_capacity_in_its_lists_and_is_unchanged() {
        let json = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u"}]},
            "spec": {
                "containers": [
                    {"name": "a", "image": "i", "args": ["x"], "env": [{"name": "E", "value": "1"}],
                     "ports": [{"containerPort": 80}]},
                    {"name": "b", "image": "i"},
                    {"name": "c", "image": "i"}
                ],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "tolerations": [{"key": "k", "operator": "Exists"}]
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0}]
            }
        });
        // From text, as objects arrive (decoding from a `Value` knows the lengths).
        let text = json.to_string();
        let decoded: Pod = serde_json::from_str(&text).expect("a pod");
        assert!(!spare(&decoded).is_empty(), "serde leaves spare capacity to give back");
        let mut compacted: Pod = serde_json::from_str(&text).expect("a pod");
        compact(&mut compacted);
        assert_eq!(spare(&compacted), Vec::<String>::new());
        assert_eq!(compacted, decoded);

        // Other kinds: their metadata lists.
        let mut cm: ConfigMap =
            serde_json::from_str(r#"{"metadata": {"name": "c", "finalizers": ["a/b"]}}"#).expect("a configmap");
        assert_ne!(cm.metadata.finalizers.as_ref().map(Vec::capacity), Some(1));
        compact(&mut cm);
        let finalizers = cm.metadata.finalizers.expect("finalizers");
        assert_eq!(finalizers.capacity(), finalizers.len());
    }
}
