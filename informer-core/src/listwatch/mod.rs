//! Listing and watching one resource (client-go `listwatch.go`).
//!
//! Where it sits: between the API server and the [`Reflector`](crate::Reflector), which knows
//! the server only through [`ListerWatcher`]. This module holds the trait, what it returns and
//! how [`ApiListerWatcher`] builds its requests; `pipeline` fetches list pages ahead of the
//! reflector, `decode` turns list pages and watch lines into objects, on the thread `decoder`
//! runs.
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
//! page k+1 at once on a task of its own, and decodes page k meanwhile; page k+1's task does the
//! same for page k+2, up to two pages ahead of the reflector, so the network and the server
//! work while a page is decoded. The reflector still asks for pages one by
//! one and sees exactly what it would have seen: a page fetched ahead is used only when the
//! reflector asks for that very token, and a request for any other page (a new list, or a
//! token that the decoded page contradicts) drops them, aborting their requests. A list is
//! still one request per page; `cargo xtask bench` measures the gain (BENCHMARKS.md).
//!
//! **One decoding thread.** Every list page and every read of the watch stream is decoded on
//! one thread per lister-watcher (`decoder`), shared by the lister-watchers made from it with
//! [`ApiListerWatcher::with_url_path`] (the factory's namespace partitions of one informer),
//! not on tokio's workers or blocking pool: glibc's malloc gives a freed block back to the
//! arena of the thread that allocated it, so objects decoded on one thread and replaced by
//! objects decoded on another left the first arena's memory unused, and the process grew by
//! one object per update. The thread also applies the reflector's transform and puts each
//! object in the `Arc` the cache keeps it in ([`ListerWatcher::list_shared`],
//! [`ListerWatcher::watch_shared`]), and the informer hands what it is done with (replaced and
//! deleted objects) back to be dropped there ([`ListerWatcher::release`]). The requests, body reads and
//! page prefetch stay on tokio; pages fetched ahead wait in the thread's queue, and a watch
//! reads the connection while its previous read is decoded.
//!
//! **Paused time.** The decoding thread is not one of tokio's, so tokio's paused clock
//! (`#[tokio::test(start_paused = true)]`) sees the runtime idle while it decodes and may
//! advance to the next timer: a test that lists or watches through an `ApiListerWatcher` under
//! paused time can see a timeout, backoff or resync fire during a decode. Such a test sets
//! [`ApiListerWatcher::decode_on_blocking_pool`]`(true)`: decodes then run on tokio's
//! blocking pool, during which the clock does not auto-advance. (A real API server's network
//! waits let it advance anyway; tests of timing usually stand a hand-written [`ListerWatcher`]
//! in for the server.)
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

use std::fmt::Debug;
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::core::{Request, Status};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::reflector::TransformFunc;

mod decode;
mod decoder;
mod pipeline;

pub(crate) use decode::decode_list;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use decode::decode_watch_line;
#[cfg(test)]
pub(crate) use decode::map_event;
use decode::{Finish, LinesEnd, LinesRead, ReadBuffers, decode_lines, decode_shared_watch_line, line_reads};
use decoder::DecodeThread;
pub use pipeline::DEFAULT_PAGES_AHEAD;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use pipeline::peek_continue;
use pipeline::{PageBuffers, PageFetcher, PagesAhead, fetch_ahead, fetch_page, lock_ahead};

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

    /// [`list`](Self::list) as the reflector takes it: every object passed through
    /// `transform` (if any) and put in the `Arc` the cache keeps it in. The default does both
    /// on the caller, after `list`; [`ApiListerWatcher`] does them on its decoding thread,
    /// right after decoding the object, so that the `Arc` comes from the same thread (and
    /// arena) as the object's contents (see the module doc). A transform that panics there
    /// fails the page (the list is retried).
    fn list_shared(
        &self,
        params: &ListParams,
        transform: Option<TransformFunc<K>>,
    ) -> BoxFuture<'_, Result<ListPage<Arc<K>>, ListWatchError>>
    where
        K: Send + 'static,
    {
        let page = self.list(params);
        Box::pin(async move { Ok(decode::share_page(page.await?, transform.as_ref())) })
    }

    /// [`watch`](Self::watch) as the reflector takes it: every object passed through
    /// `transform` (if any) and put in the `Arc` the cache keeps it in. The default does both
    /// on the caller, as it reads the stream; [`ApiListerWatcher`] does them on its decoding
    /// thread, right after decoding the event (see the module doc). A transform that panics
    /// there makes its event a [`ListWatchError::Malformed`] one.
    fn watch_shared(
        &self,
        params: &WatchParams,
        resource_version: &str,
        transform: Option<TransformFunc<K>>,
    ) -> BoxFuture<'_, Result<WatchStream<Arc<K>>, ListWatchError>>
    where
        K: Send + 'static,
    {
        let watch = self.watch(params, resource_version);
        Box::pin(async move {
            let events = watch.await?;
            Ok(events
                .map(move |event| event.map(|event| decode::share_event(event, transform.as_ref())))
                .boxed())
        })
    }

    /// Frees `garbage`: what the informer is done with after applying a batch of this
    /// lister-watcher's objects to its cache (the replaced and deleted objects among it). The
    /// default drops it on the caller; [`ApiListerWatcher`] drops it on its decoding thread,
    /// where those objects were allocated (see the module doc).
    fn release(&self, garbage: Box<dyn std::any::Any + Send>) {
        drop(garbage);
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

/// How many reads of a watch stream may be decoding (or queued for the decoding thread) while
/// the reflector has not taken their events yet.
const WATCH_READS_AHEAD: usize = 2;

/// `Accept` of a metadata-only list: `PartialObjectMetadataList`, else whole objects.
const ACCEPT_METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// `Accept` of a metadata-only watch: `PartialObjectMetadata` events, else whole objects.
const ACCEPT_METADATA: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

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
        let url_path: String = url_path.into();
        ApiListerWatcher {
            fetcher: Arc::new(PageFetcher {
                client,
                url_path: Arc::from(url_path),
                max_page_bytes: DEFAULT_MAX_RESPONSE_BYTES,
                pages_ahead: DEFAULT_PAGES_AHEAD,
                skip_managed_fields: false,
                metadata_only: K::metadata_api(),
                buffers: PageBuffers::default(),
                decoder: DecodeThread::default(),
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

    /// What is done to every object right after it is decoded, on the decoding thread (see the
    /// module doc), before anything else sees it: give back the
    /// spare capacity decoding left in it. The default shrinks the lists of its metadata
    /// ([`compact_metadata`](crate::compact::compact_metadata)); the factory passes the
    /// type's own, which its code generator emits per type (see [`crate::compact`]).
    #[must_use]
    pub fn compact(mut self, compact: fn(&mut K)) -> Self {
        self.compact = compact;
        self
    }

    /// This lister-watcher's settings and decoding thread, for the collection at `url_path`:
    /// the factory builds an informer's namespace partitions with it, so that one thread
    /// decodes all of an informer's objects (they share one cache, and one arena).
    #[must_use]
    pub fn with_url_path(&self, url_path: impl Into<String>) -> Self {
        let url_path: String = url_path.into();
        ApiListerWatcher {
            fetcher: Arc::new(PageFetcher {
                url_path: Arc::from(url_path),
                ..self.fetcher_fields()
            }),
            max_event_bytes: self.max_event_bytes,
            ahead: Arc::default(),
            compact: self.compact,
        }
    }

    /// Decodes on tokio's blocking pool (`spawn_blocking`) instead of the decoding thread
    /// (default `false`; see the module doc). The setting is the decoding thread's, so it holds
    /// for every lister-watcher that shares it (made from one another with
    /// [`with_url_path`](Self::with_url_path), `clone` or a setter). For tests under tokio's
    /// paused clock (`start_paused`): the clock does not advance while a blocking-pool task
    /// runs, but does while the decoding thread works, so a timer can fire in the middle of a
    /// decode. It costs the memory the thread saves (see the module doc).
    #[must_use]
    pub fn decode_on_blocking_pool(self, on: bool) -> Self {
        self.fetcher.decoder.set_blocking_pool(on);
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
            decoder: self.fetcher.decoder.clone(),
        }
    }

    /// The collection URL this lists and watches.
    pub fn url_path(&self) -> &str {
        &self.fetcher.url_path
    }
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

impl<K> ListerWatcher<K> for ApiListerWatcher<K>
where
    K: Resource + DeserializeOwned + Clone + Debug + Send + Sync + 'static,
{
    fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>> {
        let page = self.list_shared(params, None);
        // Each `Arc` was made for this page alone: unwrapping it never clones.
        Box::pin(async move { Ok(decode::map_page(page.await?, Arc::unwrap_or_clone)) })
    }

    fn list_shared(
        &self,
        params: &ListParams,
        transform: Option<TransformFunc<K>>,
    ) -> BoxFuture<'_, Result<ListPage<Arc<K>>, ListWatchError>> {
        let params = params.clone();
        let finish = Finish {
            compact: self.compact,
            transform,
        };
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
                        finish.clone(),
                    )
                    .await?
                }
            };
            // Keep the pipeline full: the page after this one may not be on its way yet (the
            // bound stopped it, or its token could not be read ahead).
            if params.limit.is_some()
                && let Some(token) = &page.continue_token
            {
                fetch_ahead(&self.fetcher, &params, token.clone(), &self.ahead, &finish);
            }
            Ok(page)
        })
    }

    fn release(&self, garbage: Box<dyn std::any::Any + Send>) {
        self.fetcher.decoder.release(garbage);
    }

    fn current_resource_version(&self) -> BoxFuture<'_, Result<String, ListWatchError>> {
        // Not through `list`: this one-object page must neither fetch the next page ahead nor
        // drop the pages a list in progress fetched ahead.
        let page = fetch_page::<K>(
            self.fetcher.clone(),
            ListParams::default().limit(1),
            Weak::new(),
            Finish {
                compact: self.compact,
                transform: None,
            },
        );
        Box::pin(async move { Ok(page.await?.resource_version) })
    }

    fn watch(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>> {
        let watch = self.watch_shared(params, resource_version, None);
        Box::pin(async move {
            // Each `Arc` was made for this event alone: unwrapping it never clones.
            let events = watch.await?;
            Ok(events
                .map(|event| event.map(|event| decode::map_event(event, Arc::unwrap_or_clone)))
                .boxed())
        })
    }

    fn watch_shared(
        &self,
        params: &WatchParams,
        resource_version: &str,
        transform: Option<TransformFunc<K>>,
    ) -> BoxFuture<'_, Result<WatchStream<Arc<K>>, ListWatchError>> {
        let request = Request::new(&*self.fetcher.url_path).watch(params, resource_version);
        let max_event_bytes = self.max_event_bytes;
        let skip_managed_fields = self.fetcher.skip_managed_fields;
        let finish = Finish {
            compact: self.compact,
            transform,
        };
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
            // Each read's lines are decoded on the decoding thread, as one batch, while the
            // next read is taken from the connection (up to `WATCH_READS_AHEAD` reads in
            // flight, results in order); the reflector takes every event that is ready as one
            // batch for its store.
            let decoder = self.fetcher.decoder.clone();
            let resource = self.fetcher.url_path.clone();
            let buffers = ReadBuffers::default();
            let events = line_reads(body, max_event_bytes, buffers.clone())
                .map(move |LinesRead { lines, end: read_end }| {
                    let finish = finish.clone();
                    let decode = move |line: &[u8]| match std::str::from_utf8(line) {
                        Ok(text) => decode_shared_watch_line(text, skip_managed_fields, &finish),
                        Err(_) => {
                            decode_shared_watch_line(&String::from_utf8_lossy(line), skip_managed_fields, &finish)
                        }
                    };
                    // Handed to the thread now; awaited in order by `buffered`.
                    let decoded = decoder.run(resource.clone(), move || (decode_lines(&lines, decode), lines));
                    let buffers = buffers.clone();
                    async move {
                        let mut events = match decoded.await {
                            Some((events, lines)) => {
                                buffers.give_back(lines);
                                events
                            }
                            None => vec![Err(ListWatchError::Decode("a watch read's decoding panicked".into()))],
                        };
                        events.extend(read_end.and_then(end));
                        events
                    }
                })
                .buffered(WATCH_READS_AHEAD)
                .flat_map(futures::stream::iter);
            Ok(events.boxed())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// An API server in memory: a list is answered with one page of one ConfigMap, a watch
    /// with one ADDED event of another.
    #[derive(Clone)]
    struct OnePage;

    impl tower::Service<http::Request<kube::client::Body>> for OnePage {
        type Response = http::Response<kube::client::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
            let watch = request
                .uri()
                .query()
                .is_some_and(|query| query.split('&').any(|pair| pair == "watch=true"));
            let body = if watch {
                "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"b\",\"namespace\":\"default\",\"resourceVersion\":\"6\"}}}\n"
            } else {
                r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"a","namespace":"default"}}]}"#
            };
            std::future::ready(Ok(http::Response::new(body.as_bytes().to_vec().into())))
        }
    }

    /// A compact function that takes real time, as a large page's decode does.
    fn slow_compact(cm: &mut k8s_openapi::api::core::v1::ConfigMap) {
        std::thread::sleep(std::time::Duration::from_millis(200));
        crate::compact::compact_metadata(cm);
    }

    /// Lists once, racing a timer an hour of paused time away: whether the timer fired first.
    async fn timer_fired_during_the_list(
        lister_watcher: &ApiListerWatcher<k8s_openapi::api::core::v1::ConfigMap>,
    ) -> bool {
        let timer = tokio::time::sleep(std::time::Duration::from_secs(3600));
        tokio::select! {
            biased;
            page = lister_watcher.list(&ListParams::default()) => {
                let page = page.expect("the in-memory page lists");
                assert_eq!(page.items.len(), 1);
                false
            }
            () = timer => true,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn paused_time_waits_for_a_decode_only_on_the_blocking_pool() {
        let lister_watcher = ApiListerWatcher::from_url_path(Client::new(OnePage, "default"), "/api/v1/configmaps")
            .compact(slow_compact);
        // The decoding thread is not tokio's: the runtime looks idle and the clock jumps.
        assert!(timer_fired_during_the_list(&lister_watcher).await);
        let lister_watcher = lister_watcher.decode_on_blocking_pool(true);
        let start = tokio::time::Instant::now();
        assert!(!timer_fired_during_the_list(&lister_watcher).await);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        // Lister-watchers made from it share the setting (and the decoder).
        let namespaced = lister_watcher.with_url_path("/api/v1/namespaces/default/configmaps");
        assert_eq!(namespaced.url_path(), "/api/v1/namespaces/default/configmaps");
        assert!(!timer_fired_during_the_list(&namespaced).await);
    }

    #[tokio::test]
    async fn shared_objects_are_transformed_and_put_in_their_arc_on_the_decoding_thread() {
        type ConfigMap = k8s_openapi::api::core::v1::ConfigMap;
        let lister_watcher =
            ApiListerWatcher::<ConfigMap>::from_url_path(Client::new(OnePage, "default"), "/api/v1/configmaps");
        let on = Arc::new(Mutex::new(Vec::new()));
        let seen = on.clone();
        let transform: TransformFunc<ConfigMap> = Arc::new(move |mut cm: ConfigMap| {
            seen.lock()
                .unwrap()
                .push(std::thread::current().name().map(str::to_owned));
            cm.data = Some([("transformed".to_string(), "yes".to_string())].into());
            cm
        });
        let transformed = |cm: &ConfigMap| cm.data.as_ref().is_some_and(|data| data.contains_key("transformed"));

        let page = lister_watcher
            .list_shared(&ListParams::default(), Some(transform.clone()))
            .await
            .unwrap();
        assert!(matches!(page.items.as_slice(), [cm] if transformed(cm) && Arc::strong_count(cm) == 1));
        let events: Vec<_> = lister_watcher
            .watch_shared(&WatchParams::default(), "5", Some(transform))
            .await
            .unwrap()
            .collect()
            .await;
        assert!(
            matches!(events.as_slice(), [Ok(WatchEvent::Added(cm))] if transformed(cm)),
            "{events:?}"
        );
        assert_eq!(*on.lock().unwrap(), vec![Some("kinformer-decode".to_string()); 2]);

        // Unshared, as a hand-written caller takes them: the same objects, untransformed.
        let page = lister_watcher.list(&ListParams::default()).await.unwrap();
        assert!(matches!(page.items.as_slice(), [cm] if cm.metadata.name.as_deref() == Some("a") && !transformed(cm)));
        let events: Vec<_> = lister_watcher
            .watch(&WatchParams::default(), "5")
            .await
            .unwrap()
            .collect()
            .await;
        assert!(
            matches!(events.as_slice(), [Ok(WatchEvent::Added(cm))] if cm.metadata.name.as_deref() == Some("b")),
            "{events:?}"
        );
        assert_eq!(on.lock().unwrap().len(), 2);
    }
}
