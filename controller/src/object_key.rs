//! [`ObjectKey`]: what the work queue carries and a reconcile is asked about
//! (controller-runtime's `reconcile.Request` / `types.NamespacedName`).
//!
//! Handlers turn notifications into keys; workers hand keys to the reconciler, which reads the
//! object itself from a lister. Carrying the key and not the object is what lets the queue merge
//! repeated changes of one object and lets a reconcile see the *latest* state, including "gone".

use std::fmt;

use kube::Resource;

/// Identifies one object of the controller's primary type: namespace (`None` for
/// cluster-scoped objects) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The namespace, `None` for a cluster-scoped object.
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

/// What a reconcile is asked to do: bring the object with this key to its desired state
/// (controller-runtime's `reconcile.Request`).
pub type Request = ObjectKey;

impl ObjectKey {
    /// The key of a namespaced object.
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    /// The key of a cluster-scoped object.
    pub fn cluster_scoped(name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: None,
            name: name.into(),
        }
    }

    /// The key of `obj`, or `None` if it has no name (the informer never delivers such objects).
    pub fn from_object<K: Resource>(obj: &K) -> Option<Self> {
        let meta = obj.meta();
        let name = meta.name.as_deref().filter(|n| !n.is_empty())?;
        Some(ObjectKey {
            namespace: meta.namespace.clone().filter(|ns| !ns.is_empty()),
            name: name.to_owned(),
        })
    }

    /// The informer cache's key for this object (`namespace/name`, or `name`), as
    /// [`meta_namespace_key`](informer_core::meta_namespace_key) makes it.
    pub fn cache_key(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{namespace}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};

    #[test]
    fn keys_render_like_the_informer_cache() {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("web".into());
        cm.metadata.namespace = Some("prod".into());
        let key = ObjectKey::from_object(&cm).unwrap();
        assert_eq!(key, ObjectKey::namespaced("prod", "web"));
        assert_eq!(key.cache_key(), informer_core::meta_namespace_key(&cm).unwrap());

        let mut ns = Namespace::default();
        ns.metadata.name = Some("prod".into());
        assert_eq!(ObjectKey::from_object(&ns).unwrap().to_string(), "prod");
        assert_eq!(ObjectKey::from_object(&Namespace::default()), None);
    }
}
