//! `ApiListerWatcher` requests a paged list's next page while the current one is decoded, over
//! envtest: the page is asked for before the reflector's next call, that call uses it (one
//! request per page, as without pipelining), and a call for another token drops it.

mod common;

use std::collections::BTreeMap;

use informer_core::{ApiListerWatcher, ListerWatcher};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, PostParams};

use crate::common::eventually;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

async fn server_with(count: usize) -> (envtest::Server, Api<ConfigMap>) {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for i in 0..count {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("cm-{i:03}"));
        cm.data = Some(BTreeMap::from([("v".to_string(), i.to_string())]));
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    (env, api)
}

/// The list requests envtest saw, as (continue token or "", limit).
fn lists(env: &envtest::Server) -> Vec<(String, String)> {
    env.requests()
        .into_iter()
        .filter(|r| !r.is_watch && r.path == CONFIGMAPS)
        .map(|r| {
            (
                r.param("continue").unwrap_or_default(),
                r.param("limit").unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_next_page_is_requested_before_it_is_asked_for_and_used_when_it_is() {
    let (env, api) = server_with(25).await;
    let lw = ApiListerWatcher::new(api);
    env.faults().clear_requests();

    let first = lw.list(&ListParams::default().limit(10)).await.unwrap();
    assert_eq!(first.items.len(), 10);
    let token = first.continue_token.clone().expect("a second page");
    // Page two is on its way although nobody asked for it yet.
    eventually("page two requested ahead", || lists(&env).len() == 2).await;
    assert_eq!(lists(&env)[1], (token.clone(), "10".to_string()));

    let second = lw
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.items.len(), 10);
    let token = second.continue_token.clone().expect("a third page");
    let third = lw
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(third.items.len(), 5);
    assert_eq!(third.continue_token, None);

    // One request per page, no more: the pages asked for were the ones fetched ahead.
    let seen = lists(&env);
    assert_eq!(seen.len(), 3, "{seen:?}");
    let mut names: Vec<String> = [first, second, third]
        .into_iter()
        .flat_map(|p| p.items)
        .filter_map(|cm| cm.metadata.name)
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 25);
}

#[tokio::test]
async fn a_call_for_another_page_drops_the_one_fetched_ahead_and_asks_the_server() {
    let (env, api) = server_with(25).await;
    let lw = ApiListerWatcher::new(api);
    env.faults().clear_requests();

    let first = lw.list(&ListParams::default().limit(10)).await.unwrap();
    assert!(first.continue_token.is_some());
    eventually("page two requested ahead", || lists(&env).len() == 2).await;

    // The reflector starts over (say, after an error): a fresh first page, from the server.
    let again = lw.list(&ListParams::default().limit(10)).await.unwrap();
    assert_eq!(again.items.len(), 10);
    let seen = lists(&env);
    assert_eq!(seen[2], (String::new(), "10".to_string()), "{seen:?}");

    // A list without a limit is one page: nothing is fetched ahead.
    env.faults().clear_requests();
    let all = lw.list(&ListParams::default()).await.unwrap();
    assert_eq!((all.items.len(), all.continue_token), (25, None));
    tokio::task::yield_now().await;
    assert_eq!(lists(&env).len(), 1);
}
