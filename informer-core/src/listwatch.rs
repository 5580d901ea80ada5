//! Listing and watching one resource (client-go `listwatch.go`).
//!
//! [`ListerWatcher`] is the only thing the reflector knows about the API server, so tests and
//! other transports can stand in for it. [`ApiListerWatcher`] implements it over a
//! `kube::Api<K>`, typed or `DynamicObject`. It decodes responses itself rather than through
//! `Api::watch`, so that a malformed object on a stream is reported with its key and skipped
//! instead of ending the watch, and so that an HTTP 410 on the watch request is told apart
//! from other failures.

use std::fmt::Debug;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{AsyncBufReadExt, StreamExt};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::core::{ObjectList, Request, Status};
use kube::{Api, Client, Resource};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

/// One page of a list.
#[derive(Debug)]
pub struct ListPage<K> {
    /// The objects that decoded.
    pub items: Vec<K>,
    /// The list's resourceVersion.
    pub resource_version: String,
    /// The token for the next page, if there is one.
    pub continue_token: Option<String>,
    /// Items that did not decode; they are not in `items`.
    pub malformed: Vec<MalformedObject>,
}

/// An object the server sent that does not decode as `K`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedObject {
    /// `namespace/name`, when the metadata could be read.
    pub key: Option<String>,
    /// The decode error.
    pub error: String,
}

/// Errors from listing or watching.
#[derive(Debug, thiserror::Error)]
pub enum ListWatchError {
    /// The server answered with a `Status` error (HTTP error, or an ERROR event in a watch).
    #[error("api error {code} {reason}: {message}")]
    Api {
        /// HTTP status code (410 for an expired resourceVersion).
        code: u16,
        /// Machine-readable reason (`Expired`, `Gone`, `TooManyRequests`, ...).
        reason: String,
        /// Human-readable message.
        message: String,
        /// The server's `retryAfterSeconds`, if any.
        retry_after_seconds: Option<u32>,
    },
    /// The request did not get an answer (connection refused, reset, timeout, ...).
    #[error("transport error: {0}")]
    Transport(#[source] kube::Error),
    /// One object on a watch stream did not decode; the stream goes on.
    #[error("malformed object {key:?}: {error}", key = .0.key, error = .0.error)]
    Malformed(MalformedObject),
    /// The response body was not what a list or watch returns.
    #[error("undecodable response: {0}")]
    Decode(String),
}

impl ListWatchError {
    /// Whether the resourceVersion or continue token we sent is too old: the server forgot it
    /// and a fresh list is needed (HTTP 410, reasons `Expired`/`Gone`).
    pub fn is_gone(&self) -> bool {
        matches!(self, ListWatchError::Api { code: 410, .. })
            || matches!(self, ListWatchError::Api { reason, .. } if reason == "Expired" || reason == "Gone")
    }

    /// Whether the server asked us to slow down (HTTP 429).
    pub fn is_too_many_requests(&self) -> bool {
        matches!(self, ListWatchError::Api { code: 429, .. })
    }

    fn from_status(status: &Status) -> Self {
        ListWatchError::Api {
            code: status.code,
            reason: status.reason.clone(),
            message: status.message.clone(),
            retry_after_seconds: status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0),
        }
    }
}

impl From<kube::Error> for ListWatchError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => ListWatchError::from_status(&status),
            other => ListWatchError::Transport(other),
        }
    }
}

/// A stream of watch events. `Err(Malformed)` items are skippable; other errors end the watch.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, ListWatchError>>;

/// Lists and watches one resource (client-go `ListerWatcher`).
pub trait ListerWatcher<K>: Send + Sync + 'static {
    /// Lists one page.
    fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>>;

    /// Watches for changes after `resource_version`.
    fn watch(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>>;
}

/// A [`ListerWatcher`] over a `kube::Api<K>`; its namespace (or none) is the scope.
pub struct ApiListerWatcher<K> {
    client: Client,
    url_path: String,
    _kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> Clone for ApiListerWatcher<K> {
    fn clone(&self) -> Self {
        ApiListerWatcher {
            client: self.client.clone(),
            url_path: self.url_path.clone(),
            _kind: std::marker::PhantomData,
        }
    }
}

impl<K: Resource> ApiListerWatcher<K> {
    /// Lists and watches what `api` addresses.
    pub fn new(api: Api<K>) -> Self {
        let url_path = api.resource_url().to_string();
        ApiListerWatcher {
            client: api.into_client(),
            url_path,
            _kind: std::marker::PhantomData,
        }
    }

    /// Lists and watches the collection at `url_path` (as made by `K::url_path`), for callers
    /// that work out the scope themselves.
    pub fn from_url_path(client: Client, url_path: impl Into<String>) -> Self {
        ApiListerWatcher {
            client,
            url_path: url_path.into(),
            _kind: std::marker::PhantomData,
        }
    }

    /// The collection URL this lists and watches.
    pub fn url_path(&self) -> &str {
        &self.url_path
    }
}

/// Just enough of an object to name it in a log line.
#[derive(Deserialize)]
struct NamedObject {
    #[serde(default)]
    metadata: NamedMeta,
}

#[derive(Deserialize, Default)]
struct NamedMeta {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(borrow)]
    object: &'a RawValue,
}

fn key_of_raw(raw: &str) -> Option<String> {
    let named: NamedObject = serde_json::from_str(raw).ok()?;
    let name = named.metadata.name?;
    Some(match named.metadata.namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name,
    })
}

/// Decodes one list response. The whole list is decoded in one pass; only when that fails
/// are items decoded one by one, so that one bad item costs only itself.
pub(crate) fn decode_list<K: DeserializeOwned + Clone>(text: &str) -> Result<ListPage<K>, ListWatchError> {
    let page = |list: ObjectList<K>, malformed| ListPage {
        resource_version: list.metadata.resource_version.unwrap_or_default(),
        continue_token: list.metadata.continue_.filter(|c| !c.is_empty()),
        items: list.items,
        malformed,
    };
    match serde_json::from_str::<ObjectList<K>>(text) {
        Ok(list) => Ok(page(list, Vec::new())),
        Err(whole) => {
            let raw: ObjectList<Box<RawValue>> =
                serde_json::from_str(text).map_err(|_| ListWatchError::Decode(whole.to_string()))?;
            let mut items = Vec::with_capacity(raw.items.len());
            let mut malformed = Vec::new();
            for item in &raw.items {
                match serde_json::from_str::<K>(item.get()) {
                    Ok(obj) => items.push(obj),
                    Err(e) => malformed.push(MalformedObject {
                        key: key_of_raw(item.get()),
                        error: e.to_string(),
                    }),
                }
            }
            let list = ObjectList {
                types: raw.types,
                metadata: raw.metadata,
                items,
            };
            Ok(page(list, malformed))
        }
    }
}

/// Decodes one line of a watch stream; `None` for a blank line.
pub(crate) fn decode_watch_line<K: DeserializeOwned + Clone>(
    line: &str,
) -> Option<Result<WatchEvent<K>, ListWatchError>> {
    if line.trim().is_empty() {
        return None;
    }
    match serde_json::from_str::<WatchEvent<K>>(line) {
        Ok(WatchEvent::Error(status)) => Some(Err(ListWatchError::from_status(&status))),
        Ok(event) => Some(Ok(event)),
        Err(e) => {
            if let Ok(status) = serde_json::from_str::<Status>(line)
                && status.code != 0
            {
                return Some(Err(ListWatchError::from_status(&status)));
            }
            let key = serde_json::from_str::<RawEvent>(line)
                .ok()
                .and_then(|ev| key_of_raw(ev.object.get()));
            Some(Err(ListWatchError::Malformed(MalformedObject {
                key,
                error: e.to_string(),
            })))
        }
    }
}

impl<K> ListerWatcher<K> for ApiListerWatcher<K>
where
    K: Resource + DeserializeOwned + Clone + Debug + Send + Sync + 'static,
{
    fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>> {
        let request = Request::new(&self.url_path).list(params);
        Box::pin(async move {
            let request = request.map_err(|e| ListWatchError::Decode(e.to_string()))?;
            let text = self.client.request_text(request).await?;
            decode_list(&text)
        })
    }

    fn watch(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>> {
        let request = Request::new(&self.url_path).watch(params, resource_version);
        Box::pin(async move {
            let mut request = request.map_err(|e| ListWatchError::Decode(e.to_string()))?;
            // One event per line must reach us as it is written: no compression on watches.
            request.headers_mut().insert(
                http::header::ACCEPT_ENCODING,
                http::HeaderValue::from_static("identity"),
            );
            let body = self.client.request_stream(request).await?;
            let events = body.lines().filter_map(|line| async move {
                match line {
                    Ok(line) => decode_watch_line::<K>(&line),
                    // The server (or a proxy) cut the stream mid-chunk, or the client's read timeout
                    // fired on an idle stream: the watch simply ended
                    // and is resumed from the last resourceVersion.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        None
                    }
                    Err(e) => Some(Err(ListWatchError::Transport(kube::Error::ReadEvents(e)))),
                }
            });
            Ok(events.boxed())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn a_list_with_one_bad_item_keeps_the_good_ones_and_names_the_bad_one() {
        let text = r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"42","continue":"tok"},
            "items":[{"metadata":{"name":"good","namespace":"ns"}},
                     {"metadata":{"name":"bad","namespace":"ns"},"data":"not a map"}]}"#;
        let page = decode_list::<ConfigMap>(text).unwrap();
        assert_eq!(page.resource_version, "42");
        assert_eq!(page.continue_token.as_deref(), Some("tok"));
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].metadata.name.as_deref(), Some("good"));
        assert_eq!(page.malformed.len(), 1);
        assert_eq!(page.malformed[0].key.as_deref(), Some("ns/bad"));
    }

    #[test]
    fn a_list_that_is_not_a_list_is_a_decode_error() {
        assert!(matches!(
            decode_list::<ConfigMap>("<html>"),
            Err(ListWatchError::Decode(_))
        ));
        assert!(matches!(
            decode_list::<ConfigMap>(r#"{"items":7}"#),
            Err(ListWatchError::Decode(_))
        ));
    }

    #[test]
    fn watch_lines_decode_to_events_errors_and_named_malformed_objects() {
        let added = r#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"ns","resourceVersion":"5"}}}"#;
        assert!(matches!(
            decode_watch_line::<ConfigMap>(added),
            Some(Ok(WatchEvent::Added(_)))
        ));

        let bookmark =
            r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#;
        assert!(
            matches!(decode_watch_line::<ConfigMap>(bookmark), Some(Ok(WatchEvent::Bookmark(b))) if b.metadata.resource_version == "9")
        );

        let expired = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old","reason":"Expired","code":410}}"#;
        match decode_watch_line::<ConfigMap>(expired) {
            Some(Err(e)) => assert!(e.is_gone(), "{e}"),
            other => panic!("expected a 410, got {other:?}"),
        }

        let malformed = r#"{"type":"MODIFIED","object":{"metadata":{"name":"b","namespace":"ns"},"data":[1,2]}}"#;
        match decode_watch_line::<ConfigMap>(malformed) {
            Some(Err(ListWatchError::Malformed(m))) => assert_eq!(m.key.as_deref(), Some("ns/b")),
            other => panic!("expected a malformed object, got {other:?}"),
        }

        let garbage = "{not json";
        assert!(
            matches!(decode_watch_line::<ConfigMap>(garbage), Some(Err(ListWatchError::Malformed(m))) if m.key.is_none())
        );
        assert!(decode_watch_line::<ConfigMap>("   ").is_none());
    }
}
