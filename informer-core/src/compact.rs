//! Giving back the spare capacity decoding leaves in the objects a cache keeps.
//!
//! Where it sits in the data path: right after decoding, inside [`ApiListerWatcher`] (on the
//! list decoder's thread for list pages, on the watch reader for events), before the reflector
//! or any cache sees the object.
//!
//! serde decodes a JSON array into a `Vec` that grows by doubling (from 4 elements, or from 1
//! for elements over 1 KB), so a decoded object holds room for elements it does not have: a
//! Pod's one owner reference sits in room for four, its three volumes in room for four
//! `Volume`s of ~1.7 KB each. The cache keeps every object for its lifetime, so the lists are
//! shrunk to their length once, right after decoding. kube-runtime's store gets the same effect
//! by cloning each object (a clone has no spare capacity), which costs a second allocation of
//! everything and the free of the first.
//!
//! Which lists an object has depends on its type, and this crate is generic over it: the
//! compaction is a plain function pointer on the [`ApiListerWatcher`]
//! ([`ApiListerWatcher::compact`]). This crate's default, [`compact_metadata`], shrinks the
//! lists every object has, those of its `ObjectMeta`. The factory passes each type's own
//! walk instead, which its code generator emits per type (`factory::InformerResource::compact`:
//! every list of every k8s-openapi type, of every type generated from a CRD, of a derived
//! resource's metadata), so no type is singled out here.
//!
//! [`ApiListerWatcher`]: crate::ApiListerWatcher
//! [`ApiListerWatcher::compact`]: crate::ApiListerWatcher::compact

use kube::Resource;

/// Shrinks the lists of an object's metadata to their length (see the module doc): the
/// compaction an [`ApiListerWatcher`](crate::ApiListerWatcher) does unless given the type's own.
pub(crate) fn compact_metadata<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    shrink(&mut meta.owner_references);
    shrink(&mut meta.finalizers);
    shrink(&mut meta.managed_fields);
}

fn shrink<T>(list: &mut Option<Vec<T>>) {
    if let Some(list) = list {
        list.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn metadata_lists_keep_no_spare_capacity_and_the_object_is_unchanged() {
        let text = r#"{"metadata": {"name": "c", "finalizers": ["a/b"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u"}]}}"#;
        let decoded: ConfigMap = serde_json::from_str(text).expect("a configmap");
        assert_ne!(decoded.metadata.finalizers.as_ref().map(Vec::capacity), Some(1));
        let mut cm: ConfigMap = serde_json::from_str(text).expect("a configmap");
        compact_metadata(&mut cm);
        let finalizers = cm.metadata.finalizers.as_ref().expect("finalizers");
        assert_eq!(finalizers.capacity(), finalizers.len());
        let owners = cm.metadata.owner_references.as_ref().expect("owners");
        assert_eq!(owners.capacity(), owners.len());
        assert_eq!(cm, decoded);
    }
}
