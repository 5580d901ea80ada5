//! A scripted, in-memory API server for one resource (ConfigMaps), implementing
//! `ListerWatcher`. It keeps a resourceVersion counter, an event history (so watches resume
//! from an RV), and lets tests inject what real servers do: in-stream and HTTP 410s, errors,
//! bookmarks, forgotten objects, refusals of streaming lists. Used where tokio's paused time
//! must drive the test (an HTTP server cannot run under paused time); everything else runs
//! over envtest.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::future::BoxFuture;
use informer_core::{ListPage, ListWatchError, ListerWatcher, WatchStream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, WatchEvent, WatchParams};
use kube::core::TypeMeta;
use kube::core::watch::{Bookmark, BookmarkMeta};
use tokio::sync::mpsc;

type Sender = mpsc::UnboundedSender<Result<WatchEvent<ConfigMap>, ListWatchError>>;

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<String, ConfigMap>,
    /// (rv, event) for every change since `oldest_rv`.
    history: Vec<(u64, WatchEvent<ConfigMap>)>,
    /// Watches older than this get a 410.
    oldest_rv: u64,
    watchers: Vec<Sender>,
    /// Errors to answer the next watch requests with (HTTP form).
    fail_watches: VecDeque<ListWatchError>,
    refuse_watch_list: bool,
    /// Continue tokens given out are rejected with 410 (as after a compaction).
    expire_continue_tokens: bool,
    /// Errors to answer the next list requests with.
    fail_lists: VecDeque<ListWatchError>,
    /// Lists also carry an object without a name.
    nameless_in_lists: bool,
    pub list_requests: Vec<ListParams>,
    pub watch_requests: Vec<(WatchParams, String)>,
}

/// The fake server. Clone it to keep a handle after giving one to an informer.
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

pub fn gone() -> ListWatchError {
    ListWatchError::api(410, "Expired", "too old resource version")
}

pub fn server_error() -> ListWatchError {
    ListWatchError::api(500, "InternalError", "boom")
}

pub fn configmap(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("v".to_string(), value.to_string())])),
        ..ConfigMap::default()
    }
}

impl FakeApi {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn record(state: &mut State, event: WatchEvent<ConfigMap>) {
        let rv = state.rv;
        state.watchers.retain(|w| w.send(Ok(event.clone())).is_ok());
        state.history.push((rv, event));
    }

    /// Creates or updates `name` with data `v=value`, as the server would, and notifies watches.
    pub fn apply(&self, name: &str, value: &str) -> String {
        let mut state = self.state();
        state.rv += 1;
        let mut obj = configmap(name, value);
        obj.metadata.resource_version = Some(state.rv.to_string());
        let existed = state.objects.insert(name.to_string(), obj.clone()).is_some();
        let event = if existed {
            WatchEvent::Modified(obj)
        } else {
            WatchEvent::Added(obj)
        };
        Self::record(&mut state, event);
        state.rv.to_string()
    }

    /// Deletes `name` and notifies watches.
    pub fn delete(&self, name: &str) {
        let mut state = self.state();
        state.rv += 1;
        if let Some(mut obj) = state.objects.remove(name) {
            obj.metadata.resource_version = Some(state.rv.to_string());
            Self::record(&mut state, WatchEvent::Deleted(obj));
        }
    }

    /// Deletes `name` without telling any watch (as if the event was lost) and expires the
    /// history, so the only way to learn about it is a relist.
    pub fn forget(&self, name: &str) {
        let mut state = self.state();
        state.rv += 1;
        state.objects.remove(name);
        state.history.clear();
        state.oldest_rv = state.rv;
    }

    /// Sends a BOOKMARK with the current RV to every watch.
    pub fn bookmark(&self) -> String {
        let mut state = self.state();
        let rv = state.rv.to_string();
        let bookmark = bookmark(&rv, false);
        state.watchers.retain(|w| w.send(Ok(bookmark.clone())).is_ok());
        rv
    }

    /// Sends an error into every open watch stream (in-stream ERROR event).
    pub fn break_watches(&self, error: fn() -> ListWatchError) {
        let mut state = self.state();
        for w in state.watchers.drain(..) {
            let _ = w.send(Err(error()));
        }
    }

    /// Sends a malformed-object item into every open watch.
    pub fn send_malformed(&self, key: &str) {
        let state = self.state();
        for w in &state.watchers {
            let _ = w.send(Err(ListWatchError::Malformed(
                informer_core::MalformedObject::new("invalid type: string, expected a map").key(key),
            )));
        }
    }

    /// Answers the next watch request with `error` (the HTTP form).
    pub fn fail_next_watch(&self, error: ListWatchError) {
        self.state().fail_watches.push_back(error);
    }

    pub fn fail_next_list(&self, error: ListWatchError) {
        self.state().fail_lists.push_back(error);
    }

    pub fn add_nameless_to_lists(&self) {
        self.state().nameless_in_lists = true;
    }

    pub fn expire_continue_tokens(&self) {
        self.state().expire_continue_tokens = true;
    }

    pub fn refuse_watch_list(&self) {
        self.state().refuse_watch_list = true;
    }

    pub fn objects(&self) -> BTreeMap<String, String> {
        self.state()
            .objects
            .iter()
            .map(|(k, v)| {
                (
                    format!("default/{k}"),
                    v.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    pub fn list_requests(&self) -> Vec<ListParams> {
        self.state().list_requests.clone()
    }

    pub fn watch_requests(&self) -> Vec<(WatchParams, String)> {
        self.state().watch_requests.clone()
    }

    pub fn open_watches(&self) -> usize {
        let mut state = self.state();
        state.watchers.retain(|w| !w.is_closed());
        state.watchers.len()
    }
}

fn bookmark(rv: &str, initial_events_end: bool) -> WatchEvent<ConfigMap> {
    let mut annotations = BTreeMap::new();
    if initial_events_end {
        annotations.insert("k8s.io/initial-events-end".to_string(), "true".to_string());
    }
    WatchEvent::Bookmark(Bookmark {
        types: TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        },
        metadata: BookmarkMeta {
            resource_version: rv.to_string(),
            annotations,
        },
    })
}

impl ListerWatcher<ConfigMap> for FakeApi {
    fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        let mut state = self.state();
        state.list_requests.push(params.clone());
        if let Some(error) = state.fail_lists.pop_front() {
            return Box::pin(async { Err(error) });
        }
        // Pages of `limit`; the continue token is the index of the next item.
        let start: usize = match &params.continue_token {
            Some(_) if state.expire_continue_tokens => {
                state.expire_continue_tokens = false;
                return Box::pin(async { Err(gone()) });
            }
            Some(token) => token.parse().unwrap_or(0),
            None => 0,
        };
        let limit = params.limit.map_or(usize::MAX, |l| l as usize);
        let mut items: Vec<ConfigMap> = state.objects.values().skip(start).take(limit).cloned().collect();
        if state.nameless_in_lists {
            items.push(ConfigMap::default());
        }
        let next = start + items.len();
        let page = ListPage::new(items, state.rv.to_string())
            .continue_token((next < state.objects.len()).then(|| next.to_string()));
        Box::pin(async move { Ok(page) })
    }

    fn watch(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
        let mut state = self.state();
        state
            .watch_requests
            .push((params.clone(), resource_version.to_string()));
        let result = (|| {
            if let Some(error) = state.fail_watches.pop_front() {
                return Err(error);
            }
            let (tx, rx) = mpsc::unbounded_channel();
            if params.send_initial_events {
                if state.refuse_watch_list {
                    return Err(ListWatchError::api(422, "Invalid", "sendInitialEvents is forbidden"));
                }
                for obj in state.objects.values() {
                    let _ = tx.send(Ok(WatchEvent::Added(obj.clone())));
                }
                let _ = tx.send(Ok(bookmark(&state.rv.to_string(), true)));
            } else {
                let from: u64 = resource_version.parse().unwrap_or(0);
                if from < state.oldest_rv {
                    let _ = tx.send(Err(gone()));
                    return Ok(rx);
                }
                for (rv, event) in &state.history {
                    if *rv > from {
                        let _ = tx.send(Ok(event.clone()));
                    }
                }
            }
            state.watchers.push(tx);
            Ok(rx)
        })();
        Box::pin(async move {
            let rx = result?;
            Ok(tokio_stream_from(rx))
        })
    }
}

fn tokio_stream_from(
    mut rx: mpsc::UnboundedReceiver<Result<WatchEvent<ConfigMap>, ListWatchError>>,
) -> WatchStream<ConfigMap> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

/// Waits, without letting tokio's paused clock auto-advance, until `cond` holds. Yielding
/// keeps the runtime busy, so virtual time stands still while handler threads catch up;
/// a real-time limit turns a missed condition into a failure instead of a hang.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < limit, "timed out waiting for: {what}");
        tokio::task::yield_now().await;
        std::thread::yield_now();
    }
}

/// Under tokio's paused clock, lets virtual time pass in 10 ms steps until `cond` holds
/// (for waits that are themselves timers, such as backoff).
pub async fn after_virtual_time(what: &str, mut cond: impl FnMut() -> bool) {
    let limit = tokio::time::Instant::now() + std::time::Duration::from_secs(600);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < limit,
            "virtual time ran out waiting for: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Under real time (tests over envtest), polls `cond` every 10 ms until it holds; a 20 s
/// deadline turns a missed condition into a failure instead of a hang.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
