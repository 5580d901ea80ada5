//! The API access a controller declares, as RBAC rules: what the controller's ServiceAccount
//! must be granted, derived from the controller rather than written by hand.
//!
//! Where it sits: beside the data path, not in it. The [`Controller`](crate::Controller)
//! builder records a [`Permissions`] as sources are added (`for_resource`, `owns`, `watches`:
//! `get`, `list`, `watch` on each type) and as writes are declared
//! ([`Controller::writes`](crate::Controller::writes),
//! [`writes_status`](crate::Controller::writes_status)); the built controller adds what its
//! [`EventRecorder`](crate::EventRecorder) does ([`Permissions::events`]) and
//! [`BuiltController::permissions`](crate::BuiltController::permissions) returns the lot. The
//! [`manifests`](crate::manifests) module turns it into a ClusterRole, and the Manager's leader
//! election ([`Permissions::leader_election`]) into a Role in the Lease's namespace.
//!
//! Compared with kubebuilder's `+kubebuilder:rbac` markers, which a controller-runtime user writes
//! by hand next to the reconciler and `controller-gen` collects:
//! - a source grants `get;list;watch`, as the markers a kubebuilder scaffold writes for a watched
//!   type (the informers list and watch; `get` is what a reconciler's read-through or a
//!   conflict's re-read needs);
//! - writes are never implied by `owns`: a controller-runtime user writes
//!   `verbs=create;update;patch;delete` on an owned type by habit, which grants deletes a
//!   controller that relies on garbage collection never makes. Here each write verb is declared
//!   where the reconciler's code makes it, so the rules grant what it does and nothing more;
//! - the status subresource is a resource of its own (`foos/status`), as in RBAC;
//! - no rule ever holds `*`, in verbs, groups or resources.
//!
//! Rules come out as `controller-gen` normalizes them: one rule per API group and verb set,
//! with that group's resources of the same verbs together, sorted.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::Resource;
use kube::discovery::ApiResource;

/// An RBAC verb a controller's requests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// `GET` of one object.
    Get,
    /// `GET` of a collection.
    List,
    /// `GET` of a collection with `watch=true`.
    Watch,
    /// `POST`.
    Create,
    /// `PUT`.
    Update,
    /// `PATCH` (merge, strategic, JSON and server-side apply patches alike).
    Patch,
    /// `DELETE` of one object.
    Delete,
    /// `DELETE` of a collection.
    DeleteCollection,
}

impl Verb {
    /// What a source needs: `get`, `list`, `watch`.
    pub const READ: [Verb; 3] = [Verb::Get, Verb::List, Verb::Watch];

    /// The verb as RBAC spells it (`deletecollection`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of grants: for each API group and resource (`deployments`, or `foos/status` for a
/// subresource), the verbs allowed. Built by the controller builder (see the
/// [module docs](self)) or by hand; [`rules`](Self::rules) writes it as RBAC rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    /// (API group, resource[/subresource]) → verbs.
    grants: BTreeMap<(String, String), BTreeSet<Verb>>,
}

impl Permissions {
    /// No grants.
    pub fn new() -> Self {
        Self::default()
    }

    /// Grants `verbs` on `resource` (the plural, or `plural/subresource`) of API `group` (`""`
    /// for the core group).
    pub fn grant(&mut self, group: &str, resource: &str, verbs: &[Verb]) {
        if verbs.is_empty() {
            return;
        }
        self.grants
            .entry((group.to_owned(), resource.to_owned()))
            .or_default()
            .extend(verbs.iter().copied());
    }

    /// Grants `verbs` on `K`'s resource.
    pub fn grant_for<K: Resource<DynamicType = ()>>(&mut self, verbs: &[Verb]) {
        self.grant(&K::group(&()), &K::plural(&()), verbs);
    }

    /// Grants `verbs` on `K`'s subresource `subresource` (`status`, `scale`, ...).
    pub fn grant_subresource_for<K: Resource<DynamicType = ()>>(&mut self, subresource: &str, verbs: &[Verb]) {
        self.grant(&K::group(&()), &format!("{}/{subresource}", K::plural(&())), verbs);
    }

    /// Grants `verbs` on a dynamic resource.
    pub fn grant_dynamic(&mut self, resource: &ApiResource, verbs: &[Verb]) {
        self.grant(&resource.group, &resource.plural, verbs);
    }

    /// Adds every grant of `other`.
    pub fn merge(&mut self, other: &Permissions) {
        for ((group, resource), verbs) in &other.grants {
            self.grants
                .entry((group.clone(), resource.clone()))
                .or_default()
                .extend(verbs.iter().copied());
        }
    }

    /// What an [`EventRecorder`](crate::EventRecorder) writes: `create` and `patch` (a series'
    /// count) on `events` of `events.k8s.io`, and the same on core `events`, which it falls back
    /// to on a server without `events.k8s.io/v1` (controller-runtime's manager role grants the
    /// core ones).
    pub fn events() -> Self {
        let mut permissions = Self::new();
        permissions.grant("events.k8s.io", "events", &[Verb::Create, Verb::Patch]);
        permissions.grant("", "events", &[Verb::Create, Verb::Patch]);
        permissions
    }

    /// What the Manager's leader election does to its Lease (`coordination.k8s.io` `leases`):
    /// `get`, `create` (the first candidate), `update` (renew, take over, release). Granted in
    /// the Lease's namespace only (a Role): the other candidates' Leases are not its business.
    pub fn leader_election() -> Self {
        let mut permissions = Self::new();
        permissions.grant(
            "coordination.k8s.io",
            "leases",
            &[Verb::Get, Verb::Create, Verb::Update],
        );
        permissions
    }

    /// Whether there is no grant.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// Whether `verb` on `resource` (`plural` or `plural/subresource`) of `group` is granted.
    pub fn allows(&self, group: &str, resource: &str, verb: Verb) -> bool {
        self.grants
            .get(&(group.to_owned(), resource.to_owned()))
            .is_some_and(|verbs| verbs.contains(&verb))
    }

    /// Every grant: (API group, resource, verbs), sorted by group and resource.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &BTreeSet<Verb>)> {
        self.grants
            .iter()
            .map(|((group, resource), verbs)| (group.as_str(), resource.as_str(), verbs))
    }

    /// The grants as RBAC rules: one per API group and verb set, with its resources sorted
    /// (`controller-gen`'s normal form); no `*` anywhere.
    pub fn rules(&self) -> Vec<PolicyRule> {
        let mut by_verbs: BTreeMap<(&str, Vec<Verb>), Vec<String>> = BTreeMap::new();
        for ((group, resource), verbs) in &self.grants {
            by_verbs
                .entry((group.as_str(), verbs.iter().copied().collect()))
                .or_default()
                .push(resource.clone());
        }
        by_verbs
            .into_iter()
            .map(|((group, verbs), resources)| PolicyRule {
                api_groups: Some(vec![group.to_owned()]),
                resources: Some(resources),
                verbs: verbs.iter().map(|v| v.as_str().to_owned()).collect(),
                ..PolicyRule::default()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn rules_group_resources_of_one_group_and_verb_set_and_spell_subresources() {
        let mut permissions = Permissions::new();
        permissions.grant_for::<Deployment>(&Verb::READ);
        permissions.grant_for::<Deployment>(&[Verb::Create, Verb::Patch]);
        permissions.grant_for::<ConfigMap>(&[Verb::Patch, Verb::Create]);
        permissions.grant_subresource_for::<Deployment>("status", &[Verb::Patch]);
        permissions.grant("apps", "replicasets", &Verb::READ);
        permissions.merge(&Permissions::events());
        let rules = permissions.rules();
        let shown: Vec<String> = rules
            .iter()
            .map(|r| {
                format!(
                    "{:?} {:?} {:?}",
                    r.api_groups.as_deref().unwrap_or_default(),
                    r.resources.as_deref().unwrap_or_default(),
                    r.verbs
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                r#"[""] ["configmaps", "events"] ["create", "patch"]"#,
                r#"["apps"] ["replicasets"] ["get", "list", "watch"]"#,
                r#"["apps"] ["deployments"] ["get", "list", "watch", "create", "patch"]"#,
                r#"["apps"] ["deployments/status"] ["patch"]"#,
                r#"["events.k8s.io"] ["events"] ["create", "patch"]"#,
            ]
        );
        assert!(permissions.allows("apps", "deployments", Verb::Watch));
        assert!(!permissions.allows("apps", "deployments", Verb::Delete));
        assert!(!permissions.allows("apps", "deployments/scale", Verb::Patch));
        assert!(
            !permissions.allows("", "deployments", Verb::Get),
            "the group is part of the grant"
        );
    }

    #[tokio::test]
    async fn the_builder_grants_reads_per_source_the_declared_writes_and_the_recorders_events() {
        use k8s_openapi::api::core::v1::{Pod, Secret};
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let factory = factory::SharedInformerFactory::new(client, std::time::Duration::ZERO);
        let built = crate::Controller::new("c", &factory)
            .for_resource::<ConfigMap>()
            .owns::<Deployment>()
            .watches::<Secret>(|_| Vec::new())
            .owns_metadata::<Pod>()
            .writes::<Deployment>(&[Verb::Create, Verb::Update])
            .writes_status::<ConfigMap>(&[Verb::Patch])
            .build(crate::reconciler_fn(|_req, _ctx: crate::Context<ConfigMap>| async {
                Ok::<_, std::convert::Infallible>(crate::Action::Done)
            }))
            .unwrap();
        let granted: Vec<String> = built
            .permissions()
            .iter()
            .map(|(group, resource, verbs)| {
                let verbs: Vec<&str> = verbs.iter().map(|v| v.as_str()).collect();
                format!("{group}/{resource}: {}", verbs.join(","))
            })
            .collect();
        assert_eq!(
            granted,
            [
                "/configmaps: get,list,watch",
                "/configmaps/status: patch",
                "/events: create,patch",
                "/pods: get,list,watch",
                "/secrets: get,list,watch",
                "apps/deployments: get,list,watch,create,update",
                "events.k8s.io/events: create,patch",
            ]
        );
    }

    #[test]
    fn no_verbs_grant_nothing() {
        let mut permissions = Permissions::new();
        permissions.grant("", "secrets", &[]);
        assert!(permissions.is_empty());
        assert!(permissions.rules().is_empty());
    }
}
