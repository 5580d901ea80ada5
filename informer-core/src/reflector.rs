//! The reflector: keeps a [`Store`] in step with the server by ListAndWatch
//! (client-go `reflector.go`).
//!
//! It lists (in pages, as client-go's pager) and `replace`s the store with the result, then
//! watches from the list's resourceVersion and turns every event into `add`/`update`/`delete`;
//! a BOOKMARK is passed to [`Store::bookmark`] and moves the resourceVersion on.
//!
//! The protocol is an explicit state machine ([`State`]) with one transition per step, in
//! the manner of kube-runtime's watcher:
//!
//! | from | outcome | to |
//! |---|---|---|
//! | `List` | listed | `Watch(list rv)` |
//! | `List` | continue token expired mid-list | the same list finished in one unpaginated request |
//! | `List` | 410, or "too large resource version", at the rv we listed at | at once, the same list as a consistent read (rv `""`) |
//! | `List` | other error (or that consistent read failed) | `List` after backoff; a consistent read until a list succeeds if the rv was unavailable |
//! | `Watch(rv)` | stream ended normally | `Watch(last rv)`, at once |
//! | `Watch(rv)` | HTTP 410 on the request, or an ERROR event with a 410 `Status` | `List` at the last rv (served from the watch cache), after backoff |
//! | `Watch(rv)` | "too large resource version" (504), or the server found behind `rv` | `List` as a consistent read (rv `""`), after backoff |
//! | `Watch(rv)` | other error, or a stream that closed within a second with no events | `Watch(last rv)`, after backoff |
//!
//! "After backoff" is the next backoff delay, or, when the error was a 429 or 5xx carrying
//! `Retry-After` (`retryAfterSeconds`), the wait the server asked for (at most
//! [`MAX_RETRY_AFTER`]).
//!
//! kube-runtime relists only on the in-stream form of 410 and retries an HTTP 410 forever;
//! both forms relist here. Every relist after a watch waits a backoff delay first, as
//! client-go's `BackoffUntil` loop does, so a server answering 410 again and again is not
//! hammered. Other errors re-watch from the last resourceVersion rather than relisting as
//! client-go does: the resourceVersion is still valid, and a relist of a large resource after
//! every transient error is what overloads servers during incidents. An object without a name,
//! or a list or bookmark without a resourceVersion, is rejected rather than trusted.
//!
//! # A server that went back in time
//!
//! A server restarted on an older backup of its store (an etcd restore without
//! `--bump-revision`, envtest restarted) is *behind* the resourceVersion the reflector resumes
//! from. kube-apiserver answers a list there with `504` "Too large resource version" after
//! waiting 3 s, and a watch with an open stream that stays silent until its counter passes
//! the old value; by then the writes in between are behind the watch's starting point and
//! never seen. kube's client retries a `504` on its own (15 times, with backoff), so even the
//! list's answer may never reach the reflector. So a list or watch at a specific
//! resourceVersion that has not answered (a watch: not delivered its first event) within
//! [`ReflectorConfig::server_behind_check`] (default 5 s) makes the reflector ask the server
//! for its current resourceVersion ([`ListerWatcher::current_resource_version`], a consistent
//! list of one object) while the request goes on. A server behind the one asked for ends the
//! request with [`ListWatchError::ServerBehind`], handled as "too large resource version":
//! the reflector relists as a consistent read. A server that is not behind is only slow, or
//! the resource quiet: the request goes on, unchecked until the next one. Nothing guards the
//! writes that land between the restore and the check if they carry the counter past the old
//! resourceVersion first: no client can tell those apart from a live server's, which is why an
//! etcd restore should bump the revision and mark it compacted (every watch then gets `410`
//! and relists).
//!
//! # Which resourceVersion, which pages
//!
//! As client-go's `relistResourceVersion`: the first list asks for `resourceVersion=0` (any
//! version, so the server's watch cache answers instead of etcd), later lists for the last
//! synced resourceVersion, and a list after that one was unavailable (410 or "too large")
//! for `""` (a consistent read) until a list succeeds.
//!
//! Paging follows client-go's `list()` and pager exactly ([`ReflectorConfig::page_size`]):
//!
//! - a page size the user set applies to every list, at any resourceVersion;
//! - otherwise lists at `""` and `"0"` ask for pages of [`DEFAULT_PAGE_SIZE`]. Together with
//!   `resourceVersion=0` the limit is only a hint: a watch cache ignores it and answers
//!   everything in one page, which ends the list at once (the pager's semantics);
//! - lists at a specific resourceVersion are not paginated, so the watch cache can serve them
//!   (it serves such lists only without a limit), *unless* the first list (at `"0"`) came back
//!   in pages (client-go `paginatedResult`): then the server has no watch cache for the
//!   resource, etcd answers anyway, and every later list uses pages of [`DEFAULT_PAGE_SIZE`];
//! - an expired continue token (reason `Expired`, page 2 or later) finishes the list in one
//!   unpaginated request at the list's resourceVersion (client-go's `FullListIfExpired`), so a
//!   list slower than compaction still completes, whether first list or relist.
//!
//! # Watching
//!
//! Backoff is client-go's (800 ms doubling to 30 s, jittered, reset after 2 minutes without
//! failure); the watch timeout is drawn from `[min, 2 × min)` where `min` is
//! [`ReflectorConfig::min_watch_timeout`] but never below client-go's 5 minutes
//! ([`MIN_WATCH_TIMEOUT`]), so that many clients do not re-watch in lockstep and short watches
//! do not load the server. An object that does not decode is counted in [`ReflectorMetrics`]
//! and the watch goes on: with a key (its metadata decodes), it goes to the store as an
//! undecodable mark ([`Store::mark_undecodable`], [`Store::delete_undecodable`] for a DELETED,
//! and with a list [`Store::replace_with_undecodable`]), so that it never looks deleted (see
//! [`undecodable`](crate::undecodable)); without one, it is logged and skipped.
//!
//! Events reach the store in batches: every event the stream has ready without waiting (the
//! lines of one read from the connection, typically) goes to [`Store::apply_changes`] at once,
//! so the queue is locked, and its consumer woken, once per batch instead of once per event.
//! The order and the effect are those of one call per event; a BOOKMARK or an error first
//! applies the events before it.
//!
//! During a watch the last-synced resourceVersion (and a
//! [`ResourceVersionUpdater`], if set) follows every event, as client-go's `handleWatch`
//! does, with client-go's rule for a watch started at `""` or `"0"`: its first events are
//! synthetic ADDEDs in no resourceVersion order, so the resourceVersion only follows once an
//! event other than ADDED arrived. Watches started at a specific resourceVersion, and the
//! stream that goes on after a streamed initial list, follow from the first event.
//!
//! # Failure lines
//!
//! A failed list or watch is one WARN line that says what failed, where, and for which
//! resource: `list failed: connection refused to https://127.0.0.1:6443 (pods)`, with the
//! fields `reflector`, `server` and `error` (the whole cause chain, each cause once, by
//! [`ErrorChain`]). The server comes from the client: one built by
//! [`client::from_config`](crate::client::from_config) or [`client::infer`](crate::client::infer)
//! names it in its errors, as a Go client's `url.Error` does (`kube::Client` itself does not keep
//! its URL, so with any other client the line names the cause and the resource only).
//!
//! With [`ReflectorConfig::use_watch_list`] the initial list is streamed
//! (`sendInitialEvents=true`): initial ADDED events are collected until the BOOKMARK
//! annotated `k8s.io/initial-events-end`, then replace the store, and the same stream goes on
//! as the watch. If the server refuses or the stream fails first, that round falls back to
//! list+watch.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use informer_core::{ApiListerWatcher, Indexer, Reflector, ReflectorConfig};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube::Client) {
//! let cache = Indexer::<ConfigMap>::default();
//! let reflector = Reflector::new(
//!     Arc::new(ApiListerWatcher::new(kube::Api::<ConfigMap>::all(client))),
//!     Arc::new(cache.clone()),
//!     ReflectorConfig::default().name("configmaps").labels("app=web"),
//! )
//! .with_resource_version_updater(Arc::new(|rv: &str| tracing::debug!(rv, "synced")));
//! reflector.run(CancellationToken::new()).await;
//! # }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::Resource;
use kube::api::{ListParams, WatchEvent, WatchParams};
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::{Backoff, BackoffConfig};
use crate::client;
use crate::delta::DeltaType;
use crate::error_chain::ErrorChain;
use crate::listwatch::{ListWatchError, ListerWatcher, MalformedObject, WatchStream};
use crate::store::{Store, StoreError, meta_namespace_key};
use crate::undecodable::Undecodable;

/// Transforms each object before it enters the store (client-go `TransformFunc`), e.g. to
/// drop `managedFields` and save memory. The reflector hands it to its lister-watcher
/// ([`ListerWatcher::list_shared`], [`ListerWatcher::watch_shared`]), which applies it as it
/// puts each object in its `Arc`: an [`ApiListerWatcher`](crate::ApiListerWatcher) on its
/// decoding thread, right after decoding the object, so a transform that panics costs that
/// object's watch event (skipped as malformed) or its list page (the list is retried).
pub type TransformFunc<K> = Arc<dyn Fn(K) -> K + Send + Sync>;

/// Called with every list/watch error (client-go `WatchErrorHandler`).
pub type WatchErrorHandler = Arc<dyn Fn(&ListWatchError) + Send + Sync>;

/// Asked on each resync tick whether to resync now (the informer's processor answers).
pub type ShouldResyncFunc = Arc<dyn Fn() -> bool + Send + Sync>;

/// Told every resourceVersion the reflector's last-synced resourceVersion moves to during a
/// watch (client-go `ResourceVersionUpdater`), under client-go's rule: from the first event of
/// a watch started at a specific resourceVersion, and for a watch started at `""`/`"0"` only
/// once an event other than ADDED arrived. Not called for lists: `Store::replace` carries
/// their resourceVersion.
///
/// client-go asks the store whether it implements `ResourceVersionUpdater`; here it is a hook
/// set with [`Reflector::with_resource_version_updater`], so any component can follow the
/// reflector without being its store. It runs on the reflector's task: keep it quick.
pub type ResourceVersionUpdater = Arc<dyn Fn(&str) + Send + Sync>;

/// The annotation on the BOOKMARK that ends a streamed initial list.
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// The shortest watch timeout (client-go `defaultMinWatchTimeout`, 5 minutes): a configured
/// [`ReflectorConfig::min_watch_timeout`] below it is raised to it, as client-go does, so that
/// short watches do not load the server.
pub const MIN_WATCH_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// The longest server-requested wait (`Retry-After`) the reflector honours; a longer one is
/// cut to this, so a bogus header cannot park an informer for hours.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(5 * 60);

/// The default of [`ReflectorConfig::server_behind_check`]: longer than kube-apiserver's 3 s
/// wait before it answers "too large resource version", so a client that does not retry sees
/// that answer first; short enough that a restored server is found before its writes catch up
/// with the old resourceVersion on most clusters.
pub const DEFAULT_SERVER_BEHIND_CHECK: Duration = Duration::from_secs(5);

/// The longest wait between two checks of one unanswered request
/// ([`ReflectorConfig::server_behind_check`] doubles up to this).
const MAX_SERVER_BEHIND_CHECK_WAIT: Duration = Duration::from_secs(60);

/// How often [`Reflector::unless_server_behind`] checks an unanswered request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// Until the server is found not behind (or it answers).
    Once,
    /// As long as it is unanswered.
    UntilAnswered,
}

/// The page size of lists the user did not set one for (client-go's pager `defaultPageSize`).
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// The most watch events handed to the store in one [`Store::apply_changes`] call: the events
/// one read of the stream made ready, up to this many (the `RealFifo`'s default pop batch).
const WATCH_BATCH_MAX: usize = crate::real_fifo::DEFAULT_BATCH_SIZE;

/// How a reflector lists and watches.
///
/// Built from `Default` with the setters (`ReflectorConfig::default().name("pods").page_size(100)`),
/// so that fields can be added without a breaking change.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ReflectorConfig {
    /// Names the reflector in logs (e.g. the resource).
    pub name: String,
    /// Objects per list page, as set by the user (client-go `WatchListPageSize`).
    ///
    /// `None` (default): client-go's rules, see the [module docs](self): pages of
    /// [`DEFAULT_PAGE_SIZE`] for lists at `""` and `"0"`, lists at a specific resourceVersion
    /// whole unless the first list came back in pages. `Some(n)`: pages of `n` for every list,
    /// at any resourceVersion; as client-go warns, such lists always go to etcd instead of the
    /// watch cache. `Some(0)`: no list is paginated (client-go's pager with a page size of 0;
    /// client-go's reflector has no setting for it, since 0 means "unset" there).
    pub page_size: Option<u32>,
    /// Label selector for list and watch.
    pub label_selector: Option<String>,
    /// Field selector for list and watch.
    pub field_selector: Option<String>,
    /// How often to resync the store; zero disables resync.
    pub resync_period: Duration,
    /// The watch timeout is drawn from `[min, 2 × min)`, `min` being this or
    /// [`MIN_WATCH_TIMEOUT`] if this is shorter (client-go `ReflectorOptions.MinWatchTimeout`).
    pub min_watch_timeout: Duration,
    /// Stream the initial list (`sendInitialEvents=true`) instead of listing.
    pub use_watch_list: bool,
    /// Retry backoff.
    pub backoff: BackoffConfig,
    /// How long a list or watch at a specific resourceVersion may go unanswered (for a watch:
    /// without its first event) before the reflector asks the server for its current
    /// resourceVersion, to find a server that went back in time; see the
    /// [module docs](self#a-server-that-went-back-in-time). Zero turns the check off.
    /// Default [`DEFAULT_SERVER_BEHIND_CHECK`].
    pub server_behind_check: Duration,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        ReflectorConfig {
            name: "reflector".to_string(),
            page_size: None,
            label_selector: None,
            field_selector: None,
            resync_period: Duration::ZERO,
            min_watch_timeout: MIN_WATCH_TIMEOUT,
            use_watch_list: false,
            backoff: BackoffConfig::default(),
            server_behind_check: DEFAULT_SERVER_BEHIND_CHECK,
        }
    }
}

impl ReflectorConfig {
    /// Sets the name used in logs.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the page size of every list, at any resourceVersion (0: no list is paginated).
    /// Leave it unset for client-go's default paging; see [`ReflectorConfig::page_size`].
    #[must_use]
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = Some(page_size);
        self
    }

    /// Restricts list and watch to objects matching a label selector.
    #[must_use]
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Restricts list and watch to objects matching a field selector.
    #[must_use]
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    /// Sets the resync period (zero: never).
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = period;
        self
    }

    /// Streams the initial list instead of listing.
    #[must_use]
    pub fn use_watch_list(mut self, on: bool) -> Self {
        self.use_watch_list = on;
        self
    }

    /// Sets the minimum watch timeout; values below [`MIN_WATCH_TIMEOUT`] (5 minutes) count
    /// as 5 minutes.
    #[must_use]
    pub fn min_watch_timeout(mut self, timeout: Duration) -> Self {
        self.min_watch_timeout = timeout;
        self
    }

    /// Sets the retry backoff.
    #[must_use]
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets [`server_behind_check`](Self::server_behind_check) (zero: off).
    #[must_use]
    pub fn server_behind_check(mut self, after: Duration) -> Self {
        self.server_behind_check = after;
        self
    }
}

/// Counters a reflector keeps, readable while it runs (for metrics and tests). Made with
/// `Default`; counters may be added.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ReflectorMetrics {
    /// Completed lists (initial and relists).
    pub lists: AtomicU64,
    /// Relists forced by a 410 Gone/Expired (or "too large resource version").
    pub relists_after_gone: AtomicU64,
    /// Watch requests made.
    pub watches: AtomicU64,
    /// Watch events applied to the store.
    pub events: AtomicU64,
    /// List and watch errors (other than malformed objects).
    pub errors: AtomicU64,
    /// Objects that did not decode or had no name, each time one arrived. Those with a key
    /// are kept known to the cache as undecodable (see [`undecodable`](crate::undecodable)),
    /// the others skipped.
    pub malformed_objects: AtomicU64,
    /// Bookmarks received.
    pub bookmarks: AtomicU64,
    /// Requests at a resourceVersion that went unanswered long enough for the reflector to ask
    /// the server for its current resourceVersion ([`ReflectorConfig::server_behind_check`]).
    pub server_behind_checks: AtomicU64,
}

impl ReflectorMetrics {
    fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The resourceVersion a reflector last synced to, shared with its owner.
#[derive(Debug, Clone, Default)]
pub struct LastSyncResourceVersion(Arc<RwLock<String>>);

impl LastSyncResourceVersion {
    /// The current value (`""` before the first list).
    pub fn get(&self) -> String {
        self.0.read().map(|rv| rv.clone()).unwrap_or_default()
    }

    fn set(&self, rv: &str) {
        if let Ok(mut guard) = self.0.write() {
            guard.clear();
            guard.push_str(rv);
        }
    }
}

/// Where the ListAndWatch protocol stands (see the table in the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum State {
    /// A list is needed.
    #[non_exhaustive]
    List {
        /// The server no longer has (410) or does not yet have ("too large") the last
        /// resourceVersion, so the list must be a consistent read (`resourceVersion` unset);
        /// client-go `isLastSyncResourceVersionUnavailable`. Cleared by a successful list.
        rv_unavailable: bool,
    },
    /// Watching from a resourceVersion.
    #[non_exhaustive]
    Watch {
        /// The resourceVersion to watch from.
        resource_version: String,
    },
}

/// The result of one step of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Transition {
    /// Go on with this state now.
    Now(State),
    /// Wait a backoff delay, then go on with this state.
    AfterBackoff(State),
    /// The store is closed: stop.
    Stop,
}

/// What the protocol remembers across steps besides its [`State`].
#[derive(Debug, Default)]
struct Memory {
    /// The first list (at `"0"`) came back in pages: the server has no watch cache for this
    /// resource, so later lists at a resourceVersion are paginated too (client-go
    /// `paginatedResult`). Never cleared.
    paginated_result: bool,
}

/// A whole list, gathered page by page.
struct Listed<K> {
    items: Vec<Arc<K>>,
    /// The keys of listed objects that did not decode.
    undecodable: Vec<(String, Undecodable)>,
    resource_version: String,
    /// A continue token was followed (client-go's pager `paginatedResult`).
    paginated: bool,
}

/// The watch timeout in seconds, drawn from `[min, 2 × min)` with `min` never below
/// [`MIN_WATCH_TIMEOUT`] (client-go `minWatchTimeout + rand.Float64() * (max - min)`, truncated
/// to whole seconds).
fn watch_timeout_seconds(min_watch_timeout: Duration) -> u32 {
    let min = min_watch_timeout.max(MIN_WATCH_TIMEOUT).as_secs_f64();
    let seconds = min + rand::rng().random::<f64>() * min;
    // `as` saturates: a timeout beyond u32::MAX seconds is u32::MAX.
    seconds as u32
}

/// The page size of a list at `resource_version` (`None`: a consistent read), as client-go's
/// `list()` sets its pager's: the user's if set; the default once the first list was
/// paginated; none at a specific resourceVersion (so the watch cache can serve it); else the
/// default. 0: not paginated.
fn list_page_size(configured: Option<u32>, paginated_result: bool, resource_version: Option<&str>) -> u32 {
    match (configured, resource_version) {
        (Some(page_size), _) => page_size,
        (None, _) if paginated_result => DEFAULT_PAGE_SIZE,
        (None, Some(rv)) if !rv.is_empty() && rv != "0" => 0,
        (None, _) => DEFAULT_PAGE_SIZE,
    }
}

/// What a failed list or watch line says after "list failed: ": the cause in a few words, the
/// server it was sent to when the client knows it (see [`client`](crate::client)), and the
/// reflector's name: `connection refused to https://127.0.0.1:6443 (pods)`. A request the
/// server answered is its error's text (`api error 403 Forbidden: …`); a request that got no
/// answer is its I/O cause, or else the last cause in its chain (a TLS failure, say), since
/// the outer ones only say that the request failed. The full chain is the line's `error` field.
fn failure(error: &ListWatchError, name: &str) -> String {
    let server = client::server_of(error);
    let cause = match (client::transport_cause(error), server, error) {
        (Some(cause), _, _) => cause,
        (None, Some(_), _) | (None, None, ListWatchError::Transport(_)) => {
            let root = std::iter::successors(Some(error as &(dyn std::error::Error + 'static)), |&e| e.source());
            root.last().map_or_else(|| error.to_string(), ToString::to_string)
        }
        (None, None, _) => error.to_string(),
    };
    let mut line = cause;
    if let Some(server) = server {
        line.push_str(" to ");
        line.push_str(server);
    }
    if !name.is_empty() {
        line.push_str(" (");
        line.push_str(name);
        line.push(')');
    }
    line
}

/// Keeps a store in step with one resource on the server.
pub struct Reflector<K> {
    config: ReflectorConfig,
    lister_watcher: Arc<dyn ListerWatcher<K>>,
    store: Arc<dyn Store<K>>,
    should_resync: Option<ShouldResyncFunc>,
    watch_error_handler: Option<WatchErrorHandler>,
    resource_version_updater: Option<ResourceVersionUpdater>,
    transform: Option<TransformFunc<K>>,
    last_sync_resource_version: LastSyncResourceVersion,
    metrics: Arc<ReflectorMetrics>,
    /// The wait the server asked for with the last error (Retry-After on a 429 or 5xx).
    retry_after: std::sync::Mutex<Option<Duration>>,
}

impl<K> Reflector<K>
where
    K: Resource + Send + Sync + 'static,
{
    /// A reflector that feeds `store` from `lister_watcher`.
    pub fn new(lister_watcher: Arc<dyn ListerWatcher<K>>, store: Arc<dyn Store<K>>, config: ReflectorConfig) -> Self {
        Reflector {
            config,
            lister_watcher,
            store,
            should_resync: None,
            watch_error_handler: None,
            resource_version_updater: None,
            transform: None,
            last_sync_resource_version: LastSyncResourceVersion::default(),
            metrics: Arc::new(ReflectorMetrics::default()),
            retry_after: std::sync::Mutex::new(None),
        }
    }

    /// Asks `f` on every resync tick whether to resync (default: always).
    #[must_use]
    pub fn with_should_resync(mut self, f: ShouldResyncFunc) -> Self {
        self.should_resync = Some(f);
        self
    }

    /// Calls `f` with every list/watch error.
    #[must_use]
    pub fn with_watch_error_handler(mut self, f: WatchErrorHandler) -> Self {
        self.watch_error_handler = Some(f);
        self
    }

    /// Calls `f` each time the last-synced resourceVersion moves during a watch (client-go
    /// `ResourceVersionUpdater`; see [`ResourceVersionUpdater`] for when).
    #[must_use]
    pub fn with_resource_version_updater(mut self, f: ResourceVersionUpdater) -> Self {
        self.resource_version_updater = Some(f);
        self
    }

    /// Transforms every object before it enters the store.
    #[must_use]
    pub fn with_transform(mut self, f: TransformFunc<K>) -> Self {
        self.transform = Some(f);
        self
    }

    /// Shares the last-synced resourceVersion with `handle` (used by the informer).
    #[must_use]
    pub fn with_last_sync_resource_version(mut self, handle: LastSyncResourceVersion) -> Self {
        self.last_sync_resource_version = handle;
        self
    }

    /// Shares counters with `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<ReflectorMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The resourceVersion last synced to (`""` before the first list).
    pub fn last_sync_resource_version(&self) -> String {
        self.last_sync_resource_version.get()
    }

    /// The reflector's counters.
    pub fn metrics(&self) -> &Arc<ReflectorMetrics> {
        &self.metrics
    }

    /// Runs ListAndWatch and the resync timer until `shutdown` is cancelled or the store closes.
    pub async fn run(&self, shutdown: CancellationToken) {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = self.list_and_watch() => {}
            _ = self.resync_loop() => {}
        }
        debug!(reflector = %self.config.name, "reflector stopped");
    }

    async fn list_and_watch(&self) {
        let mut backoff = Backoff::new(self.config.backoff.clone());
        let mut memory = Memory::default();
        let mut state = State::List { rv_unavailable: false };
        loop {
            let transition = match state {
                State::List { rv_unavailable } => self.step_list(rv_unavailable, &mut memory).await,
                State::Watch { resource_version } => self.step_watch(resource_version).await,
            };
            state = match transition {
                Transition::Now(next) => next,
                Transition::AfterBackoff(next) => {
                    // The backoff advances either way, so failures without Retry-After that
                    // follow still escalate.
                    let backoff_delay = backoff.next_delay();
                    let retry_after = self.retry_after.lock().unwrap_or_else(|p| p.into_inner()).take();
                    let delay = retry_after.unwrap_or(backoff_delay);
                    debug!(reflector = %self.config.name, ?delay, server_asked = retry_after.is_some(), "backing off");
                    tokio::time::sleep(delay).await;
                    next
                }
                Transition::Stop => return,
            };
        }
    }

    async fn resync_loop(&self) {
        let period = self.config.resync_period;
        if period.is_zero() {
            return futures::future::pending().await;
        }
        loop {
            tokio::time::sleep(period).await;
            if self.should_resync.as_ref().is_none_or(|f| f()) {
                debug!(reflector = %self.config.name, "forcing resync");
                if let Err(StoreError::Closed) = self.store.resync() {
                    return futures::future::pending().await;
                }
            }
        }
    }

    fn report(&self, error: &ListWatchError) {
        ReflectorMetrics::inc(&self.metrics.errors);
        // A 429 or 5xx carrying Retry-After sets the next wait; any other error clears it.
        let retry_after = match error {
            ListWatchError::Api {
                code,
                retry_after_seconds: Some(seconds),
                ..
            } if *code == 429 || *code >= 500 => Some(Duration::from_secs(u64::from(*seconds)).min(MAX_RETRY_AFTER)),
            _ => None,
        };
        *self.retry_after.lock().unwrap_or_else(|p| p.into_inner()) = retry_after;
        if let Some(handler) = &self.watch_error_handler {
            handler(error);
        }
    }

    /// Counts a malformed object and, if it has a key, returns it as an undecodable mark for
    /// the store (which logs it once per key and resourceVersion); one without a key is logged
    /// here and skipped.
    fn undecodable(&self, malformed: &MalformedObject) -> Option<(String, Undecodable)> {
        let Some(key) = &malformed.key else {
            self.skip_malformed(malformed);
            return None;
        };
        ReflectorMetrics::inc(&self.metrics.malformed_objects);
        let undecodable = Undecodable::new(
            malformed.resource_version.clone().unwrap_or_default(),
            malformed.error.clone(),
        );
        debug!(reflector = %self.config.name, %key, deleted = malformed.deleted, error = %malformed.error,
            "object does not decode");
        Some((key.clone(), undecodable))
    }

    fn skip_malformed(&self, malformed: &MalformedObject) {
        ReflectorMetrics::inc(&self.metrics.malformed_objects);
        warn!(
            reflector = %self.config.name,
            key = malformed.key.as_deref().unwrap_or("<unknown>"),
            error = %malformed.error,
            "skipping malformed object",
        );
    }

    /// Keeps `obj` (already transformed, by the lister-watcher) if it has a key; an object
    /// without a name (which the store could not hold) is logged, counted and skipped.
    fn push_keyed(&self, items: &mut Vec<Arc<K>>, obj: Arc<K>) {
        match meta_namespace_key(obj.as_ref()) {
            Ok(_) => items.push(obj),
            Err(e) => self.skip_malformed(&MalformedObject::new(e.to_string())),
        }
    }

    fn watch_params(&self) -> WatchParams {
        let mut params = WatchParams::default().timeout(watch_timeout_seconds(self.config.min_watch_timeout));
        // As client-go: ask for bookmarks; nothing relies on getting them.
        params.bookmarks = true;
        params.label_selector = self.config.label_selector.clone();
        params.field_selector = self.config.field_selector.clone();
        params
    }

    async fn step_list(&self, rv_unavailable: bool, memory: &mut Memory) -> Transition {
        if self.config.use_watch_list {
            match self.watch_list().await {
                Ok(Some((stream, rv))) => return self.consume_watch(stream, rv, Instant::now(), true).await,
                Ok(None) => return Transition::Stop,
                Err(e) => {
                    self.report(&e);
                    warn!(reflector = %self.config.name, error = %e, "streaming list failed, falling back to list+watch");
                }
            }
        }
        // client-go's relistResourceVersion: "" (a consistent read) once the last rv is
        // unavailable, else the last synced rv, or "0" (any, from the watch cache) at first.
        let resource_version = match (rv_unavailable, self.last_sync_resource_version.get()) {
            (true, _) => None,
            (false, last) if last.is_empty() => Some("0".to_string()),
            (false, last) => Some(last),
        };
        // As client-go, the page size is chosen once, for the rv first asked for, and kept for
        // the consistent read that may follow.
        let page_size = list_page_size(
            self.config.page_size,
            memory.paginated_result,
            resource_version.as_deref(),
        );
        let mut rv_unavailable = rv_unavailable;
        let mut listed = self
            .unless_server_behind(
                resource_version.as_deref().unwrap_or(""),
                Checks::UntilAnswered,
                self.list(resource_version.as_deref(), page_size),
            )
            .await;
        if let Err(e) = &listed
            && (e.is_gone() || e.is_too_large_resource_version())
        {
            // As client-go's list(): retry at once as a consistent read. The pager already
            // finished an expired paginated list in one request; this is the rv itself being
            // unavailable (compacted away, or not yet seen by this server).
            self.report(e);
            ReflectorMetrics::inc(&self.metrics.relists_after_gone);
            info!(
                reflector = %self.config.name,
                error = %e,
                resource_version = resource_version.as_deref().unwrap_or(""),
                "list's resourceVersion unavailable, listing again as a consistent read",
            );
            rv_unavailable = true;
            listed = self.list(None, page_size).await;
        }
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) => {
                self.report(&e);
                warn!(
                    reflector = %self.config.name,
                    server = client::server_of(&e).map(tracing::field::display),
                    error = %ErrorChain(&e),
                    "list failed: {}",
                    failure(&e, &self.config.name),
                );
                return Transition::AfterBackoff(State::List { rv_unavailable });
            }
        };
        // Only the list at "0" tells whether the server has a watch cache: a consistent read
        // ("") comes from etcd, paginated even when a watch cache exists (client-go's comment).
        if resource_version.as_deref() == Some("0") && listed.paginated {
            memory.paginated_result = true;
        }
        let count = listed.items.len();
        let undecodable = listed.undecodable.len();
        match self
            .store
            .replace_with_undecodable(listed.items, listed.undecodable, &listed.resource_version)
        {
            Ok(()) => {}
            Err(StoreError::Closed) => return Transition::Stop,
            Err(e) => {
                let e = ListWatchError::Decode(format!("the store refused the list: {e}"));
                self.report(&e);
                return Transition::AfterBackoff(State::List { rv_unavailable });
            }
        }
        self.last_sync_resource_version.set(&listed.resource_version);
        ReflectorMetrics::inc(&self.metrics.lists);
        info!(
            reflector = %self.config.name,
            objects = count,
            undecodable,
            resource_version = %listed.resource_version,
            page_size,
            paginated = listed.paginated,
            "listed",
        );
        Transition::Now(State::Watch {
            resource_version: listed.resource_version,
        })
    }

    /// Lists everything at `resource_version` (`None`: a consistent read) in pages of
    /// `page_size` (0: one request), as client-go's pager (`ListPager.List` with
    /// `FullListIfExpired`).
    async fn list(&self, resource_version: Option<&str>, page_size: u32) -> Result<Listed<K>, ListWatchError> {
        let first = ListParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            limit: (page_size > 0).then_some(page_size),
            resource_version: resource_version.map(str::to_string),
            ..ListParams::default()
        };
        let started = Instant::now();
        let mut params = first.clone();
        let mut items = Vec::new();
        let mut undecodable = Vec::new();
        let mut paginated = false;
        loop {
            let page = match self.lister_watcher.list_shared(&params, self.transform.clone()).await {
                Ok(page) => page,
                Err(e) if e.is_resource_expired() && params.continue_token.is_some() => {
                    // The continue token expired mid-list (FullListIfExpired): a list slower
                    // than compaction would never finish page by page, so list everything at
                    // once, unpaginated, at the original resourceVersion. Like the pager, this
                    // answer is the list, whatever it says about further pages.
                    info!(
                        reflector = %self.config.name,
                        listed = items.len(),
                        "continue token expired, listing in one request",
                    );
                    let whole = ListParams { limit: None, ..first };
                    let page = self.lister_watcher.list_shared(&whole, self.transform.clone()).await?;
                    items.clear();
                    undecodable.clear();
                    undecodable.extend(page.malformed.iter().filter_map(|m| self.undecodable(m)));
                    items.reserve(page.items.len());
                    for obj in page.items {
                        self.push_keyed(&mut items, obj);
                    }
                    return self.listed(items, undecodable, page.resource_version, true);
                }
                Err(e) => return Err(e),
            };
            undecodable.extend(page.malformed.iter().filter_map(|m| self.undecodable(m)));
            items.reserve(page.items.len());
            for obj in page.items {
                self.push_keyed(&mut items, obj);
            }
            // A server may ignore the limit (a watch cache does at "0") and answer in one
            // page: that ends the list, unpaginated.
            match page.continue_token {
                Some(token) => {
                    info!(reflector = %self.config.name, listed = items.len(), elapsed = ?started.elapsed(), "listing");
                    // The token carries the list's resourceVersion; none may be sent with it.
                    params = crate::listwatch::continuation(&params, token);
                    paginated = true;
                }
                None => return self.listed(items, undecodable, page.resource_version, paginated),
            }
        }
    }

    fn listed(
        &self,
        items: Vec<Arc<K>>,
        undecodable: Vec<(String, Undecodable)>,
        resource_version: String,
        paginated: bool,
    ) -> Result<Listed<K>, ListWatchError> {
        if resource_version.is_empty() {
            // Watching from "" would mean "current state": missed deletes would go unnoticed.
            return Err(ListWatchError::Decode("the list carries no resourceVersion".into()));
        }
        Ok(Listed {
            items,
            undecodable,
            resource_version,
            paginated,
        })
    }

    /// Streams the initial list. `Ok(None)`: the store is closed.
    async fn watch_list(&self) -> Result<Option<(WatchStream<Arc<K>>, String)>, ListWatchError> {
        let mut params = self.watch_params();
        params.send_initial_events = true;
        ReflectorMetrics::inc(&self.metrics.watches);
        let mut stream = self
            .lister_watcher
            .watch_shared(&params, "", self.transform.clone())
            .await?;
        let mut initial: HashMap<String, Arc<K>> = HashMap::new();
        let mut initial_undecodable: HashMap<String, Undecodable> = HashMap::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => match meta_namespace_key(obj.as_ref()) {
                    Ok(key) => {
                        initial_undecodable.remove(&key);
                        initial.insert(key, obj);
                    }
                    Err(e) => self.skip_malformed(&MalformedObject::new(e.to_string())),
                },
                Ok(WatchEvent::Deleted(obj)) => {
                    if let Ok(key) = meta_namespace_key(obj.as_ref()) {
                        initial_undecodable.remove(&key);
                        initial.remove(&key);
                    }
                }
                Ok(WatchEvent::Bookmark(bookmark)) => {
                    // As client-go, bookmarks of the initial phase go to the temporary set,
                    // not to the store: the store gets the whole list with `replace`.
                    ReflectorMetrics::inc(&self.metrics.bookmarks);
                    let end = bookmark
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END_ANNOTATION)
                        .is_some_and(|v| v == "true");
                    if end {
                        let rv = bookmark.metadata.resource_version;
                        let count = initial.len();
                        match self.store.replace_with_undecodable(
                            initial.into_values().collect(),
                            initial_undecodable.into_iter().collect(),
                            &rv,
                        ) {
                            Ok(()) => {}
                            Err(StoreError::Closed) => return Ok(None),
                            Err(e) => return Err(ListWatchError::Decode(e.to_string())),
                        }
                        self.last_sync_resource_version.set(&rv);
                        ReflectorMetrics::inc(&self.metrics.lists);
                        info!(reflector = %self.config.name, objects = count, resource_version = %rv, "streamed initial list");
                        return Ok(Some((stream, rv)));
                    }
                }
                Ok(WatchEvent::Error(status)) => return Err(ListWatchError::from_status(&status)),
                Err(ListWatchError::Malformed(m)) => {
                    if let Some((key, undecodable)) = self.undecodable(&m) {
                        initial.remove(&key);
                        if m.deleted {
                            initial_undecodable.remove(&key);
                        } else {
                            initial_undecodable.insert(key, undecodable);
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(ListWatchError::Decode(
            "the stream ended before the initial-events-end bookmark".into(),
        ))
    }

    async fn step_watch(&self, resource_version: String) -> Transition {
        let params = self.watch_params();
        ReflectorMetrics::inc(&self.metrics.watches);
        let started = Instant::now();
        // client-go's propagateRVFromStart: a watch from "" or "0" begins with synthetic ADDED
        // events in no resourceVersion order.
        let propagate_rv_from_start = !(resource_version.is_empty() || resource_version == "0");
        // The first event is awaited here, with the request, so that a watch the server
        // accepts but never feeds (kube-apiserver's answer to a future resourceVersion) is
        // checked as one that never answers.
        let opened = async {
            // Until the server accepts the watch, it may go behind at any moment (a client
            // retrying its answers keeps the request open across a restart): checked until
            // answered. Once accepted, a restart would close the watch: checked once.
            let watch = self
                .lister_watcher
                .watch_shared(&params, &resource_version, self.transform.clone());
            let mut stream = self
                .unless_server_behind(&resource_version, Checks::UntilAnswered, watch)
                .await?
                .fuse();
            let first = self
                .unless_server_behind(&resource_version, Checks::Once, async { Ok(stream.next().await) })
                .await?;
            Ok::<_, ListWatchError>(match first {
                Some(first) => futures::stream::iter([first]).chain(stream).boxed(),
                None => futures::stream::empty().boxed(),
            })
        };
        match opened.await {
            Ok(stream) => {
                self.consume_watch(stream, resource_version, started, propagate_rv_from_start)
                    .await
            }
            Err(e) => self.after_watch_error(e, resource_version),
        }
    }

    /// Runs `request`, a list or watch at `resource_version`. If it has not answered within
    /// [`ReflectorConfig::server_behind_check`], asks the server for its current
    /// resourceVersion meanwhile, and gives `request` up with
    /// [`ListWatchError::ServerBehind`] if the server is behind the one asked for; `checks`
    /// says whether to check again, after twice the wait each time, while it stays
    /// unanswered. A check that could not read the server's resourceVersion is always made
    /// again. Requests at `""` or `"0"`, and resourceVersions that are not numbers, are never
    /// checked: only etcd's revisions can be compared, and kube-apiserver compares them the
    /// same way.
    async fn unless_server_behind<T>(
        &self,
        resource_version: &str,
        checks: Checks,
        request: impl Future<Output = Result<T, ListWatchError>>,
    ) -> Result<T, ListWatchError> {
        let check_after = self.config.server_behind_check;
        let requested = match resource_version.parse::<u64>() {
            Ok(rv) if rv > 0 && !check_after.is_zero() => rv,
            _ => return request.await,
        };
        let mut request = std::pin::pin!(request);
        let mut wait = check_after;
        loop {
            tokio::select! {
                biased;
                answer = &mut request => return answer,
                _ = tokio::time::sleep(wait) => {}
            }
            ReflectorMetrics::inc(&self.metrics.server_behind_checks);
            tokio::select! {
                biased;
                answer = &mut request => return answer,
                current = self.lister_watcher.current_resource_version() => match current {
                    Ok(current) if current.parse::<u64>().is_ok_and(|c| c < requested) => {
                        return Err(ListWatchError::ServerBehind {
                            requested: resource_version.to_string(),
                            current,
                        });
                    }
                    Ok(current) => {
                        debug!(reflector = %self.config.name, %resource_version, %current,
                            "request unanswered, and the server is not behind it: waiting on");
                        if checks == Checks::Once {
                            break;
                        }
                    }
                    Err(e) => {
                        debug!(reflector = %self.config.name, %resource_version, error = %e,
                            "request unanswered, and the server's resourceVersion could not be read");
                    }
                }
            }
            wait = (wait * 2).min(MAX_SERVER_BEHIND_CHECK_WAIT.max(check_after));
        }
        request.await
    }

    fn after_watch_error(&self, error: ListWatchError, resource_version: String) -> Transition {
        self.report(&error);
        if error.is_too_large_resource_version() {
            // The server has not seen our resourceVersion (an etcd restore, or a failover to a
            // server behind the one we listed from): as client-go, the last resourceVersion is
            // unavailable and the relist is a consistent read, else it would fail forever.
            ReflectorMetrics::inc(&self.metrics.relists_after_gone);
            warn!(reflector = %self.config.name, error = %error, %resource_version,
                "watch resourceVersion too large, relisting with a consistent read");
            Transition::AfterBackoff(State::List { rv_unavailable: true })
        } else if error.is_gone() {
            ReflectorMetrics::inc(&self.metrics.relists_after_gone);
            // As client-go: relist at the last resourceVersion first (served from the server's
            // watch cache, not etcd); only if that list is expired too is it a consistent read.
            info!(reflector = %self.config.name, error = %error, "watch expired, relisting");
            Transition::AfterBackoff(State::List { rv_unavailable: false })
        } else {
            warn!(
                reflector = %self.config.name,
                server = client::server_of(&error).map(tracing::field::display),
                error = %ErrorChain(&error),
                %resource_version,
                "watch failed: {}",
                failure(&error, &self.config.name),
            );
            Transition::AfterBackoff(State::Watch { resource_version })
        }
    }

    /// Hands the pending watch events to the store as one batch, then moves the reflector
    /// through their resourceVersions (the updater sees each, as client-go's per event).
    /// `false` when the store is a closed queue.
    fn apply_changes(
        &self,
        changes: &mut Vec<(DeltaType, Arc<K>)>,
        changes_rv: &mut Vec<String>,
        resource_version: &mut String,
    ) -> bool {
        if !changes.is_empty() {
            let batch = std::mem::take(changes);
            let count = batch.len() as u64;
            match self.store.apply_changes(batch) {
                Ok(skipped) => {
                    self.metrics
                        .events
                        .fetch_add(count - skipped.len() as u64, Ordering::Relaxed);
                    for e in skipped {
                        self.skip_malformed(&MalformedObject::new(e.to_string()));
                    }
                }
                Err(StoreError::Closed) => return false,
                Err(e) => self.skip_malformed(&MalformedObject::new(e.to_string())),
            }
        }
        for rv in changes_rv.drain(..) {
            self.synced_to(&rv);
            *resource_version = rv;
        }
        true
    }

    /// Moves the last-synced resourceVersion to `rv` and tells the updater.
    fn synced_to(&self, rv: &str) {
        self.last_sync_resource_version.set(rv);
        if let Some(updater) = &self.resource_version_updater {
            updater(rv);
        }
    }

    /// Applies events until the stream ends or fails (client-go `handleWatch`).
    ///
    /// `propagate_rv_from_start`: follow the resourceVersion from the first event; otherwise
    /// only once an event other than ADDED arrived (client-go `propagateRVFromStart` /
    /// `eventReceivedBesidesAdded`).
    async fn consume_watch(
        &self,
        stream: WatchStream<Arc<K>>,
        mut resource_version: String,
        started: Instant,
        propagate_rv_from_start: bool,
    ) -> Transition {
        let mut stream = stream.fuse();
        let mut events = 0u64;
        let mut event_received_besides_added = false;
        // The object events read so far and not yet handed to the store, and the
        // resourceVersions they move the reflector to, in order.
        let mut changes: Vec<(DeltaType, Arc<K>)> = Vec::new();
        let mut changes_rv: Vec<String> = Vec::new();
        while let Some(first) = stream.next().await {
            // Every event the stream has ready without waiting goes to the store as one batch.
            let mut batch = vec![first];
            while batch.len() < WATCH_BATCH_MAX {
                match stream.next().now_or_never() {
                    Some(Some(item)) => batch.push(item),
                    _ => break,
                }
            }
            for item in batch {
                let event = match item {
                    Ok(event) => event,
                    Err(ListWatchError::Malformed(m)) => {
                        let Some((key, undecodable)) = self.undecodable(&m) else {
                            continue;
                        };
                        // The events before it first: the store sees everything in order.
                        if !self.apply_changes(&mut changes, &mut changes_rv, &mut resource_version) {
                            return Transition::Stop;
                        }
                        let rv = undecodable.resource_version.clone();
                        let stored = if m.deleted {
                            event_received_besides_added = true;
                            self.store.delete_undecodable(key, &rv)
                        } else {
                            self.store.mark_undecodable(key, undecodable)
                        };
                        match stored {
                            Ok(()) => {}
                            Err(StoreError::Closed) => return Transition::Stop,
                            Err(e) => {
                                warn!(reflector = %self.config.name, error = %e, "store refused an undecodable object");
                            }
                        }
                        events += 1;
                        if !rv.is_empty() && (propagate_rv_from_start || event_received_besides_added) {
                            resource_version = rv;
                            self.synced_to(&resource_version);
                        }
                        continue;
                    }
                    Err(e) => {
                        if !self.apply_changes(&mut changes, &mut changes_rv, &mut resource_version) {
                            return Transition::Stop;
                        }
                        return self.after_watch_error(e, resource_version);
                    }
                };
                events += 1;
                let (obj, change) = match event {
                    WatchEvent::Added(obj) => (obj, DeltaType::Added),
                    WatchEvent::Modified(obj) => (obj, DeltaType::Updated),
                    WatchEvent::Deleted(obj) => (obj, DeltaType::Deleted),
                    WatchEvent::Bookmark(bookmark) => {
                        ReflectorMetrics::inc(&self.metrics.bookmarks);
                        let rv = bookmark.metadata.resource_version;
                        // A bookmark without a resourceVersion carries nothing; watching from ""
                        // later would replay current state and hide missed deletes.
                        if rv.is_empty() {
                            warn!(reflector = %self.config.name, "ignoring a bookmark without a resourceVersion");
                            continue;
                        }
                        event_received_besides_added = true;
                        // The events before it first: the store sees everything in order.
                        if !self.apply_changes(&mut changes, &mut changes_rv, &mut resource_version) {
                            return Transition::Stop;
                        }
                        // client-go ReflectorBookmarkStore: the store learns the rv in order.
                        match self.store.bookmark(&rv) {
                            Ok(()) => {}
                            Err(StoreError::Closed) => return Transition::Stop,
                            Err(e) => {
                                warn!(reflector = %self.config.name, error = %e, resource_version = %rv, "store refused a bookmark")
                            }
                        }
                        debug!(reflector = %self.config.name, resource_version = %rv, "bookmark");
                        resource_version = rv;
                        self.synced_to(&resource_version);
                        continue;
                    }
                    WatchEvent::Error(status) => {
                        if !self.apply_changes(&mut changes, &mut changes_rv, &mut resource_version) {
                            return Transition::Stop;
                        }
                        return self.after_watch_error(ListWatchError::from_status(&status), resource_version);
                    }
                };
                let new_rv = obj.meta().resource_version.clone();
                if change != DeltaType::Added {
                    event_received_besides_added = true;
                }
                changes.push((change, obj));
                // As client-go, an event's resourceVersion counts even if its object is then
                // skipped: the server has moved past it.
                if let Some(rv) = new_rv.filter(|rv| !rv.is_empty())
                    && (propagate_rv_from_start || event_received_besides_added)
                {
                    changes_rv.push(rv);
                }
            }
            if !self.apply_changes(&mut changes, &mut changes_rv, &mut resource_version) {
                return Transition::Stop;
            }
        }
        if events == 0 && started.elapsed() < Duration::from_secs(1) {
            // A watch that closes at once, over and over, would spin: treat it as a failure.
            warn!(reflector = %self.config.name, "watch closed within a second without events");
            return Transition::AfterBackoff(State::Watch { resource_version });
        }
        debug!(reflector = %self.config.name, events, "watch ended, re-watching");
        Transition::Now(State::Watch { resource_version })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use futures::future::BoxFuture;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::TypeMeta;
    use kube::core::watch::{Bookmark, BookmarkMeta};

    use super::*;
    use crate::listwatch::{ListPage, map_event};

    #[test]
    fn the_watch_timeout_is_drawn_from_min_to_twice_min_and_min_is_never_below_five_minutes() {
        for (configured, min) in [
            (Duration::ZERO, 300),
            (Duration::from_secs(1), 300),
            (Duration::from_secs(299), 300),
            (MIN_WATCH_TIMEOUT, 300),
            (Duration::from_secs(1200), 1200),
        ] {
            let draws: Vec<u32> = (0..10_000).map(|_| watch_timeout_seconds(configured)).collect();
            assert!(
                draws.iter().all(|t| (min..2 * min).contains(t)),
                "{configured:?}: {:?}..{:?}",
                draws.iter().min(),
                draws.iter().max()
            );
            // Spread over the range, not stuck at one end (client-go's jitter).
            assert!(draws.iter().any(|t| *t < min + min / 4), "{configured:?}");
            assert!(draws.iter().any(|t| *t >= 2 * min - min / 4), "{configured:?}");
        }
    }

    #[test]
    fn the_page_size_follows_client_go_list() {
        // Unset: the pager's default for "" and "0", none at a specific rv...
        assert_eq!(list_page_size(None, false, Some("0")), DEFAULT_PAGE_SIZE);
        assert_eq!(list_page_size(None, false, None), DEFAULT_PAGE_SIZE);
        assert_eq!(list_page_size(None, false, Some("42")), 0);
        // ... unless the first list came back in pages.
        assert_eq!(list_page_size(None, true, Some("42")), DEFAULT_PAGE_SIZE);
        // Set: every list, at any rv.
        for rv in [None, Some("0"), Some("42")] {
            assert_eq!(list_page_size(Some(7), false, rv), 7);
            assert_eq!(list_page_size(Some(0), true, rv), 0);
        }
    }

    /// The server is never reached in these tests: `consume_watch` is fed a stream directly.
    struct Unreachable;

    impl ListerWatcher<ConfigMap> for Unreachable {
        fn list(&self, _: &ListParams) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
            Box::pin(futures::future::pending())
        }

        fn watch(&self, _: &WatchParams, _: &str) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
            Box::pin(futures::future::pending())
        }
    }

    /// A server restored from an older backup, as a client that retries its `504`s sees it:
    /// lists and watches at a resourceVersion never answer; a consistent read answers at
    /// `current`. With `first_event_after`, a watch does answer, with one event after that long.
    struct RestoredServer {
        current: &'static str,
        first_event_after: Option<Duration>,
        /// The resourceVersion and limit of every list, in order.
        lists: Mutex<Vec<(Option<String>, Option<u32>)>>,
        /// Consistent reads to fail (with a 500) before one answers.
        failing_reads: Mutex<usize>,
    }

    impl RestoredServer {
        fn new(current: &'static str) -> Self {
            RestoredServer {
                current,
                first_event_after: None,
                lists: Mutex::new(Vec::new()),
                failing_reads: Mutex::new(0),
            }
        }
    }

    impl ListerWatcher<ConfigMap> for RestoredServer {
        fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
            self.lists
                .lock()
                .unwrap()
                .push((params.resource_version.clone(), params.limit));
            if params.resource_version.is_some() {
                return Box::pin(futures::future::pending());
            }
            let mut failing = self.failing_reads.lock().unwrap();
            if *failing > 0 {
                *failing -= 1;
                return Box::pin(async { Err(ListWatchError::api(500, "InternalError", "injected")) });
            }
            let page = ListPage {
                items: vec![cm("a", self.current)],
                resource_version: self.current.to_string(),
                ..ListPage::default()
            };
            Box::pin(async move { Ok(page) })
        }

        fn watch(&self, _: &WatchParams, _: &str) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
            match self.first_event_after {
                None => Box::pin(futures::future::pending()),
                Some(after) => {
                    let event = futures::stream::once(async move {
                        tokio::time::sleep(after).await;
                        Ok(WatchEvent::Modified(cm("a", "160")))
                    });
                    Box::pin(async move { Ok(event.boxed()) })
                }
            }
        }
    }

    /// Watches `server` (behind at 40) from "100"; asserts the watch ended in a consistent
    /// relist and returns the reflector and how long that took.
    async fn watch_from_100_on(server: &Arc<RestoredServer>) -> (Reflector<ConfigMap>, Duration) {
        let reflector = Reflector::new(server.clone(), Arc::new(Calls::default()), ReflectorConfig::default());
        let start = Instant::now();
        let transition = reflector.step_watch("100".into()).await;
        assert_eq!(
            transition,
            Transition::AfterBackoff(State::List { rv_unavailable: true })
        );
        (reflector, start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_unanswered_from_a_server_behind_it_relists_as_a_consistent_read() {
        let server = Arc::new(RestoredServer::new("40"));
        let (reflector, elapsed) = watch_from_100_on(&server).await;
        // Checked once, after the configured wait, with a consistent read of one object.
        assert_eq!(elapsed, DEFAULT_SERVER_BEHIND_CHECK);
        assert_eq!(*server.lists.lock().unwrap(), [(None, Some(1))]);
        assert_eq!(ReflectorMetrics::get(&reflector.metrics().server_behind_checks), 1);
        assert_eq!(ReflectorMetrics::get(&reflector.metrics().errors), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_that_fails_is_made_again_after_twice_the_wait() {
        let server = Arc::new(RestoredServer::new("40"));
        *server.failing_reads.lock().unwrap() = 2;
        let (reflector, elapsed) = watch_from_100_on(&server).await;
        assert_eq!(elapsed, DEFAULT_SERVER_BEHIND_CHECK * (1 + 2 + 4));
        assert_eq!(server.lists.lock().unwrap().len(), 3);
        assert_eq!(ReflectorMetrics::get(&reflector.metrics().server_behind_checks), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_watch_on_a_server_not_behind_it_goes_on() {
        let server = Arc::new(RestoredServer {
            first_event_after: Some(Duration::from_secs(30)),
            ..RestoredServer::new("150")
        });
        let store = Arc::new(Calls::default());
        let reflector = Reflector::new(server.clone(), store.clone(), ReflectorConfig::default());
        let transition = reflector.step_watch("100".into()).await;
        assert_eq!(store.take(), ["batch 1", "update 160"]);
        assert_eq!(
            transition,
            Transition::Now(State::Watch {
                resource_version: "160".into()
            })
        );
        assert_eq!(*server.lists.lock().unwrap(), [(None, Some(1))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_relist_unanswered_from_a_server_behind_it_is_done_as_a_consistent_read() {
        let server = Arc::new(RestoredServer::new("40"));
        let store = Arc::new(Calls::default());
        let reflector = Reflector::new(server.clone(), store.clone(), ReflectorConfig::default());
        reflector.last_sync_resource_version.set("100");
        let transition = reflector.step_list(false, &mut Memory::default()).await;
        assert_eq!(store.take(), ["replace 40"]);
        assert_eq!(
            transition,
            Transition::Now(State::Watch {
                resource_version: "40".into()
            })
        );
        assert_eq!(
            *server.lists.lock().unwrap(),
            // The consistent read keeps the page size chosen for the rv first asked for (none).
            [(Some("100".into()), None), (None, Some(1)), (None, None)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_at_0_and_with_the_check_off_are_never_checked() {
        let server = Arc::new(RestoredServer::new("40"));
        let reflector = Reflector::new(
            server.clone(),
            Arc::new(Calls::default()),
            ReflectorConfig::default().server_behind_check(Duration::ZERO),
        );
        let unanswered = tokio::time::timeout(Duration::from_secs(600), reflector.step_watch("100".into())).await;
        assert!(unanswered.is_err());
        let reflector = Reflector::new(server.clone(), Arc::new(Calls::default()), ReflectorConfig::default());
        let unanswered = tokio::time::timeout(Duration::from_secs(600), reflector.step_watch("0".into())).await;
        assert!(unanswered.is_err());
        assert!(server.lists.lock().unwrap().is_empty());
    }

    /// Records the calls a reflector makes on its store.
    /// Every store call in order; `apply_changes` is recorded as `batch N` followed by its
    /// changes, so tests see where the reflector cut its batches.
    #[derive(Default)]
    struct Calls(Mutex<Vec<String>>);

    impl Calls {
        fn push(&self, call: String) -> Result<(), StoreError> {
            self.0.lock().unwrap().push(call);
            Ok(())
        }

        fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    fn rv_of(obj: &ConfigMap) -> String {
        obj.metadata.resource_version.clone().unwrap_or_default()
    }

    impl Store<ConfigMap> for Calls {
        fn add(&self, obj: Arc<ConfigMap>) -> Result<(), StoreError> {
            self.push(format!("add {}", rv_of(&obj)))
        }
        fn update(&self, obj: Arc<ConfigMap>) -> Result<(), StoreError> {
            self.push(format!("update {}", rv_of(&obj)))
        }
        fn delete(&self, obj: Arc<ConfigMap>) -> Result<(), StoreError> {
            self.push(format!("delete {}", rv_of(&obj)))
        }
        fn replace(&self, _: Vec<Arc<ConfigMap>>, rv: &str) -> Result<(), StoreError> {
            self.push(format!("replace {rv}"))
        }
        fn resync(&self) -> Result<(), StoreError> {
            Ok(())
        }
        fn bookmark(&self, rv: &str) -> Result<(), StoreError> {
            self.push(format!("bookmark {rv}"))
        }
        fn apply_changes(
            &self,
            changes: Vec<(DeltaType, Arc<ConfigMap>)>,
        ) -> Result<Vec<crate::store::KeyError>, StoreError> {
            self.push(format!("batch {}", changes.len()))?;
            for (kind, obj) in changes {
                match kind {
                    DeltaType::Deleted => self.delete(obj)?,
                    DeltaType::Updated => self.update(obj)?,
                    _ => self.add(obj)?,
                }
            }
            Ok(Vec::new())
        }
    }

    fn cm(name: &str, rv: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.resource_version = Some(rv.into());
        cm
    }

    fn bookmark(rv: &str) -> WatchEvent<ConfigMap> {
        WatchEvent::Bookmark(Bookmark {
            types: TypeMeta {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
            },
            metadata: BookmarkMeta {
                resource_version: rv.into(),
                annotations: BTreeMap::new(),
            },
        })
    }

    /// Feeds `events` to a reflector's watch loop from `from`; returns the store's calls, the
    /// resourceVersions the updater saw, the last-synced resourceVersion and the transition.
    async fn watch(
        from: &str,
        propagate_rv_from_start: bool,
        events: Vec<WatchEvent<ConfigMap>>,
    ) -> (Vec<String>, Vec<String>, String, Transition) {
        let store = Arc::new(Calls::default());
        let updates = Arc::new(Mutex::new(Vec::new()));
        let reflector = Reflector::new(Arc::new(Unreachable), store.clone(), ReflectorConfig::default())
            .with_resource_version_updater({
                let updates = updates.clone();
                Arc::new(move |rv: &str| updates.lock().unwrap().push(rv.to_string()))
            });
        let stream = futures::stream::iter(events.into_iter().map(|e| Ok(map_event(e, Arc::new)))).boxed();
        let transition = reflector
            .consume_watch(stream, from.to_string(), Instant::now(), propagate_rv_from_start)
            .await;
        let updates = updates.lock().unwrap().clone();
        (
            store.take(),
            updates,
            reflector.last_sync_resource_version(),
            transition,
        )
    }

    #[tokio::test]
    async fn from_a_set_resource_version_every_event_moves_it_and_bookmarks_reach_the_store() {
        // client-go's TestReflectorResourceVersionUpdate.
        let events = vec![
            WatchEvent::Added(cm("a", "10")),
            WatchEvent::Modified(cm("a", "20")),
            bookmark("30"),
            WatchEvent::Deleted(cm("a", "40")),
        ];
        let (calls, updates, last, transition) = watch("5", true, events).await;
        assert_eq!(
            calls,
            ["batch 2", "add 10", "update 20", "bookmark 30", "batch 1", "delete 40"]
        );
        assert_eq!(updates, ["10", "20", "30", "40"]);
        assert_eq!(last, "40");
        assert_eq!(
            transition,
            Transition::Now(State::Watch {
                resource_version: "40".into()
            })
        );
    }

    #[tokio::test]
    async fn from_0_synthetic_adds_do_not_move_the_resource_version_until_another_event() {
        let events = vec![
            WatchEvent::Added(cm("b", "12")),
            WatchEvent::Added(cm("a", "7")),
            WatchEvent::Modified(cm("a", "13")),
            WatchEvent::Added(cm("c", "14")),
        ];
        let (calls, updates, _, transition) = watch("0", false, events).await;
        assert_eq!(calls, ["batch 4", "add 12", "add 7", "update 13", "add 14"]);
        assert_eq!(updates, ["13", "14"]);
        assert_eq!(
            transition,
            Transition::Now(State::Watch {
                resource_version: "14".into()
            })
        );

        // Only ADDED: the next watch starts at "0" again, as client-go's.
        let (_, updates, _, transition) = watch("0", false, vec![WatchEvent::Added(cm("b", "12"))]).await;
        assert!(updates.is_empty(), "{updates:?}");
        assert_eq!(
            transition,
            Transition::Now(State::Watch {
                resource_version: "0".into()
            })
        );

        // A bookmark also ends the synthetic phase.
        let events = vec![
            WatchEvent::Added(cm("b", "12")),
            bookmark("15"),
            WatchEvent::Added(cm("d", "16")),
        ];
        let (calls, updates, _, _) = watch("", false, events).await;
        assert_eq!(calls, ["batch 1", "add 12", "bookmark 15", "batch 1", "add 16"]);
        assert_eq!(updates, ["15", "16"]);
    }

    #[tokio::test]
    async fn events_ready_together_reach_the_store_as_one_batch_and_an_error_applies_those_before_it() {
        let store = Arc::new(Calls::default());
        let reflector = Reflector::new(Arc::new(Unreachable), store.clone(), ReflectorConfig::default());
        // Two events ready at once, then one the stream has only after yielding (a later read
        // from the connection), then a 410 ERROR ready together with the event before it.
        let later = |events: Vec<WatchEvent<ConfigMap>>| {
            futures::stream::once(async {
                tokio::task::yield_now().await;
            })
            .flat_map(move |()| futures::stream::iter(events.clone()))
        };
        let gone = WatchEvent::Error(Box::new(
            kube::core::Status::failure("too old resource version", "Expired").with_code(410),
        ));
        let stream = futures::stream::iter(vec![
            WatchEvent::Added(cm("a", "10")),
            WatchEvent::Modified(cm("a", "11")),
        ])
        .chain(later(vec![WatchEvent::Modified(cm("a", "12"))]))
        .chain(later(vec![WatchEvent::Deleted(cm("a", "13")), gone]))
        .map(|e| Ok(map_event(e, Arc::new)))
        .boxed();
        let transition = reflector.consume_watch(stream, "9".into(), Instant::now(), true).await;
        assert_eq!(
            store.take(),
            [
                "batch 2",
                "add 10",
                "update 11",
                "batch 1",
                "update 12",
                "batch 1",
                "delete 13"
            ]
        );
        assert_eq!(reflector.last_sync_resource_version(), "13");
        assert!(
            matches!(transition, Transition::AfterBackoff(State::List { .. })),
            "{transition:?}"
        );
    }

    #[tokio::test]
    async fn a_bookmark_without_a_resource_version_is_ignored() {
        let (calls, updates, _, transition) = watch("5", true, vec![bookmark(""), bookmark("9")]).await;
        assert_eq!(calls, ["bookmark 9"]);
        assert_eq!(updates, ["9"]);
        assert_eq!(
            transition,
            Transition::Now(State::Watch {
                resource_version: "9".into()
            })
        );
    }
}
