//! Watch semantics: initial events, resume, bookmarks, timeouts, 410, and kube-runtime's watcher
//! + reflector converging on the server's state.

mod common;

use common::wait_for;
use envtest::{Config, Server};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use std::time::Duration;

fn cm(name: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c
}

const T: Duration = Duration::from_secs(10);

async fn next_event<S>(s: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    tokio::time::timeout(T, s.next())
        .await
        .expect("timed out waiting for a watch event")
        .expect("stream ended")
        .expect("watch error")
}

#[tokio::test]
async fn watch_from_zero_sends_current_state_then_changes() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let mut s = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    match next_event(&mut s).await {
        WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("a")),
        e => panic!("unexpected {e:?}"),
    }
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    api.patch("b", &PatchParams::default(), &Patch::Merge(json!({"data": {"x": "1"}})))
        .await
        .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(match next_event(&mut s).await {
            WatchEvent::Added(c) => format!("ADDED {}", c.metadata.name.unwrap()),
            WatchEvent::Modified(c) => format!("MODIFIED {}", c.metadata.name.unwrap()),
            WatchEvent::Deleted(c) => format!("DELETED {}", c.metadata.name.unwrap()),
            e => panic!("unexpected {e:?}"),
        });
    }
    assert_eq!(got, vec!["ADDED b", "MODIFIED b", "DELETED a"]);
    env.shutdown().await;
}

#[tokio::test]
async fn watch_resumes_after_rv_and_filters_by_label_and_namespace() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let a = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    let other: Api<ConfigMap> = Api::namespaced(env.client(), "kube-system");
    other.create(&PostParams::default(), &cm("x")).await.unwrap();
    let mut s = api.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    match next_event(&mut s).await {
        WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("b")),
        e => panic!("unexpected {e:?}"),
    }
    // Label selector: an object moving into the selection is ADDED, out of it DELETED.
    let mut sel = api
        .watch(
            &WatchParams::default().labels("on=yes"),
            &env.current_resource_version().to_string(),
        )
        .await
        .unwrap()
        .boxed();
    let pp = PatchParams::default();
    api.patch("a", &pp, &Patch::Merge(json!({"metadata": {"labels": {"on": "yes"}}})))
        .await
        .unwrap();
    api.patch("a", &pp, &Patch::Merge(json!({"metadata": {"labels": {"on": "no"}}})))
        .await
        .unwrap();
    assert!(matches!(next_event(&mut sel).await, WatchEvent::Added(_)));
    assert!(matches!(next_event(&mut sel).await, WatchEvent::Deleted(_)));
    env.shutdown().await;
}

#[tokio::test]
async fn bookmarks_and_timeout() {
    let env = Server::start(Config::default().bookmark_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let cur = env.current_resource_version();
    let mut s = api
        .watch(&WatchParams::default().timeout(1), &cur.to_string())
        .await
        .unwrap()
        .boxed();
    match next_event(&mut s).await {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, cur.to_string()),
        e => panic!("unexpected {e:?}"),
    }
    // timeoutSeconds=1 closes the stream.
    let end = tokio::time::timeout(T, async {
        while let Some(ev) = s.next().await {
            ev.unwrap();
        }
    })
    .await;
    assert!(end.is_ok(), "stream did not close at timeoutSeconds");
    env.shutdown().await;
}

#[tokio::test]
async fn send_initial_events_ends_with_annotated_bookmark() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for n in ["a", "b"] {
        api.create(&PostParams::default(), &cm(n)).await.unwrap();
    }
    let mut s = api
        .watch(&WatchParams::default().initial_events(), "")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next_event(&mut s).await, WatchEvent::Added(_)));
    assert!(matches!(next_event(&mut s).await, WatchEvent::Added(_)));
    match next_event(&mut s).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                b.metadata
                    .annotations
                    .get("k8s.io/initial-events-end")
                    .map(String::as_str),
                Some("true")
            );
            assert_eq!(b.metadata.resource_version, env.current_resource_version().to_string());
        }
        e => panic!("unexpected {e:?}"),
    }
    env.shutdown().await;
}

#[tokio::test]
async fn expired_rv_gets_error_event_410_and_current_rv_never_expires() {
    let env = Server::start(Config::default().watch_cache_size(3)).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let first = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    for i in 0..5 {
        api.create(&PostParams::default(), &cm(&format!("n{i}"))).await.unwrap();
    }
    assert_eq!(env.watch_cache_len(), 3);
    let mut s = api
        .watch(
            &WatchParams::default(),
            first.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match next_event(&mut s).await {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        e => panic!("unexpected {e:?}"),
    }
    assert!(tokio::time::timeout(T, s.next()).await.unwrap().is_none());

    env.faults().compact();
    assert_eq!(env.watch_cache_len(), 0);
    let cur = env.current_resource_version().to_string();
    let mut s = api.watch(&WatchParams::default(), &cur).await.unwrap().boxed();
    api.create(&PostParams::default(), &cm("after")).await.unwrap();
    assert!(matches!(next_event(&mut s).await, WatchEvent::Added(_)));
    env.shutdown().await;
}

#[tokio::test]
async fn watch_by_name_path_sees_only_that_object() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let rv = env.current_resource_version();
    let mut w = common::RawWatch::open(
        env.base_url(),
        &format!("/api/v1/namespaces/default/configmaps/b?watch=true&resourceVersion={rv}"),
    )
    .await
    .unwrap();
    assert_eq!(w.status, 200);
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let b = api.create(&PostParams::default(), &cm("b")).await.unwrap();
    let line = tokio::time::timeout(T, w.next_line()).await.unwrap().unwrap();
    let (ty, got_rv, _) = common::event_summary(&line);
    assert_eq!(ty, "ADDED");
    assert_eq!(got_rv.to_string(), b.metadata.resource_version.unwrap());
    env.shutdown().await;
}

#[tokio::test]
async fn watch_on_unknown_resource_is_404() {
    let env = Server::start(Config::default()).await.unwrap();
    let (code, body) = common::raw(
        env.base_url(),
        "GET",
        "/api/v1/nothings?watch=true",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(body["kind"], "Status");
    env.shutdown().await;
}

#[tokio::test]
async fn reflector_store_converges_to_server_state() {
    let env = Server::start(Config::default().bookmark_interval(Duration::from_millis(100)))
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for i in 0..20 {
        api.create(&PostParams::default(), &cm(&format!("pre{i}")))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default())).applied_objects();
    let task = tokio::spawn(async move {
        let _ = stream.try_for_each(|_| async { Ok(()) }).await;
    });
    let pp = PatchParams::default();
    for i in 0..20 {
        api.create(&PostParams::default(), &cm(&format!("live{i}")))
            .await
            .unwrap();
        api.patch(
            &format!("pre{i}"),
            &pp,
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await
        .unwrap();
        if i % 3 == 0 {
            api.delete(&format!("live{i}"), &DeleteParams::default()).await.unwrap();
        }
        if i == 10 {
            // Cut every watch mid-way: the watcher must resume without losing anything.
            env.faults().close_watches();
        }
    }
    let server_state = || {
        let mut v: Vec<(String, String)> = env
            .objects_of("/api/v1/namespaces/default/configmaps")
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_owned(),
                    o["metadata"]["resourceVersion"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let store_state = || {
        let mut v: Vec<(String, String)> = reader
            .state()
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap(),
                    o.metadata.resource_version.clone().unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    wait_for(T, "the reflector store to equal the server", || {
        let same = server_state() == store_state();
        async move { same }
    })
    .await;
    let watches = env.requests().iter().filter(|r| r.is_watch).count();
    assert!(watches >= 2, "expected a re-watch after close_watches, saw {watches}");
    task.abort();
    env.shutdown().await;
}

/// kube-apiserver neither serves a watch nor a list at a resourceVersion it has not reached: it
/// waits a little for it, then answers 504 "Too large resource version" with the
/// `ResourceVersionTooLarge` cause (client-go's reflector then relists from the latest state).
/// envtest used to answer such a watch 200 and then send nothing.
#[tokio::test]
async fn a_watch_or_list_from_the_future_waits_for_it_then_answers_too_large_resource_version() {
    let wait = Duration::from_millis(300);
    let env = Server::start(Config::default().too_large_resource_version_wait(wait))
        .await
        .unwrap();
    // kube's client retries a 504 itself (up to 15 times, backing off): see the answer as is.
    let mut config = env.kube_config();
    config.default_retry = false;
    let api: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let created = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let current: u64 = created.metadata.resource_version.unwrap().parse().unwrap();
    let future = current + 1000;
    let assert_too_large = |err: kube::Error| match err {
        kube::Error::Api(status) => {
            assert_eq!((status.code, status.reason.as_str()), (504, "Timeout"), "{status:?}");
            assert_eq!(
                status.message,
                format!("Timeout: Too large resource version: {future}, current: {current}")
            );
            let details = status.details.as_ref().expect("details");
            assert!(
                details.causes.iter().any(|c| c.reason == "ResourceVersionTooLarge"),
                "{details:?}"
            );
            assert_eq!(details.retry_after_seconds, 1);
        }
        other => panic!("not an API error: {other:?}"),
    };

    let started = tokio::time::Instant::now();
    match api.watch(&WatchParams::default(), &future.to_string()).await {
        Ok(_) => panic!("a watch from the future was served"),
        Err(e) => assert_too_large(e),
    }
    assert!(started.elapsed() >= wait, "answered before waiting for the revision");
    let list = kube::api::ListParams::default()
        .at(&future.to_string())
        .matching(kube::api::VersionMatch::NotOlderThan);
    assert_too_large(api.list(&list).await.unwrap_err());
    // kube's informers list at "0" and resume watches at revisions they were sent: unaffected.
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);
    env.shutdown().await;
}

/// A watch at the next revision, asked for before anything has it, is served once a write
/// reaches it within the wait, from that write on.
#[tokio::test]
async fn a_watch_at_a_revision_reached_within_the_wait_is_served_from_it() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let created = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let current: u64 = created.metadata.resource_version.unwrap().parse().unwrap();
    let asked = (current + 1).to_string();
    let writer = {
        let api = api.clone();
        let faults = env.faults();
        let asked = asked.clone();
        tokio::spawn(async move {
            // Write only once the server holds the watch request, which it cannot serve yet.
            wait_for(T, "the watch request", || {
                let asked = asked.clone();
                let requests = faults.requests();
                async move {
                    requests
                        .iter()
                        .any(|r| r.is_watch && r.param("resourceVersion").as_deref() == Some(asked.as_str()))
                }
            })
            .await;
            api.create(&PostParams::default(), &cm("b")).await.unwrap();
            api.create(&PostParams::default(), &cm("c")).await.unwrap();
        })
    };
    // Asked at current + 1: the watch starts after "b" (revision current + 1) and sends "c".
    let stream = api.watch(&WatchParams::default(), &asked).await.unwrap();
    let mut stream = stream.boxed();
    match next_event(&mut stream).await {
        WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("c")),
        other => panic!("expected c's ADDED, got {other:?}"),
    }
    writer.await.unwrap();
    env.shutdown().await;
}
