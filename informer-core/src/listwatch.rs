//! Listing and watching one resource (client-go `listwatch.go`).
//!
//! [`ListerWatcher`] is the only thing the reflector knows about the API server, so tests and
//! other transports can stand in for it. [`ApiListerWatcher`] implements it over a
//! `kube::Api<K>`, typed or `DynamicObject`. It decodes responses itself rather than through
//! `Api::watch`, so that an object that does not decode is reported
//! ([`MalformedObject`]: its key and resourceVersion when its metadata decodes, and whether a
//! watch DELETED carried it) instead of failing the list or ending the watch, and so that an
//! HTTP 410 on the watch request is told apart from other failures. The reflector keeps a
//! named one known to the cache as undecodable (see [`undecodable`](crate::undecodable)).
//!
//! List requests are built with kube's [`Request::list`], with one correction: kube-core's
//! `ListParams` leaves `resourceVersion` out when it is `"0"` and a `limit` is set, while
//! client-go's reflector sends both on its first list. Both matter: `resourceVersion=0` lets
//! the server's watch cache answer (it then ignores the limit and answers in one page), and
//! the limit pages the list when the watch cache is off and etcd answers. So
//! [`ApiListerWatcher`] puts `resourceVersion=0` back into such a request.
//!
//! **Paged lists are pipelined.** client-go (and kube-runtime) ask for page k+1 only once page
//! k is decoded, so the server, the network and the decoder take turns. [`ApiListerWatcher`]
//! reads page k's `continue` token from the list's `metadata` without decoding the items (it
//! is in front of them in built-in resources' lists, after them in custom resources'), requests
//! page k+1 at once on a task of its own, and decodes page k meanwhile (on the blocking pool
//! when it is large); page k+1's task does the same for page k+2, up to two pages ahead of the
//! reflector, so two cores decode two pages at once. The reflector still asks for pages one by
//! one and sees exactly what it would have seen: a page fetched ahead is used only when the
//! reflector asks for that very token, and a request for any other page (a new list, or a
//! token that the decoded page contradicts) drops them, aborting their requests. A list is
//! still one request per page; `cargo xtask bench` measures the gain (BENCHMARKS.md).
//!
//! **Metadata only.** An `ApiListerWatcher<PartialObjectMeta<K>>` (from an
//! `Api<PartialObjectMeta<K>>`, kube's `Resource::metadata_api()`) asks the server for
//! `PartialObjectMetadataList` pages and `PartialObjectMetadata` watch events, as client-go's
//! metadata informers do: objects arrive and are cached as their `ObjectMeta` alone, a fraction of
//! the bytes and memory of whole objects. The `Accept` header falls back to plain JSON, which
//! decodes into the same type (the rest is ignored), so a server without the conversion still
//! works.
//!
//! ```
//! use informer_core::{ListPage, ListWatchError, MalformedObject};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! // What a hand-written `ListerWatcher` returns: a page, and the errors the reflector understands.
//! let page = ListPage::<ConfigMap>::new(Vec::new(), "42")
//!     .continue_token(Some("next".to_string()))
//!     .malformed(vec![MalformedObject::new("invalid type: string, expected a map").key("ns/bad")]);
//! assert_eq!(page.resource_version, "42");
//! assert!(ListWatchError::api(410, "Expired", "too old resource version").is_gone());
//! ```

use std::collections::HashMap;
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{AsyncBufReadExt, StreamExt};
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::core::{ObjectList, Request, Status};
use kube::{Api, Client, Resource};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio_util::task::AbortOnDropHandle;

/// One page of a list, as a [`ListerWatcher`] returns it.
///
/// Made with [`ListPage::new`] (or `Default`) and the setters, so that fields can be added
/// without breaking implementations of [`ListerWatcher`].
#[derive(Debug)]
#[non_exhaustive]
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

impl<K> Default for ListPage<K> {
    fn default() -> Self {
        ListPage {
            items: Vec::new(),
            resource_version: String::new(),
            continue_token: None,
            malformed: Vec::new(),
        }
    }
}

impl<K> ListPage<K> {
    /// A last (or only) page holding `items`, listed at `resource_version`.
    pub fn new(items: Vec<K>, resource_version: impl Into<String>) -> Self {
        ListPage {
            items,
            resource_version: resource_version.into(),
            ..ListPage::default()
        }
    }

    /// Sets the token for the next page (`None`: this is the last page).
    #[must_use]
    pub fn continue_token(mut self, token: Option<String>) -> Self {
        self.continue_token = token;
        self
    }

    /// Sets the items that did not decode.
    #[must_use]
    pub fn malformed(mut self, malformed: Vec<MalformedObject>) -> Self {
        self.malformed = malformed;
        self
    }
}

/// An object the server sent that does not decode as `K`.
///
/// Made with [`MalformedObject::new`] and [`MalformedObject::key`], so that fields can be added
/// without breaking implementations of [`ListerWatcher`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MalformedObject {
    /// `namespace/name`, when the metadata could be read. With a key, the reflector keeps the
    /// object known to the cache as undecodable (see [`undecodable`](crate::undecodable));
    /// without one it can only log and count it.
    pub key: Option<String>,
    /// The decode error.
    pub error: String,
    /// The object's `metadata.resourceVersion`, when the metadata could be read.
    pub resource_version: Option<String>,
    /// Whether it came in a watch DELETED event: the object is gone.
    pub deleted: bool,
}

impl MalformedObject {
    /// An object that failed to decode with `error`, its key unknown.
    pub fn new(error: impl Into<String>) -> Self {
        MalformedObject {
            key: None,
            error: error.into(),
            resource_version: None,
            deleted: false,
        }
    }

    /// Names the object: `namespace/name`, or `name` if cluster-scoped.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the object's resourceVersion.
    #[must_use]
    pub fn resource_version(mut self, resource_version: impl Into<String>) -> Self {
        self.resource_version = Some(resource_version.into());
        self
    }

    /// Says the object came in a watch DELETED event.
    #[must_use]
    pub fn deleted(mut self, deleted: bool) -> Self {
        self.deleted = deleted;
        self
    }
}

/// Errors from listing or watching.
///
/// Non-exhaustive, and so is its [`Api`](ListWatchError::Api) variant: match with `..` and
/// build an `Api` error with [`ListWatchError::api`] or [`ListWatchError::from_status`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListWatchError {
    /// The server answered with a `Status` error (HTTP error, or an ERROR event in a watch).
    #[error("api error {code} {reason}: {message}")]
    #[non_exhaustive]
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
    /// A list page or a watch event was larger than the configured bound; it was not read
    /// further (see [`ApiListerWatcher::max_page_bytes`] and
    /// [`ApiListerWatcher::max_event_bytes`]).
    #[error("{what} larger than {limit} bytes")]
    TooLarge {
        /// `"list page"` or `"watch event"`.
        what: &'static str,
        /// The bound in bytes.
        limit: usize,
    },
    /// The server's current resourceVersion is behind the one a request asked for: it went
    /// back in time (restarted on an older backup of its store, or a failover to a server
    /// behind). Found by the reflector itself when the request went unanswered, since a client
    /// that retries a `504` on its own (kube's default) hides the server's "too large resource
    /// version" answer, and kube-apiserver answers a watch from a future resourceVersion with
    /// silence rather than an error. Handled as that answer
    /// ([`is_too_large_resource_version`](Self::is_too_large_resource_version)).
    #[error("the server is at resourceVersion {current}, behind the {requested} asked for")]
    ServerBehind {
        /// The resourceVersion the request asked for.
        requested: String,
        /// The server's current resourceVersion.
        current: String,
    },
    /// The request could not be built from the parameters (e.g. a `resourceVersionMatch`
    /// without a `resourceVersion`); it was not sent.
    #[error("invalid request: {0}")]
    Request(String),
}

impl ListWatchError {
    /// An error the server answered with: HTTP `code`, `reason` (`Expired`, `TooManyRequests`,
    /// ...) and `message`.
    pub fn api(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        ListWatchError::Api {
            code,
            reason: reason.into(),
            message: message.into(),
            retry_after_seconds: None,
        }
    }

    /// Adds the server's `retryAfterSeconds` (what a 429 or 503 with `Retry-After` carries) to
    /// an [`Api`](ListWatchError::Api) error; other errors are returned unchanged.
    #[must_use]
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        if let ListWatchError::Api {
            retry_after_seconds, ..
        } = &mut self
        {
            *retry_after_seconds = Some(seconds);
        }
        self
    }

    /// Whether the resourceVersion or continue token we sent is too old: the server forgot it
    /// and a fresh list is needed (HTTP 410, reasons `Expired`/`Gone`; client-go's reflector
    /// `isExpiredError`).
    pub fn is_gone(&self) -> bool {
        matches!(self, ListWatchError::Api { code: 410, .. })
            || matches!(self, ListWatchError::Api { reason, .. } if reason == "Expired" || reason == "Gone")
    }

    /// Whether the reason is `Expired` (client-go `apierrors.IsResourceExpired`): what the
    /// server answers a continue token it no longer holds. Narrower than
    /// [`is_gone`](Self::is_gone), as client-go's pager is.
    pub fn is_resource_expired(&self) -> bool {
        matches!(self, ListWatchError::Api { reason, .. } if reason == "Expired")
    }

    /// Whether the server has not yet seen the resourceVersion we asked for (client-go
    /// `isTooLargeResourceVersionError`): a `504 Timeout` saying "Too large resource version",
    /// as a server answers a list at a resourceVersion from a newer server before an HA failover.
    ///
    /// Recognised by code and message, which every server version sends; client-go also looks
    /// for the `ResourceVersionTooLarge` cause, which the same servers send with that message.
    /// Also true of [`ServerBehind`](ListWatchError::ServerBehind), the same condition found by
    /// asking the server for its resourceVersion.
    pub fn is_too_large_resource_version(&self) -> bool {
        matches!(self, ListWatchError::ServerBehind { .. })
            || matches!(self, ListWatchError::Api { code: 504, message, .. } if message.contains("Too large resource version"))
    }

    /// Whether the server asked us to slow down (HTTP 429).
    pub fn is_too_many_requests(&self) -> bool {
        matches!(self, ListWatchError::Api { code: 429, .. })
    }

    /// The error a `Status` from the server describes.
    pub fn from_status(status: &Status) -> Self {
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
    ///
    /// `params` may carry `resource_version: Some("0")` together with a `limit` (the
    /// reflector's first list, as client-go's): send both. kube's `Request::list` drops the
    /// resourceVersion in that case; [`ApiListerWatcher`] puts it back.
    fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>>;

    /// Watches for changes after `resource_version`.
    fn watch(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>>;

    /// The server's current resourceVersion: the one a consistent read is served at. The
    /// reflector asks for it when a request at a resourceVersion goes unanswered, to tell a
    /// server that went back in time (restarted on an older backup) from a slow one. The
    /// default lists one object as a consistent read, without selectors.
    fn current_resource_version(&self) -> BoxFuture<'_, Result<String, ListWatchError>> {
        Box::pin(async move {
            let page = self.list(&ListParams::default().limit(1)).await?;
            Ok(page.resource_version)
        })
    }
}

/// A [`ListerWatcher`] over a `kube::Api<K>`; its namespace (or none) is the scope.
pub struct ApiListerWatcher<K> {
    fetcher: Arc<PageFetcher>,
    max_event_bytes: usize,
    /// Pages of the list in progress requested before the reflector asked for them, by their
    /// `continue` token.
    ahead: Arc<Mutex<PagesAhead<K>>>,
    /// Gives back the spare capacity of each decoded object (see [`ApiListerWatcher::compact`]).
    compact: fn(&mut K),
}

/// What requesting a list page needs, shared with the tasks that fetch pages ahead.
struct PageFetcher {
    client: Client,
    url_path: String,
    max_page_bytes: usize,
    /// At most this many pages in flight ahead of the reflector (0: none, client-go's way).
    pages_ahead: usize,
    /// Drop `metadata.managedFields` while decoding.
    skip_managed_fields: bool,
    /// Ask for `PartialObjectMetadata` (see the module doc).
    metadata_only: bool,
    /// Page bodies already read and decoded, kept to read the next pages into.
    buffers: PageBuffers,
}

/// The buffers list page bodies are read into, reused from page to page.
///
/// A page body is a large allocation (500 ConfigMaps are ~600 KB) that lives only until the
/// page is decoded. Read into a fresh `Vec` every time, it grew by doubling (each step a copy)
/// and, above the allocator's mmap threshold, came fresh from the kernel, so every byte of
/// every page was a page fault: a quarter of the CPU time of a 100k-object list. Kept here, a
/// list touches about `pages_ahead + 2` buffers' worth of fresh memory, once; the last page
/// of a list releases them all, so a watching informer holds none.
#[derive(Default)]
struct PageBuffers {
    state: Mutex<BuffersState>,
}

#[derive(Default)]
struct BuffersState {
    free: Vec<Vec<u8>>,
    /// A list ended and no page was read since: buffers given back are dropped (a page
    /// decoded in parallel with the last one may finish after it).
    released: bool,
}

impl PageBuffers {
    /// At most this many idle buffers are kept (the pages in flight, plus one).
    const KEEP: usize = DEFAULT_PAGES_AHEAD + 2;
    /// A buffer larger than this is not kept (a page that big is rare, and memory held idle).
    const KEEP_BYTES: usize = 16 << 20;

    fn state(&self) -> MutexGuard<'_, BuffersState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self) -> Vec<u8> {
        let mut state = self.state();
        state.released = false;
        state.free.pop().unwrap_or_default()
    }

    fn release(&self) {
        let mut state = self.state();
        state.released = true;
        state.free = Vec::new();
    }

    fn give_back(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() > Self::KEEP_BYTES {
            return;
        }
        buffer.clear();
        let mut state = self.state();
        if !state.released && state.free.len() < Self::KEEP {
            state.free.push(buffer);
        }
    }
}

/// `Accept` of a metadata-only list: `PartialObjectMetadataList`, else whole objects.
const ACCEPT_METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// `Accept` of a metadata-only watch: `PartialObjectMetadata` events, else whole objects.
const ACCEPT_METADATA: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

/// Pages requested ahead of the reflector (see the module doc), fetched and decoded by their
/// own tasks; dropping one aborts it.
type PagesAhead<K> = HashMap<String, AbortOnDropHandle<Result<ListPage<K>, ListWatchError>>>;

/// How many pages may be in flight ahead of the reflector by default: two keep both cores
/// decoding while the next request is answered, and bound the memory a list holds beyond what
/// it has handed over to two pages.
pub const DEFAULT_PAGES_AHEAD: usize = 2;

/// Pages at least this large are decoded on the blocking pool, so the next page's request and
/// other informers' work go on meanwhile; smaller ones cost less to decode than to hand over.
const DECODE_OFF_TASK_BYTES: usize = 64 << 10;

/// The default bound on one list page's body and on one watch event's line (64 MiB): generous
/// (a page of 500 large objects fits), and what keeps a broken or hostile server from making the
/// client allocate without bound.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 << 20;

impl<K> Clone for ApiListerWatcher<K> {
    fn clone(&self) -> Self {
        ApiListerWatcher {
            fetcher: self.fetcher.clone(),
            max_event_bytes: self.max_event_bytes,
            ahead: Arc::default(),
            compact: self.compact,
        }
    }
}

impl<K: Resource> ApiListerWatcher<K> {
    /// Lists and watches what `api` addresses.
    pub fn new(api: Api<K>) -> Self {
        let url_path = api.resource_url().to_string();
        Self::from_url_path(api.into_client(), url_path)
    }

    /// Lists and watches the collection at `url_path` (as made by `K::url_path`), for callers
    /// that work out the scope themselves.
    pub fn from_url_path(client: Client, url_path: impl Into<String>) -> Self {
        ApiListerWatcher {
            fetcher: Arc::new(PageFetcher {
                client,
                url_path: url_path.into(),
                max_page_bytes: DEFAULT_MAX_RESPONSE_BYTES,
                pages_ahead: DEFAULT_PAGES_AHEAD,
                skip_managed_fields: false,
                metadata_only: K::metadata_api(),
                buffers: PageBuffers::default(),
            }),
            max_event_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            ahead: Arc::default(),
            compact: crate::compact::compact_metadata::<K>,
        }
    }

    /// Bounds one list page's body (default [`DEFAULT_MAX_RESPONSE_BYTES`]); a larger page is
    /// [`ListWatchError::TooLarge`] and is not read further.
    #[must_use]
    pub fn max_page_bytes(mut self, bytes: usize) -> Self {
        self.fetcher = Arc::new(PageFetcher {
            max_page_bytes: bytes,
            ..self.fetcher_fields()
        });
        self
    }

    /// How many pages of a paged list may be requested ahead of the reflector (default
    /// [`DEFAULT_PAGES_AHEAD`]; see the module doc). 0 asks for each page only when the
    /// reflector does, as client-go: the pages are then read in strict sequence, at the cost of
    /// the overlap between fetching and decoding.
    #[must_use]
    pub fn pages_ahead(mut self, pages: usize) -> Self {
        self.fetcher = Arc::new(PageFetcher {
            pages_ahead: pages,
            ..self.fetcher_fields()
        });
        self
    }

    /// Bounds one watch event (one line of the stream; default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`]); a longer one ends the stream with
    /// [`ListWatchError::TooLarge`], so the reflector counts it, logs it and re-watches.
    #[must_use]
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        self.max_event_bytes = bytes;
        self
    }

    /// Drops `metadata.managedFields` from every typed object while decoding it, so it is never
    /// allocated (the factory's `strip_managed_fields` turns this on). Objects whose metadata
    /// is decoded through `#[serde(flatten)]` (`DynamicObject`) keep them here; strip those
    /// with a transform.
    #[must_use]
    pub fn skip_managed_fields(mut self, on: bool) -> Self {
        self.fetcher = Arc::new(PageFetcher {
            skip_managed_fields: on,
            ..self.fetcher_fields()
        });
        self
    }

    /// What is done to every object right after it is decoded, on the decoding thread (a list
    /// page's decoder, the watch stream's reader), before anything else sees it: give back the
    /// spare capacity decoding left in it. The default shrinks the lists of its metadata
    /// ([`compact_metadata`](crate::compact::compact_metadata)); the factory passes the
    /// type's own, which its code generator emits per type (see [`crate::compact`]).
    #[must_use]
    pub fn compact(mut self, compact: fn(&mut K)) -> Self {
        self.compact = compact;
        self
    }

    /// A copy of the page fetcher's settings, to build a changed one from.
    fn fetcher_fields(&self) -> PageFetcher {
        PageFetcher {
            client: self.fetcher.client.clone(),
            url_path: self.fetcher.url_path.clone(),
            max_page_bytes: self.fetcher.max_page_bytes,
            pages_ahead: self.fetcher.pages_ahead,
            skip_managed_fields: self.fetcher.skip_managed_fields,
            metadata_only: self.fetcher.metadata_only,
            buffers: PageBuffers::default(),
        }
    }

    /// The collection URL this lists and watches.
    pub fn url_path(&self) -> &str {
        &self.fetcher.url_path
    }
}

/// An object's metadata alone. It must decode whole for the object to be named: an object
/// whose metadata does not decode is not one the cache could hold under a key.
#[derive(Deserialize)]
struct NamedObject {
    #[serde(default)]
    metadata: kube::api::ObjectMeta,
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type")]
    event_type: Option<String>,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// An object that did not decode as `K`, named by its metadata if that decodes.
fn malformed_raw(raw: &str, error: String) -> MalformedObject {
    let mut malformed = MalformedObject::new(error);
    let Ok(named) = serde_json::from_str::<NamedObject>(raw) else {
        return malformed;
    };
    malformed.resource_version = named.metadata.resource_version;
    if let Some(name) = named.metadata.name.filter(|n| !n.is_empty()) {
        malformed.key = Some(match named.metadata.namespace {
            Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
            _ => name,
        });
    }
    malformed
}

/// The list request for `params`: kube's, with `resourceVersion=0` put back where kube-core
/// drops it (a limit is set and there is no continue token), so the request carries both as
/// client-go's does. If a later kube sends it itself, nothing is added.
pub(crate) fn list_request(url_path: &str, params: &ListParams) -> Result<http::Request<Vec<u8>>, ListWatchError> {
    let mut request = Request::new(url_path)
        .list(params)
        .map_err(|e| ListWatchError::Request(e.to_string()))?;
    let any_version = params.resource_version.as_deref() == Some("0");
    if !any_version || params.limit.is_none() || params.continue_token.is_some() {
        return Ok(request);
    }
    let uri = request.uri().to_string();
    let (path, query) = uri.split_once('?').unwrap_or((uri.as_str(), ""));
    if query.split('&').any(|pair| pair.starts_with("resourceVersion=")) {
        return Ok(request);
    }
    // "0" and the match names need no escaping.
    let mut pairs: Vec<&str> = query.split('&').filter(|pair| !pair.is_empty()).collect();
    pairs.push("resourceVersion=0");
    if params.version_match == Some(VersionMatch::NotOlderThan) {
        pairs.push("resourceVersionMatch=NotOlderThan");
    }
    let uri = format!("{path}?{}", pairs.join("&"));
    *request.uri_mut() = uri
        .parse()
        .map_err(|e: http::uri::InvalidUri| ListWatchError::Request(e.to_string()))?;
    Ok(request)
}

/// Decodes one list response. The whole list is decoded in one pass; only when that fails
/// are items decoded one by one, so that one bad item costs only itself.
pub(crate) fn decode_list<K: Resource + DeserializeOwned + Clone + 'static>(
    text: &str,
    skip_managed_fields: bool,
    compact: fn(&mut K),
) -> Result<ListPage<K>, ListWatchError> {
    let page = |mut list: ObjectList<K>, malformed| {
        list.items.iter_mut().for_each(compact);
        ListPage {
            resource_version: list.metadata.resource_version.unwrap_or_default(),
            continue_token: list.metadata.continue_.filter(|c| !c.is_empty()),
            items: list.items,
            malformed,
        }
    };
    match parse::<ObjectList<K>>(text, skip_managed_fields) {
        Ok(list) => Ok(page(list, Vec::new())),
        Err(whole) => {
            let raw: ObjectList<Box<RawValue>> =
                serde_json::from_str(text).map_err(|_| ListWatchError::Decode(whole.to_string()))?;
            let mut items = Vec::with_capacity(raw.items.len());
            let mut malformed = Vec::new();
            for item in &raw.items {
                match parse::<K>(item.get(), skip_managed_fields) {
                    Ok(obj) => items.push(obj),
                    Err(e) => malformed.push(malformed_raw(item.get(), e.to_string())),
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

/// Why [`line_batches`] ended a stream early.
enum LinesEnd {
    /// A line passed the bound; its bytes were read past, never buffered.
    TooLong,
    /// Reading failed.
    Failed(std::io::Error),
}

/// The most lines [`line_batches`] decodes in one batch, so one poll of the stream stays short.
const LINES_PER_BATCH: usize = 256;

/// Above this, the buffer that held a line split across reads is given back once it is used.
const PARTIAL_KEEP_BYTES: usize = 1 << 20;

/// The lines of `reader`, each at most `max` bytes, decoded a read at a time: every complete
/// line in the reader's buffer is handed to `decode` straight from that buffer (found with
/// `memchr`, never copied), and the results of one read (at most [`LINES_PER_BATCH`]) are
/// yielded as one batch. Only a line split across reads is copied, into a buffer of its own.
/// A line longer than `max` bytes, or a read error, is passed to `end` and ends the stream;
/// the end of the stream ends it too (a last line without a newline still counts).
fn line_batches<R, T, D, E>(reader: R, max: usize, decode: D, end: E) -> impl futures::Stream<Item = Vec<T>>
where
    R: futures::AsyncBufRead + Send + 'static,
    D: FnMut(&[u8]) -> Option<T> + Send + 'static,
    E: Fn(LinesEnd) -> Option<T> + Send + 'static,
{
    struct Lines<R, D, E> {
        reader: Pin<Box<R>>,
        partial: Vec<u8>,
        decode: D,
        end: E,
    }
    let lines = Lines {
        reader: Box::pin(reader),
        partial: Vec::new(),
        decode,
        end,
    };
    futures::stream::unfold(Some(lines), move |state| async move {
        let mut lines = state?;
        loop {
            let Lines {
                reader,
                partial,
                decode,
                end,
            } = &mut lines;
            let available = match reader.fill_buf().await {
                Ok(available) => available,
                Err(e) => return Some((end(LinesEnd::Failed(e)).into_iter().collect(), None)),
            };
            if available.is_empty() {
                if partial.is_empty() {
                    return None;
                }
                return Some((decode(partial).into_iter().collect(), None));
            }
            let mut out = Vec::new();
            let mut consumed = 0;
            let mut lines_seen = 0;
            for newline in memchr::memchr_iter(b'\n', available) {
                let piece = &available[consumed..newline];
                if partial.len().saturating_add(piece.len()) > max {
                    out.extend(end(LinesEnd::TooLong));
                    return Some((out, None));
                }
                if partial.is_empty() {
                    out.extend(decode(piece));
                } else {
                    partial.extend_from_slice(piece);
                    out.extend(decode(partial));
                    partial.clear();
                    if partial.capacity() > PARTIAL_KEEP_BYTES {
                        *partial = Vec::new();
                    }
                }
                consumed = newline + 1;
                lines_seen += 1;
                if lines_seen == LINES_PER_BATCH {
                    break;
                }
            }
            if lines_seen < LINES_PER_BATCH {
                // The rest of the buffer is the start of a line the next read finishes.
                let tail = &available[consumed..];
                if partial.len().saturating_add(tail.len()) > max {
                    out.extend(end(LinesEnd::TooLong));
                    return Some((out, None));
                }
                partial.extend_from_slice(tail);
                consumed = available.len();
            }
            reader.as_mut().consume(consumed);
            if !out.is_empty() {
                return Some((out, Some(lines)));
            }
        }
    })
}

/// Decodes one line of a watch stream; `None` for a blank line.
pub(crate) fn decode_watch_line<K: Resource + DeserializeOwned + Clone + 'static>(
    line: &str,
    skip_managed_fields: bool,
    compact: fn(&mut K),
) -> Option<Result<WatchEvent<K>, ListWatchError>> {
    if line.trim().is_empty() {
        return None;
    }
    match parse::<WatchEvent<K>>(line, skip_managed_fields) {
        Ok(WatchEvent::Error(status)) => Some(Err(ListWatchError::from_status(&status))),
        Ok(mut event) => {
            if let WatchEvent::Added(obj) | WatchEvent::Modified(obj) | WatchEvent::Deleted(obj) = &mut event {
                compact(obj);
            }
            Some(Ok(event))
        }
        Err(e) => {
            if let Ok(status) = serde_json::from_str::<Status>(line)
                && status.code != 0
            {
                return Some(Err(ListWatchError::from_status(&status)));
            }
            let malformed = match serde_json::from_str::<RawEvent>(line) {
                Ok(event) => malformed_raw(event.object.get(), e.to_string())
                    .deleted(event.event_type.as_deref() == Some("DELETED")),
                Err(_) => MalformedObject::new(e.to_string()),
            };
            Some(Err(ListWatchError::Malformed(malformed)))
        }
    }
}

/// Decodes `text`, dropping `metadata.managedFields` on the way when asked (see
/// [`ApiListerWatcher::skip_managed_fields`]).
fn parse<T: DeserializeOwned>(text: &str, skip_managed_fields: bool) -> serde_json::Result<T> {
    if skip_managed_fields {
        crate::skip_managed_fields::from_str(text)
    } else {
        serde_json::from_str(text)
    }
}

/// The slot map of pages ahead, whatever a panicking holder left: it holds no invariant.
fn lock_ahead<K>(ahead: &Mutex<PagesAhead<K>>) -> MutexGuard<'_, PagesAhead<K>> {
    ahead.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The parameters of the page after `params`' page: the token carries the list's
/// resourceVersion, so none may be sent with it (the reflector pages the same way).
pub(crate) fn continuation(params: &ListParams, token: String) -> ListParams {
    ListParams {
        continue_token: Some(token),
        resource_version: None,
        version_match: None,
        ..params.clone()
    }
}

/// Fetches and decodes the page `params` asks for. As soon as its bytes are in, the page after
/// it is requested (see [`fetch_ahead`]) and this one is decoded meanwhile. A plain function
/// returning a boxed future, not an `async fn`: its tasks spawn more of it.
fn fetch_page<K>(
    fetcher: Arc<PageFetcher>,
    params: ListParams,
    ahead: Weak<Mutex<PagesAhead<K>>>,
    compact: fn(&mut K),
) -> BoxFuture<'static, Result<ListPage<K>, ListWatchError>>
where
    K: Resource + DeserializeOwned + Clone + Send + 'static,
{
    Box::pin(async move {
        let mut request = list_request(&fetcher.url_path, &params)?;
        if fetcher.metadata_only {
            request.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(ACCEPT_METADATA_LIST),
            );
        }
        let bytes = read_page(&fetcher.client, request, fetcher.max_page_bytes, fetcher.buffers.take()).await?;
        if params.limit.is_some()
            && let (Some(token), Some(ahead)) = (peek_continue(&bytes), ahead.upgrade())
        {
            fetch_ahead(&fetcher, &params, token, &ahead, compact);
        }
        let text = String::from_utf8(bytes).map_err(|e| ListWatchError::Decode(e.to_string()))?;
        let skip = fetcher.skip_managed_fields;
        let (page, text) = if text.len() >= DECODE_OFF_TASK_BYTES {
            tokio::task::spawn_blocking(move || (decode_list::<K>(&text, skip, compact), text))
                .await
                .map_err(|e| ListWatchError::Decode(format!("list page decoder: {e}")))?
        } else {
            (decode_list::<K>(&text, skip, compact), text)
        };
        if matches!(&page, Ok(p) if p.continue_token.is_some()) {
            fetcher.buffers.give_back(text.into_bytes());
        } else {
            // The list is over (or failed): hold no idle buffers while watching.
            fetcher.buffers.release();
        }
        page
    })
}

/// Requests the page after `params`' page (the one `token` names) on a task of its own, unless
/// it is already on its way or as many pages as allowed are.
fn fetch_ahead<K>(
    fetcher: &Arc<PageFetcher>,
    params: &ListParams,
    token: String,
    ahead: &Arc<Mutex<PagesAhead<K>>>,
    compact: fn(&mut K),
) where
    K: Resource + DeserializeOwned + Clone + Send + 'static,
{
    let mut pages = lock_ahead(ahead);
    if pages.len() >= fetcher.pages_ahead || pages.contains_key(&token) {
        return;
    }
    let next = continuation(params, token.clone());
    let task = tokio::spawn(fetch_page(fetcher.clone(), next, Arc::downgrade(ahead), compact));
    pages.insert(token, AbortOnDropHandle::new(task));
}

/// Reads one list response's body, at most `limit` bytes of it.
/// Reads a page body into `bytes` (a reused buffer, see [`PageBuffers`]).
async fn read_page(
    client: &Client,
    request: http::Request<Vec<u8>>,
    limit: usize,
    mut bytes: Vec<u8>,
) -> Result<Vec<u8>, ListWatchError> {
    use futures::AsyncReadExt;
    let body = client.request_stream(request).await?;
    bytes.clear();
    // Read at most one byte past the bound: enough to tell, never more.
    body.take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| ListWatchError::Transport(kube::Error::ReadEvents(e)))?;
    if bytes.len() > limit {
        return Err(ListWatchError::TooLarge {
            what: "list page",
            limit,
        });
    }
    Ok(bytes)
}

/// How far into a list body [`peek_continue`] looks for `metadata`: a list's `kind` and
/// `apiVersion` come first, both short.
const PEEK_BYTES: usize = 4096;

/// The `continue` token of a list body, read from its top-level `metadata` without decoding
/// the items: built-in resources' lists are written in Go struct order (`kind`, `apiVersion`,
/// `metadata`, `items`), so it is near the start; custom resources' lists are written from a
/// map with sorted keys (`apiVersion`, `items`, `kind`, `metadata`), so it is at the end. `None`
/// when there is none or the body is laid out otherwise. A hint only: the caller checks it
/// against the decoded list.
pub(crate) fn peek_continue(body: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"\"metadata\"";
    let head = &body[..body.len().min(PEEK_BYTES)];
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    if let Some(meta) = find(head, KEY)
        && find(head, b"\"items\"").is_none_or(|items| meta < items)
    {
        return metadata_continue(&body[meta + KEY.len()..]).map(|(token, _)| token)?;
    }
    // Items first: the list's own metadata is the last `"metadata"` key, and nothing but the
    // closing brace may follow its value.
    let tail_start = body.len().saturating_sub(PEEK_BYTES);
    let tail = &body[tail_start..];
    let meta = tail.windows(KEY.len()).rposition(|w| w == KEY)?;
    let (token, rest) = metadata_continue(&tail[meta + KEY.len()..])?;
    let rest: Vec<u8> = rest.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    if rest == b"}" { token } else { None }
}

/// Parses `: {...}` (a list's metadata after its key) and returns its `continue` token and the
/// bytes after the value; `None` if it is not that.
fn metadata_continue(after_key: &[u8]) -> Option<(Option<String>, &[u8])> {
    #[derive(Deserialize)]
    struct ListMetaContinue {
        #[serde(rename = "continue")]
        continue_: Option<String>,
    }
    let colon = after_key.iter().position(|b| !b.is_ascii_whitespace())?;
    if after_key[colon] != b':' {
        return None;
    }
    let value = &after_key[colon + 1..];
    let mut values = serde_json::Deserializer::from_slice(value).into_iter::<ListMetaContinue>();
    let meta = values.next()?.ok()?;
    let rest = &value[values.byte_offset()..];
    Some((meta.continue_.filter(|c| !c.is_empty()), rest))
}

impl<K> ListerWatcher<K> for ApiListerWatcher<K>
where
    K: Resource + DeserializeOwned + Clone + Debug + Send + Sync + 'static,
{
    fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>> {
        let params = params.clone();
        Box::pin(async move {
            // A page fetched ahead serves only the request it was made for. A request for any
            // other page (a new list, a token the decoded page disagreed on) drops them all.
            let fetched_ahead = {
                let mut pages = lock_ahead(&self.ahead);
                let page = params.continue_token.as_ref().and_then(|token| pages.remove(token));
                if page.is_none() {
                    pages.clear();
                }
                page
            };
            let page = match fetched_ahead {
                Some(task) => task
                    .await
                    .map_err(|e| ListWatchError::Request(format!("list page fetched ahead: {e}")))??,
                None => {
                    fetch_page(
                        self.fetcher.clone(),
                        params.clone(),
                        Arc::downgrade(&self.ahead),
                        self.compact,
                    )
                    .await?
                }
            };
            // Keep the pipeline full: the page after this one may not be on its way yet (the
            // bound stopped it, or its token could not be read ahead).
            if params.limit.is_some()
                && let Some(token) = &page.continue_token
            {
                fetch_ahead(&self.fetcher, &params, token.clone(), &self.ahead, self.compact);
            }
            Ok(page)
        })
    }

    fn current_resource_version(&self) -> BoxFuture<'_, Result<String, ListWatchError>> {
        // Not through `list`: this one-object page must neither fetch the next page ahead nor
        // drop the pages a list in progress fetched ahead.
        let page = fetch_page::<K>(
            self.fetcher.clone(),
            ListParams::default().limit(1),
            Weak::new(),
            self.compact,
        );
        Box::pin(async move { Ok(page.await?.resource_version) })
    }

    fn watch(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>> {
        let request = Request::new(&self.fetcher.url_path).watch(params, resource_version);
        let max_event_bytes = self.max_event_bytes;
        let skip_managed_fields = self.fetcher.skip_managed_fields;
        let compact = self.compact;
        Box::pin(async move {
            let mut request = request.map_err(|e| ListWatchError::Request(e.to_string()))?;
            // One event per line must reach us as it is written: no compression on watches.
            request.headers_mut().insert(
                http::header::ACCEPT_ENCODING,
                http::HeaderValue::from_static("identity"),
            );
            if self.fetcher.metadata_only {
                request
                    .headers_mut()
                    .insert(http::header::ACCEPT, http::HeaderValue::from_static(ACCEPT_METADATA));
            }
            let body = self.fetcher.client.request_stream(request).await?;
            let decode = move |line: &[u8]| match std::str::from_utf8(line) {
                Ok(text) => decode_watch_line::<K>(text, skip_managed_fields, compact),
                Err(_) => decode_watch_line::<K>(&String::from_utf8_lossy(line), skip_managed_fields, compact),
            };
            let end = move |end: LinesEnd| match end {
                LinesEnd::TooLong => Some(Err(ListWatchError::TooLarge {
                    what: "watch event",
                    limit: max_event_bytes,
                })),
                // The server (or a proxy) cut the stream mid-chunk, or the client's read timeout
                // fired on an idle stream: the watch simply ended
                // and is resumed from the last resourceVersion.
                LinesEnd::Failed(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    None
                }
                LinesEnd::Failed(e) => Some(Err(ListWatchError::Transport(kube::Error::ReadEvents(e)))),
            };
            // One batch per read of the connection; the reflector takes every event that is
            // ready as one batch for its store.
            let events = line_batches(body, max_event_bytes, decode, end).flat_map(futures::stream::iter);
            Ok(events.boxed())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::compact_metadata;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn page_buffers_are_reused_during_a_list_and_none_is_held_after_it() {
        let buffers = PageBuffers::default();
        let mut first = buffers.take();
        first.extend_from_slice(&[1; 1000]);
        let capacity = first.capacity();
        buffers.give_back(first);
        let again = buffers.take();
        assert!(
            again.is_empty() && again.capacity() == capacity,
            "the same allocation, emptied"
        );
        // Two pages in flight; the last one ends the list before the other is given back.
        let other = buffers.take();
        buffers.release();
        buffers.give_back(again);
        buffers.give_back(other);
        assert_eq!(buffers.state().free.len(), 0);
        // The next list reuses buffers again; one too large to hold idle is dropped.
        let next = buffers.take();
        buffers.give_back(next);
        buffers.give_back(Vec::with_capacity(PageBuffers::KEEP_BYTES + 1));
        assert_eq!(buffers.state().free.len(), 1);
    }

    /// The batches `line_batches` makes of `chunks` (one read each), lines as text, `END` for
    /// an early end.
    async fn batches_of(chunks: Vec<Result<&'static [u8], std::io::Error>>, max: usize) -> Vec<Vec<String>> {
        use futures::TryStreamExt;
        let reader = futures::stream::iter(chunks).into_async_read();
        let decode = |line: &[u8]| (!line.is_empty()).then(|| String::from_utf8_lossy(line).into_owned());
        let end = |end: LinesEnd| {
            Some(match end {
                LinesEnd::TooLong => "END too long".to_string(),
                LinesEnd::Failed(e) => format!("END {e}"),
            })
        };
        line_batches(reader, max, decode, end).collect().await
    }

    #[tokio::test]
    async fn watch_lines_are_decoded_a_read_at_a_time_and_a_line_split_across_reads_is_joined() {
        let batches = batches_of(vec![Ok(b"a\nbb\n\nc"), Ok(b"cc"), Ok(b"c\nd\n"), Ok(b"e")], 100).await;
        assert_eq!(batches, [vec!["a", "bb"], vec!["cccc", "d"], vec!["e"]]);

        // A long read is cut into batches of at most LINES_PER_BATCH lines.
        let many: &'static [u8] = "x\n".repeat(600).leak().as_bytes();
        let sizes: Vec<usize> = batches_of(vec![Ok(many)], 100).await.iter().map(Vec::len).collect();
        assert_eq!(sizes, [LINES_PER_BATCH, LINES_PER_BATCH, 600 - 2 * LINES_PER_BATCH]);
    }

    #[tokio::test]
    async fn a_watch_line_over_the_bound_or_a_failed_read_ends_the_stream() {
        // Over the bound in one read, across reads, and as an unfinished tail.
        assert_eq!(
            batches_of(vec![Ok(b"ok\nabcdef\nnever\n")], 3).await,
            [vec!["ok", "END too long"]]
        );
        assert_eq!(
            batches_of(vec![Ok(b"ab"), Ok(b"cd\nx\n")], 3).await,
            [vec!["END too long"]]
        );
        assert_eq!(batches_of(vec![Ok(b"a\nabcdef")], 3).await, [vec!["a", "END too long"]]);
        let failed = std::io::Error::other("reset");
        assert_eq!(
            batches_of(vec![Ok(b"a\n"), Err(failed)], 3).await,
            [vec!["a"], vec!["END reset"]]
        );
    }

    #[test]
    fn the_continue_token_is_read_from_the_metadata_in_front_of_the_items() {
        let page = br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"abc=="},"items":[{"metadata":{"continue":"no"}}]}"#;
        assert_eq!(peek_continue(page).as_deref(), Some("abc=="));
        let spaced = br#"{ "kind" : "List", "metadata" :
            { "continue" : "x\"y" }, "items" : [] }"#;
        assert_eq!(peek_continue(spaced).as_deref(), Some("x\"y"));
        // The last page, an empty token, and no metadata at all: nothing to fetch ahead.
        assert_eq!(
            peek_continue(br#"{"metadata":{"resourceVersion":"7"},"items":[]}"#),
            None
        );
        assert_eq!(peek_continue(br#"{"metadata":{"continue":""},"items":[]}"#), None);
        assert_eq!(peek_continue(br#"{"items":[]}"#), None);
        // Items first (custom resources' lists, sorted keys): the list's metadata at the end,
        // never an item's.
        let sorted = br#"{"apiVersion":"example.com/v1","items":[{"metadata":{"continue":"no"}}],"kind":"FooList","metadata":{"continue":"c"}}"#;
        assert_eq!(peek_continue(sorted).as_deref(), Some("c"));
        let last = br#"{"apiVersion":"v1","items":[{"metadata":{"continue":"no"}}],"kind":"FooList"}"#;
        assert_eq!(peek_continue(last), None);
        let item_last = br#"{"apiVersion":"v1","kind":"FooList","items":[{"x":1,"metadata":{"continue":"no"}}]}"#;
        assert_eq!(peek_continue(item_last), None);
        // Cut off or not JSON: no hint, no panic.
        assert_eq!(peek_continue(br#"{"metadata":{"continue":"ab"#), None);
        assert_eq!(peek_continue(b"\"metadata\""), None);
        assert_eq!(peek_continue(b""), None);
    }

    fn query_of(params: &ListParams) -> Vec<String> {
        let request = list_request("/api/v1/configmaps", params).unwrap();
        let query = request.uri().query().unwrap_or_default().to_string();
        let mut pairs: Vec<String> = query.split('&').filter(|p| !p.is_empty()).map(String::from).collect();
        pairs.sort();
        pairs
    }

    #[test]
    fn a_list_at_resource_version_0_with_a_limit_sends_both() {
        let first = ListParams {
            limit: Some(500),
            resource_version: Some("0".into()),
            label_selector: Some("app=x".into()),
            ..ListParams::default()
        };
        assert_eq!(
            query_of(&first),
            ["labelSelector=app%3Dx", "limit=500", "resourceVersion=0"]
        );
        let not_older = ListParams {
            version_match: Some(VersionMatch::NotOlderThan),
            ..first.clone()
        };
        assert_eq!(
            query_of(&not_older),
            [
                "labelSelector=app%3Dx",
                "limit=500",
                "resourceVersion=0",
                "resourceVersionMatch=NotOlderThan"
            ]
        );
    }

    #[test]
    fn other_lists_are_sent_as_kube_builds_them() {
        // Without a limit kube sends resourceVersion=0 itself (once).
        let unpaged = ListParams {
            resource_version: Some("0".into()),
            ..ListParams::default()
        };
        assert_eq!(query_of(&unpaged), ["resourceVersion=0"]);
        // A continue token carries the version; none may be sent beside it.
        let next_page = ListParams {
            limit: Some(500),
            continue_token: Some("tok".into()),
            resource_version: Some("0".into()),
            ..ListParams::default()
        };
        assert_eq!(query_of(&next_page), ["continue=tok", "limit=500"]);
        let at_version = ListParams {
            limit: Some(2),
            resource_version: Some("42".into()),
            ..ListParams::default()
        };
        assert_eq!(query_of(&at_version), ["limit=2", "resourceVersion=42"]);
        assert_eq!(query_of(&ListParams::default()), Vec::<String>::new());
    }

    #[test]
    fn too_large_resource_version_and_expired_are_told_apart() {
        let too_large = ListWatchError::api(504, "Timeout", "Too large resource version: 9, current: 3");
        assert!(too_large.is_too_large_resource_version());
        assert!(!too_large.is_gone());
        assert!(!ListWatchError::api(504, "Timeout", "slow").is_too_large_resource_version());
        let gone = ListWatchError::api(410, "Gone", "gone");
        assert!(gone.is_gone() && !gone.is_resource_expired());
        assert!(ListWatchError::api(410, "Expired", "too old").is_resource_expired());
    }

    #[test]
    fn decoded_metadata_lists_hold_no_spare_capacity_in_lists_and_watch_events() {
        let meta = r#"{"name":"a","namespace":"ns","finalizers":["f"],
            "ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"rs","uid":"u"}],
            "managedFields":[{"manager":"m","operation":"Update"}]}"#;
        let assert_compact = |cm: &ConfigMap| {
            let m = &cm.metadata;
            for (len, capacity) in [
                m.owner_references.as_ref().map(|v| (v.len(), v.capacity())),
                m.finalizers.as_ref().map(|v| (v.len(), v.capacity())),
                m.managed_fields.as_ref().map(|v| (v.len(), v.capacity())),
            ]
            .into_iter()
            .flatten()
            {
                assert_eq!((len, capacity), (1, 1));
            }
        };
        // serde's own decode leaves room for four.
        let plain: ConfigMap = serde_json::from_str(&format!(r#"{{"metadata":{meta}}}"#)).unwrap();
        assert!(
            plain
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|v| v.capacity() > 1)
        );
        for skip in [false, true] {
            let list = format!(r#"{{"metadata":{{"resourceVersion":"1"}},"items":[{{"metadata":{meta}}}]}}"#);
            let page = decode_list::<ConfigMap>(&list, skip, compact_metadata).unwrap();
            assert_eq!(page.items.len(), 1);
            assert_compact(&page.items[0]);
            let line = format!(r#"{{"type":"MODIFIED","object":{{"metadata":{meta}}}}}"#);
            match decode_watch_line::<ConfigMap>(&line, skip, compact_metadata) {
                Some(Ok(WatchEvent::Modified(cm))) => assert_compact(&cm),
                other => panic!("not a MODIFIED event: {other:?}"),
            }
        }
    }

    #[test]
    fn a_list_with_one_bad_item_keeps_the_good_ones_and_names_the_bad_one() {
        let text = r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"42","continue":"tok"},
            "items":[{"metadata":{"name":"good","namespace":"ns"}},
                     {"metadata":{"name":"bad","namespace":"ns"},"data":"not a map"}]}"#;
        let page = decode_list::<ConfigMap>(text, false, compact_metadata).unwrap();
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
            decode_list::<ConfigMap>("<html>", false, compact_metadata),
            Err(ListWatchError::Decode(_))
        ));
        assert!(matches!(
            decode_list::<ConfigMap>(r#"{"items":7}"#, false, compact_metadata),
            Err(ListWatchError::Decode(_))
        ));
    }

    #[test]
    fn watch_lines_decode_to_events_errors_and_named_malformed_objects() {
        let added = r#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"ns","resourceVersion":"5"}}}"#;
        assert!(matches!(
            decode_watch_line::<ConfigMap>(added, false, compact_metadata),
            Some(Ok(WatchEvent::Added(_)))
        ));

        let bookmark =
            r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#;
        assert!(
            matches!(decode_watch_line::<ConfigMap>(bookmark, false, compact_metadata), Some(Ok(WatchEvent::Bookmark(b))) if b.metadata.resource_version == "9")
        );

        let expired = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old","reason":"Expired","code":410}}"#;
        match decode_watch_line::<ConfigMap>(expired, false, compact_metadata) {
            Some(Err(e)) => assert!(e.is_gone(), "{e}"),
            other => panic!("expected a 410, got {other:?}"),
        }

        let malformed = r#"{"type":"MODIFIED","object":{"metadata":{"name":"b","namespace":"ns"},"data":[1,2]}}"#;
        match decode_watch_line::<ConfigMap>(malformed, false, compact_metadata) {
            Some(Err(ListWatchError::Malformed(m))) => assert_eq!(m.key.as_deref(), Some("ns/b")),
            other => panic!("expected a malformed object, got {other:?}"),
        }

        let garbage = "{not json";
        assert!(
            matches!(decode_watch_line::<ConfigMap>(garbage, false, compact_metadata), Some(Err(ListWatchError::Malformed(m))) if m.key.is_none())
        );
        assert!(decode_watch_line::<ConfigMap>("   ", false, compact_metadata).is_none());
    }
}
