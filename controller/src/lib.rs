//! controller: reconcilers fed by a rate-limited work queue through event handlers on
//! kinformer's shared informers, and a [`Manager`] that runs them with leader election,
//! `/metrics`, `/healthz` and `/readyz`.
//!
//! Where it sits in the data path: at the end of it.
//!
//! ```text
//! SharedInformerFactory ─▶ SharedIndexInformer<K> ─▶ handler (For / Owns / Watches + predicates)
//!                                                        │ enqueue ObjectKey
//!                                                        ▼
//!                          WorkQueue (priority) of ObjectKey ─▶ N workers ─▶ Reconciler::reconcile
//!                                                        ▲                  │
//!                                                        └── Action / Err ──┘ (forget, add_rate_limited, add_after)
//! ```
//!
//! A [`Controller`] registers its handlers on the factory's *shared* informers, so two
//! controllers of one type share one list/watch. See `ARCHITECTURE.md` for the design.
//!
//! - [`Controller`] (`builder.rs`): the builder (`for_resource`, `owns`, `watches`, each with
//!   [`SourceOptions`] for per-source predicates and cache, `reconcile_on` triggers,
//!   `with_event_filter`, `workers`, `rate_limiter`); [`BuiltController`] (`controller.rs`): the
//!   worker runtime; `source.rs`: the sources and handler registrations both use.
//! - [`Reconciler`], [`Action`], [`Context`] (`reconciler.rs`): what a controller calls.
//! - [`outcome`]: how a failed reconcile is treated: [`TerminalError`], [`RequeueAfterError`],
//!   [`ReconcileTimeout`], [`ReconcilePanic`], and the error policy.
//! - [`predicate`]: event filters; `handler.rs`: the handlers that enqueue keys, at
//!   [`LOW_PRIORITY`] for the initial list and resyncs; [`WorkQueue`] (`work_queue.rs`): the
//!   priority queue (or FIFO) they feed.
//! - [`Manager`] (`manager.rs`): runs controllers with leader election ([`LeaderElector`],
//!   `leader_election.rs`) and serves `/metrics` ([`Metrics`], `metrics.rs`), `/healthz`,
//!   `/readyz`.
//! - [`EventRecorder`] (`event_recorder.rs`): Kubernetes Events with client-go's aggregation.
//! - [`finalizer`](mod@finalizer) and [`controllerutil`]: reconcile helpers (kube-runtime's finalizer,
//!   controller-runtime's owner references, forced server-side apply, a status write only on change).
//! - [`Leadership`] (`leadership.rs`): whether this replica may still write as leader, by its
//!   local clock; reconcilers reach it through [`Context::ensure_leading`] and
//!   [`Context::token`], so a leader stopped past its lease and resumed writes nothing.
//! - [`rbac`] and [`manifests`]: the RBAC rules a controller's declared sources and writes
//!   need ([`Permissions`], [`Verb`]), and the manifests that deploy it (ServiceAccount, roles,
//!   Deployment with probes on the Manager's ports, CRDs).
//! - [`webhook`]: admission (validating, mutating) and conversion webhooks over HTTPS, served
//!   by the Manager ([`WebhookServer`]), and the configurations that register them.
//! - [`sharding`]: a controller sharded across replicas (shard Leases, a leader's sharder that
//!   labels objects, label-selector caches, handover without overlap).

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

mod builder;
pub mod controller;
pub mod controllerutil;
pub mod error_chain;
pub mod event_recorder;
pub mod finalizer;
mod handler;
pub mod healthz;
pub mod leader_election;
pub mod leadership;
pub mod manager;
pub mod manifests;
pub mod metrics;
mod object_key;
pub mod outcome;
pub mod predicate;
pub mod rbac;
mod reconciler;
pub mod runnable;
pub mod sharding;
mod source;
pub mod webhook;
mod work_queue;

pub use builder::{Controller, ControllerBuilder, SourceOptions};
pub use controller::{BuiltController, ControllerError, ErrorPolicy};
pub use controllerutil::{
    OwnerReferenceError, PatchError, apply, patch_status_if_changed, set_controller_reference, set_owner_reference,
};
pub use error_chain::{ErrorChain, stale_cache_race};
pub use event_recorder::{EventRecorder, EventRecorderConfig, EventRecorderStats, EventType, Reporter};
pub use finalizer::{Event as FinalizerEvent, FinalizerError, finalizer, has_finalizer};
pub use handler::{Enqueuer, MapFunc};
pub use leader_election::{
    LeaderCallbacks, LeaderElectionConfig, LeaderElectionError, LeaderElector, default_identity,
};
pub use leadership::{Leadership, NotLeader};
pub use manager::{Manager, ManagerBuilder, ManagerError, ManagerHandle, ManagerStatus};
pub use metrics::{InformerCollector, InformerStatsSource, Metrics};
pub use object_key::{ObjectKey, Request};
pub use outcome::{ReconcilePanic, ReconcileTimeout, RequeueAfterError, TerminalError, terminal};
pub use rbac::{Permissions, Verb};
pub use reconciler::{
    Action, BoxError, Context, FnReconciler, NotCached, Reconciler, UndecodableObject, reconciler_fn,
};
pub use runnable::{Runnable, RunnableFn, hostname, runnable_fn};
pub use webhook::{WebhookError, WebhookServer, WebhookServerConfig};
pub use work_queue::{LOW_PRIORITY, NORMAL_PRIORITY, WorkQueue};
