//! Controller metrics with controller-runtime's names and labels, so dashboards and alerts
//! written for Go controllers work unchanged.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `controller_runtime_reconcile_total` | counter | `controller`, `result` (`success`, `error`, `requeue`, `requeue_after`) |
//! | `controller_runtime_reconcile_errors_total` | counter | `controller` |
//! | `controller_runtime_terminal_reconcile_errors_total` | counter | `controller` |
//! | `controller_runtime_reconcile_panics_total` | counter | `controller` |
//! | `controller_runtime_reconcile_timeouts_total` | counter | `controller` |
//! | `controller_runtime_reconcile_time_seconds` | histogram | `controller` |
//! | `controller_runtime_max_concurrent_reconciles` | gauge | `controller` |
//! | `controller_runtime_active_workers` | gauge | `controller` |
//! | `kinformer_controller_dropped_keys_total` | counter | `controller` |
//!
//! The last one is kinformer's: keys a controller accepted but did not reconcile before it
//! stopped (see [`Controller`](crate::Controller)'s shutdown). The work queue of each
//! controller exports client-go's `workqueue_*` series labelled `name=<controller>`.
//!
//! One [`Metrics`] per Prometheus registry: the families are registered once and every
//! controller gets its own labelled series. The [`Manager`](crate::Manager) makes one for its
//! registry; a standalone controller makes its own registry unless given a `Metrics`.

use std::sync::Arc;

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use workqueue::PrometheusMetricsProvider;

/// The reconcile-time buckets of controller-runtime (5 ms to 60 s).
const RECONCILE_TIME_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5,
    1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
];

/// The controller and work queue metric families of one Prometheus registry. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    reconcile_panics: IntCounterVec,
    terminal_reconcile_errors: IntCounterVec,
    reconcile_timeouts: IntCounterVec,
    reconcile_time: HistogramVec,
    max_concurrent_reconciles: IntGaugeVec,
    active_workers: IntGaugeVec,
    dropped_keys: IntCounterVec,
    workqueue: Arc<PrometheusMetricsProvider>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers the controller and work queue metric families in `registry`.
    ///
    /// # Errors
    /// If `registry` already holds one of these families (make one `Metrics` per registry and
    /// clone it).
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        const CONTROLLER: &[&str] = &["controller"];
        let workqueue = PrometheusMetricsProvider::new(registry).map_err(|e| prometheus::Error::Msg(e.to_string()))?;
        let metrics = Metrics {
            registry: registry.clone(),
            reconcile_total: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_total",
                    "Total number of reconciliations per controller",
                ),
                &["controller", "result"],
            )?,
            reconcile_errors: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_errors_total",
                    "Total number of reconciliation errors per controller",
                ),
                CONTROLLER,
            )?,
            reconcile_panics: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_panics_total",
                    "Total number of reconciliation panics per controller",
                ),
                CONTROLLER,
            )?,
            terminal_reconcile_errors: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_terminal_reconcile_errors_total",
                    "Total number of terminal reconciliation errors per controller",
                ),
                CONTROLLER,
            )?,
            reconcile_timeouts: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_timeouts_total",
                    "Total number of reconciliation timeouts per controller",
                ),
                CONTROLLER,
            )?,
            reconcile_time: HistogramVec::new(
                HistogramOpts::new(
                    "controller_runtime_reconcile_time_seconds",
                    "Length of time per reconciliation per controller",
                )
                .buckets(RECONCILE_TIME_BUCKETS.to_vec()),
                CONTROLLER,
            )?,
            max_concurrent_reconciles: IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_max_concurrent_reconciles",
                    "Maximum number of concurrent reconciles per controller",
                ),
                CONTROLLER,
            )?,
            active_workers: IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_active_workers",
                    "Number of currently used workers per controller",
                ),
                CONTROLLER,
            )?,
            dropped_keys: IntCounterVec::new(
                Opts::new(
                    "kinformer_controller_dropped_keys_total",
                    "Keys accepted by a controller and not reconciled before it stopped",
                ),
                CONTROLLER,
            )?,
            workqueue: Arc::new(workqueue),
        };
        registry.register(Box::new(metrics.reconcile_total.clone()))?;
        registry.register(Box::new(metrics.reconcile_errors.clone()))?;
        registry.register(Box::new(metrics.reconcile_panics.clone()))?;
        registry.register(Box::new(metrics.terminal_reconcile_errors.clone()))?;
        registry.register(Box::new(metrics.reconcile_timeouts.clone()))?;
        registry.register(Box::new(metrics.reconcile_time.clone()))?;
        registry.register(Box::new(metrics.max_concurrent_reconciles.clone()))?;
        registry.register(Box::new(metrics.active_workers.clone()))?;
        registry.register(Box::new(metrics.dropped_keys.clone()))?;
        Ok(metrics)
    }

    /// The registry the families are registered in.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The work queue metrics provider of this registry.
    pub fn workqueue_provider(&self) -> Arc<PrometheusMetricsProvider> {
        self.workqueue.clone()
    }

    /// The registry's metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# error encoding metrics: {e}\n"))
    }

    /// The series of one controller, resolved once so the reconcile path does no label lookups.
    pub(crate) fn for_controller(&self, name: &str) -> ControllerMetrics {
        let result = |r: &str| self.reconcile_total.with_label_values(&[name, r]);
        ControllerMetrics {
            success: result("success"),
            error: result("error"),
            requeue: result("requeue"),
            requeue_after: result("requeue_after"),
            errors: self.reconcile_errors.with_label_values(&[name]),
            panics: self.reconcile_panics.with_label_values(&[name]),
            terminal_errors: self.terminal_reconcile_errors.with_label_values(&[name]),
            timeouts: self.reconcile_timeouts.with_label_values(&[name]),
            time: self.reconcile_time.with_label_values(&[name]),
            max_concurrent_reconciles: self.max_concurrent_reconciles.with_label_values(&[name]),
            active_workers: self.active_workers.with_label_values(&[name]),
            dropped_keys: self.dropped_keys.with_label_values(&[name]),
        }
    }
}

/// One controller's series.
#[derive(Clone)]
pub(crate) struct ControllerMetrics {
    pub(crate) success: IntCounter,
    pub(crate) error: IntCounter,
    pub(crate) requeue: IntCounter,
    pub(crate) requeue_after: IntCounter,
    pub(crate) errors: IntCounter,
    pub(crate) panics: IntCounter,
    pub(crate) terminal_errors: IntCounter,
    pub(crate) timeouts: IntCounter,
    pub(crate) time: prometheus::Histogram,
    pub(crate) max_concurrent_reconciles: IntGauge,
    pub(crate) active_workers: IntGauge,
    pub(crate) dropped_keys: IntCounter,
}

/// Where an [`InformerCollector`] reads its figures: the informers' stats at scrape time.
pub type InformerStatsSource = Arc<dyn Fn() -> Vec<informer_core::InformerStats> + Send + Sync>;

/// Exports informer and listener figures at scrape time (no cost on the data path):
///
/// | metric | type | labels |
/// |---|---|---|
/// | `kinformer_informer_synced` | gauge (0/1) | `informer` |
/// | `kinformer_informer_cached_objects` | gauge | `informer` |
/// | `kinformer_informer_undecodable_objects` | gauge | `informer`, `reason` |
/// | `kinformer_reflector_lists_total` | counter | `informer` |
/// | `kinformer_reflector_relists_after_gone_total` | counter | `informer` |
/// | `kinformer_reflector_watches_total` | counter | `informer` |
/// | `kinformer_reflector_events_total` | counter | `informer` |
/// | `kinformer_reflector_errors_total` | counter | `informer` |
/// | `kinformer_reflector_malformed_objects_total` | counter | `informer` |
/// | `kinformer_reflector_bookmarks_total` | counter | `informer` |
/// | `kinformer_informer_listener_pending` | gauge | `informer`, `handler` |
/// | `kinformer_informer_listener_delivered_total` | counter | `informer`, `handler` |
/// | `kinformer_informer_listener_handler_panics_total` | counter | `informer`, `handler` |
/// | `kinformer_informer_listener_coalesced_total` | counter | `informer`, `handler` |
///
/// The [`Manager`](crate::Manager) registers one over its factory; `handler` is the
/// registration's name (a controller's handlers are named after the controller).
/// `kinformer_informer_undecodable_objects` counts the objects the server has that do not decode
/// as the informer's type, kept in its cache as undecodable (see
/// [`informer_core::undecodable`]), by `reason` (`unknown variant`, `invalid type`, ...); an
/// informer with none has no series.
pub struct InformerCollector {
    source: InformerStatsSource,
    informer_gauges: Vec<(&'static str, &'static str)>,
    informer_counters: Vec<(&'static str, &'static str)>,
    listener_gauges: Vec<(&'static str, &'static str)>,
    listener_counters: Vec<(&'static str, &'static str)>,
    descs: Vec<prometheus::core::Desc>,
}

impl std::fmt::Debug for InformerCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InformerCollector").finish_non_exhaustive()
    }
}

const INFORMER_GAUGES: &[(&str, &str)] = &[
    (
        "kinformer_informer_synced",
        "Whether the informer's initial list has been processed into its cache (1) or not (0).",
    ),
    ("kinformer_informer_cached_objects", "Objects in the informer's cache."),
];
const INFORMER_COUNTERS: &[(&str, &str)] = &[
    (
        "kinformer_reflector_lists_total",
        "Completed lists (initial and relists).",
    ),
    (
        "kinformer_reflector_relists_after_gone_total",
        "Relists forced by a 410 Gone/Expired.",
    ),
    ("kinformer_reflector_watches_total", "Watch requests made."),
    ("kinformer_reflector_events_total", "Watch events applied."),
    ("kinformer_reflector_errors_total", "List and watch errors."),
    (
        "kinformer_reflector_malformed_objects_total",
        "Objects that did not decode or had no name, each time one arrived.",
    ),
    ("kinformer_reflector_bookmarks_total", "Watch bookmarks received."),
];
const UNDECODABLE_OBJECTS: (&str, &str) = (
    "kinformer_informer_undecodable_objects",
    "Objects the server has that do not decode as the informer's type, kept in its cache as undecodable, by reason.",
);
const LISTENER_GAUGES: &[(&str, &str)] = &[(
    "kinformer_informer_listener_pending",
    "Notifications waiting in a handler's buffer.",
)];
const LISTENER_COUNTERS: &[(&str, &str)] = &[
    (
        "kinformer_informer_listener_delivered_total",
        "Notifications handed to a handler.",
    ),
    (
        "kinformer_informer_listener_handler_panics_total",
        "Notifications lost because a handler panicked.",
    ),
    (
        "kinformer_informer_listener_coalesced_total",
        "Notifications folded into others because a handler's buffer passed its bound.",
    ),
];

impl InformerCollector {
    /// A collector reading `source` at every scrape.
    ///
    /// # Errors
    /// Never for the fixed names and labels used here; the `Result` is prometheus' own.
    pub fn new(source: InformerStatsSource) -> Result<Self, prometheus::Error> {
        let mut descs = Vec::new();
        for (name, help) in INFORMER_GAUGES.iter().chain(INFORMER_COUNTERS) {
            descs.push(prometheus::core::Desc::new(
                (*name).into(),
                (*help).into(),
                vec!["informer".into()],
                Default::default(),
            )?);
        }
        for (name, help) in LISTENER_GAUGES.iter().chain(LISTENER_COUNTERS) {
            descs.push(prometheus::core::Desc::new(
                (*name).into(),
                (*help).into(),
                vec!["informer".into(), "handler".into()],
                Default::default(),
            )?);
        }
        descs.push(prometheus::core::Desc::new(
            UNDECODABLE_OBJECTS.0.into(),
            UNDECODABLE_OBJECTS.1.into(),
            vec!["informer".into(), "reason".into()],
            Default::default(),
        )?);
        Ok(InformerCollector {
            source,
            informer_gauges: INFORMER_GAUGES.to_vec(),
            informer_counters: INFORMER_COUNTERS.to_vec(),
            listener_gauges: LISTENER_GAUGES.to_vec(),
            listener_counters: LISTENER_COUNTERS.to_vec(),
            descs,
        })
    }
}

/// The value of an informer-level family for `s`.
fn informer_value(name: &str, s: &informer_core::InformerStats) -> u64 {
    match name {
        "kinformer_informer_synced" => u64::from(s.synced),
        "kinformer_informer_cached_objects" => s.cached_objects as u64,
        "kinformer_reflector_lists_total" => s.lists,
        "kinformer_reflector_relists_after_gone_total" => s.relists_after_gone,
        "kinformer_reflector_watches_total" => s.watches,
        "kinformer_reflector_events_total" => s.events,
        "kinformer_reflector_errors_total" => s.errors,
        "kinformer_reflector_malformed_objects_total" => s.malformed_objects,
        "kinformer_reflector_bookmarks_total" => s.bookmarks,
        _ => 0,
    }
}

/// The value of a listener-level family for `l`.
fn listener_value(name: &str, l: &informer_core::ListenerStats) -> u64 {
    match name {
        "kinformer_informer_listener_pending" => l.pending as u64,
        "kinformer_informer_listener_delivered_total" => l.delivered,
        "kinformer_informer_listener_handler_panics_total" => l.handler_panics,
        "kinformer_informer_listener_coalesced_total" => l.coalesced,
        _ => 0,
    }
}

impl prometheus::core::Collector for InformerCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let stats = (self.source)();
        let mut families = Vec::new();
        // Fresh, unregistered vectors filled from the snapshot: a removed informer or handler
        // simply stops appearing. A family with no series is left out: the text encoder refuses one.
        let mut add = |collector: &dyn prometheus::core::Collector| {
            families.extend(collector.collect().into_iter().filter(|f| !f.get_metric().is_empty()));
        };
        for (name, help) in &self.informer_gauges {
            if let Ok(vec) = IntGaugeVec::new(Opts::new(*name, *help), &["informer"]) {
                for s in &stats {
                    vec.with_label_values(&[s.informer.as_str()])
                        .set(i64::try_from(informer_value(name, s)).unwrap_or(i64::MAX));
                }
                add(&vec);
            }
        }
        for (name, help) in &self.informer_counters {
            if let Ok(vec) = IntCounterVec::new(Opts::new(*name, *help), &["informer"]) {
                for s in &stats {
                    vec.with_label_values(&[s.informer.as_str()])
                        .inc_by(informer_value(name, s));
                }
                add(&vec);
            }
        }
        if let Ok(vec) = IntGaugeVec::new(
            Opts::new(UNDECODABLE_OBJECTS.0, UNDECODABLE_OBJECTS.1),
            &["informer", "reason"],
        ) {
            for s in &stats {
                for (reason, count) in &s.undecodable_objects {
                    vec.with_label_values(&[s.informer.as_str(), reason])
                        .set(i64::try_from(*count).unwrap_or(i64::MAX));
                }
            }
            add(&vec);
        }
        for (name, help) in &self.listener_gauges {
            if let Ok(vec) = IntGaugeVec::new(Opts::new(*name, *help), &["informer", "handler"]) {
                for s in &stats {
                    for l in &s.listeners {
                        vec.with_label_values(&[s.informer.as_str(), l.handler.as_str()])
                            .set(i64::try_from(listener_value(name, l)).unwrap_or(i64::MAX));
                    }
                }
                add(&vec);
            }
        }
        for (name, help) in &self.listener_counters {
            if let Ok(vec) = IntCounterVec::new(Opts::new(*name, *help), &["informer", "handler"]) {
                for s in &stats {
                    for l in &s.listeners {
                        vec.with_label_values(&[s.informer.as_str(), l.handler.as_str()])
                            .inc_by(listener_value(name, l));
                    }
                }
                add(&vec);
            }
        }
        families
    }
}
