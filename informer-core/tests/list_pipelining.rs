//! `ApiListerWatcher` requests a paged list's next pages while the current one is decoded, over
//! envtest: up to two pages are asked for before the reflector's calls, those calls use them
//! (one request per page, as without pipelining), a call for another page drops them, and the
//! pages after the first carry only the continue token.

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

/// The list requests envtest saw, with their resourceVersion parameter.
fn list_versions(env: &envtest::Server) -> Vec<(String, Option<String>)> {
    env.requests()
        .into_iter()
        .filter(|r| !r.is_watch && r.path == CONFIGMAPS)
        .map(|r| (r.param("continue").unwrap_or_default(), r.param("resourceVersion")))
        .collect()
}

#[tokio::test]
async fn the_next_two_pages_are_requested_before_they_are_asked_for_and_used_when_they_are() {
    let (env, api) = server_with(45).await;
    let lw = ApiListerWatcher::new(api);
    env.faults().clear_requests();

    let mut params = ListParams::default().limit(10);
    let first = lw.list(&params).await.unwrap();
    assert_eq!(first.items.len(), 10);
    // Pages two and three are on their way although nobody asked for them yet; no more
    // (two pages ahead at most).
    eventually("pages two and three requested ahead", || lists(&env).len() == 3).await;
    let token = first.continue_token.clone().expect("a second page");
    assert_eq!(lists(&env)[1], (token.clone(), "10".to_string()));

    let mut pages = vec![first];
    params = params.continue_token(&token);
    loop {
        let page = lw.list(&params).await.unwrap();
        let next = page.continue_token.clone();
        pages.push(page);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    // One request per page, no more: the pages asked for were the ones fetched ahead.
    let seen = lists(&env);
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert_eq!(pages.len(), 5);
    let mut names: Vec<String> = pages
        .into_iter()
        .flat_map(|p| p.items)
        .filter_map(|cm| cm.metadata.name)
        .collect();
    assert_eq!(names.len(), 45);
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 45);
}

#[tokio::test]
async fn a_call_for_another_page_drops_the_ones_fetched_ahead_and_asks_the_server() {
    let (env, api) = server_with(45).await;
    let lw = ApiListerWatcher::new(api);
    env.faults().clear_requests();

    let first = lw.list(&ListParams::default().limit(10)).await.unwrap();
    assert!(first.continue_token.is_some());
    eventually("pages requested ahead", || lists(&env).len() == 3).await;

    // The reflector starts over (say, after an error): a fresh first page, from the server.
    env.faults().clear_requests();
    let again = lw.list(&ListParams::default().limit(10)).await.unwrap();
    assert_eq!(again.items.len(), 10);
    assert_eq!(lists(&env)[0], (String::new(), "10".to_string()));
    // Its pages ahead are requested while it is decoded: let them reach the server first.
    eventually("pages requested ahead again", || lists(&env).len() == 3).await;

    // A list without a limit is one page: nothing is fetched ahead.
    env.faults().clear_requests();
    let all = lw.list(&ListParams::default()).await.unwrap();
    assert_eq!((all.items.len(), all.continue_token), (45, None));
    tokio::task::yield_now().await;
    assert_eq!(lists(&env).len(), 1);
}

#[tokio::test]
async fn pages_fetched_ahead_of_a_list_at_a_resource_version_send_only_the_token() {
    let (env, api) = server_with(25).await;
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let lw = ApiListerWatcher::new(api);
    env.faults().clear_requests();

    let mut params = ListParams::default().limit(10);
    params.resource_version = Some(rv.clone());
    params.version_match = Some(kube::api::VersionMatch::NotOlderThan);
    let first = lw.list(&params).await.unwrap();
    eventually("pages requested ahead", || lists(&env).len() == 3).await;
    let seen = list_versions(&env);
    assert_eq!(seen[0], (String::new(), Some(rv)));
    // The token carries the list's resourceVersion: the server refuses both together.
    assert!(
        seen[1..].iter().all(|(token, rv)| !token.is_empty() && rv.is_none()),
        "{seen:?}"
    );
    let second = lw
        .list(&informer_core_continuation(&params, first.continue_token.unwrap()))
        .await
        .unwrap();
    assert_eq!(second.items.len(), 10);
    assert_eq!(lists(&env).len(), 3, "the second page came from the one fetched ahead");
}

/// What the reflector asks for after a page (its own rule, `listwatch::continuation`).
fn informer_core_continuation(params: &ListParams, token: String) -> ListParams {
    ListParams {
        continue_token: Some(token),
        resource_version: None,
        version_match: None,
        ..params.clone()
    }
}
