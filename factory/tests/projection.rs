//! Projections over envtest: a partial type bound to the `pods` resource by
//! `#[derive(Informer)]`'s `projection` lists and watches Pods, decodes each straight into the
//! projection, and has an informer (and cache) of its own beside the full Pod informer's.

use std::sync::Arc;
use std::time::Duration;

use factory::{InformerResource, SharedInformerFactory};
use informer_derive::Informer;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// What the generated code reaches kinformer through (`::kinformer` outside this workspace).
mod paths {
    pub use factory;
    pub use informer_core as cache;
    pub use k8s_openapi;
    pub use kube;
    pub use serde;
}

/// The fields of a Pod a node-placement controller reads, and nothing else.
#[derive(Deserialize, Clone, Debug, Informer)]
#[informer(
    crate = "crate::paths",
    version = "v1",
    kind = "Pod",
    plural = "pods",
    namespaced,
    projection
)]
struct PodPlacement {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: PlacementSpec,
    #[serde(default)]
    status: PlacementStatus,
}

#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
struct PlacementSpec {
    node_name: Option<String>,
}

#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
struct PlacementStatus {
    phase: Option<String>,
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn pod(name: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("app".to_string(), "web".to_string())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("registry.example.com/web:v1".into()),
                args: Some(vec!["--listen=:8080".into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

#[tokio::test]
async fn a_projection_informer_lists_and_watches_pods_into_its_own_cache() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(env.client(), "default");
    pods.create(&PostParams::default(), &pod("web-1", "node-a"))
        .await
        .unwrap();

    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let placements = PodPlacement::informer(&factory).unwrap();
    let full = factory.informer_for::<Pod>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    // Two informers of one resource, named apart.
    assert_eq!(
        synced.into_iter().collect::<Vec<_>>(),
        [
            ("v1/Pod".to_string(), true),
            ("v1/Pod (projection PodPlacement)".to_string(), true)
        ]
    );
    assert_eq!(PodPlacement::projection(), Some("PodPlacement"));

    // Listed: the projection's cache holds `PodPlacement`s, the full informer's `Pod`s.
    let lister = placements.lister();
    let listed: Arc<PodPlacement> = lister.pods("default").get("web-1").expect("listed into the projection");
    assert_eq!(listed.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!(
        listed
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("web")
    );
    assert_eq!(placements.informer().indexer().len(), 1);
    assert_eq!(full.indexer().len(), 1);

    // Watched: a label change and a status change reach the projection.
    let patch = serde_json::json!({"metadata": {"labels": {"app": "api"}}});
    pods.patch("web-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let status = serde_json::json!({"status": {"phase": "Running"}});
    pods.patch_status("web-1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    eventually("the label and phase change in the projection's cache", || {
        lister.pods("default").get("web-1").is_some_and(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str)
                == Some("api")
                && p.status.phase.as_deref() == Some("Running")
        })
    })
    .await;

    // Added and deleted: the projection follows the resource.
    pods.create(&PostParams::default(), &pod("web-2", "node-b"))
        .await
        .unwrap();
    eventually("web-2 in the projection", || {
        lister.pods("default").get("web-2").is_some()
    })
    .await;
    pods.delete("web-1", &Default::default()).await.unwrap();
    eventually("web-1 gone from the projection", || {
        lister.pods("default").get("web-1").is_none()
    })
    .await;
    let web2 = lister.pods("default").get("web-2").unwrap();
    assert_eq!(
        web2.spec,
        PlacementSpec {
            node_name: Some("node-b".into())
        }
    );

    shutdown.cancel();
    factory.shutdown().await;
}
