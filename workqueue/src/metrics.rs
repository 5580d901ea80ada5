//! Work queue metrics: client-go's `MetricsProvider` and a Prometheus implementation.
//!
//! A queue records metrics only when it has a name *and* a provider (see
//! [`QueueConfig`](crate::QueueConfig)); an unnamed queue or one without a provider pays nothing,
//! like client-go's `noMetrics`. The Prometheus provider uses client-go's metric names and its
//! `name` label, so dashboards built for Go controllers work unchanged. `workqueue_depth` carries
//! a second label, `priority`, as controller-runtime's does: a [`PriorityQueue`](crate::PriorityQueue)
//! reports its depth per priority (`priority="-100"`, `priority="0"`), a plain queue with
//! `priority=""`. (controller-runtime also labels every series `controller`, with the queue's name
//! again; we do not repeat it.)
//!
//! | metric | type |
//! |---|---|
//! | `workqueue_depth` | gauge, also labelled `priority` |
//! | `workqueue_adds_total` | counter |
//! | `workqueue_queue_duration_seconds` | histogram |
//! | `workqueue_work_duration_seconds` | histogram |
//! | `workqueue_unfinished_work_seconds` | gauge |
//! | `workqueue_longest_running_processor_seconds` | gauge |
//! | `workqueue_retries_total` | counter |
//!
//! ```
//! use std::sync::Arc;
//! use workqueue::{PrometheusMetricsProvider, Queue, QueueConfig};
//!
//! let registry = prometheus::Registry::new();
//! let provider = PrometheusMetricsProvider::new(&registry)?;
//! let queue: Queue<String> =
//!     Queue::with_config(QueueConfig::default().name("pods").metrics_provider(Arc::new(provider)));
//! queue.add("default/nginx".to_owned());
//! let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather())?;
//! assert!(text.contains(r#"workqueue_depth{name="pods",priority=""} 1"#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Why the unfinished-work gauges are updated by a task
//!
//! `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds` depend on
//! the current time, not on queue events. client-go refreshes them every 500 ms from a ticker, and
//! its `MetricsProvider` hands out plain settable gauges, so a provider cannot compute them on
//! scrape. We keep that contract (any client-go-shaped provider works) and refresh them from a task
//! that a named queue spawns when it is created; the task stops when the queue shuts down or the
//! last handle is dropped. Queues without metrics spawn nothing.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
use tokio::time::Instant;

/// How often a named queue refreshes its unfinished-work gauges (client-go's
/// `defaultUnfinishedWorkUpdatePeriod`).
pub const UNFINISHED_WORK_UPDATE_PERIOD: Duration = Duration::from_millis(500);

/// A gauge that goes up and down by one (client-go's `GaugeMetric`).
pub trait GaugeMetric: Send + Sync {
    /// Adds one.
    fn inc(&self);
    /// Subtracts one.
    fn dec(&self);
}

/// A gauge set to an absolute value (client-go's `SettableGaugeMetric`).
pub trait SettableGaugeMetric: Send + Sync {
    /// Sets the value.
    fn set(&self, value: f64);
}

/// A monotonically increasing counter (client-go's `CounterMetric`).
pub trait CounterMetric: Send + Sync {
    /// Adds one.
    fn inc(&self);
}

/// A distribution of observed values (client-go's `HistogramMetric`).
pub trait HistogramMetric: Send + Sync {
    /// Records one observation.
    fn observe(&self, value: f64);
}

/// A gauge of queued items per priority (controller-runtime's `DepthMetricWithPriority`).
pub trait DepthWithPriorityMetric: Send + Sync {
    /// One more item queued at `priority`.
    fn inc(&self, priority: i32);
    /// One item fewer queued at `priority`.
    fn dec(&self, priority: i32);
}

/// Creates the metrics of one named queue (client-go's `MetricsProvider`).
///
/// Each method is called once per queue, with the queue's name, when the queue is created.
pub trait MetricsProvider: Send + Sync {
    /// The depth by priority of a [`PriorityQueue`](crate::PriorityQueue) (controller-runtime's
    /// `MetricsProviderWithPriority`). `None`, the default, makes a priority queue report its
    /// depth through [`new_depth_metric`](Self::new_depth_metric), all priorities together.
    fn new_depth_with_priority_metric(&self, name: &str) -> Option<Box<dyn DepthWithPriorityMetric>> {
        let _ = name;
        None
    }
    /// Number of items waiting to be handed out (`workqueue_depth`).
    fn new_depth_metric(&self, name: &str) -> Box<dyn GaugeMetric>;
    /// Number of accepted adds (`workqueue_adds_total`).
    fn new_adds_metric(&self, name: &str) -> Box<dyn CounterMetric>;
    /// Seconds an item waits between add and get (`workqueue_queue_duration_seconds`).
    fn new_latency_metric(&self, name: &str) -> Box<dyn HistogramMetric>;
    /// Seconds between get and done (`workqueue_work_duration_seconds`).
    fn new_work_duration_metric(&self, name: &str) -> Box<dyn HistogramMetric>;
    /// Sum of the ages of all items being processed (`workqueue_unfinished_work_seconds`).
    fn new_unfinished_work_seconds_metric(&self, name: &str) -> Box<dyn SettableGaugeMetric>;
    /// Age of the oldest item being processed (`workqueue_longest_running_processor_seconds`).
    fn new_longest_running_processor_seconds_metric(&self, name: &str) -> Box<dyn SettableGaugeMetric>;
    /// Number of delayed or rate-limited adds (`workqueue_retries_total`).
    fn new_retries_metric(&self, name: &str) -> Box<dyn CounterMetric>;
}

impl GaugeMetric for IntGauge {
    fn inc(&self) {
        IntGauge::inc(self);
    }
    fn dec(&self) {
        IntGauge::dec(self);
    }
}

impl SettableGaugeMetric for Gauge {
    fn set(&self, value: f64) {
        Gauge::set(self, value);
    }
}

impl CounterMetric for IntCounter {
    fn inc(&self) {
        IntCounter::inc(self);
    }
}

impl HistogramMetric for Histogram {
    fn observe(&self, value: f64) {
        Histogram::observe(self, value);
    }
}

/// Errors creating metrics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The registry refused a metric, typically because it is already registered.
    #[error("registering workqueue metrics: {0}")]
    Register(#[from] prometheus::Error),
}

/// A [`MetricsProvider`] registering client-go's workqueue metrics in a Prometheus registry.
///
/// Create one per registry and share it (it is cheap to clone) between all queues: the metric
/// families are registered once, and each queue gets the series labelled with its name.
#[derive(Clone, Debug)]
pub struct PrometheusMetricsProvider {
    depth: IntGaugeVec,
    adds: IntCounterVec,
    latency: HistogramVec,
    work_duration: HistogramVec,
    unfinished_work_seconds: GaugeVec,
    longest_running_processor: GaugeVec,
    retries: IntCounterVec,
}

impl PrometheusMetricsProvider {
    /// Registers the seven workqueue metric families in `registry`.
    ///
    /// # Errors
    /// If `registry` already holds a metric with one of these names.
    pub fn new(registry: &Registry) -> Result<Self, MetricsError> {
        const SUBSYSTEM: &str = "workqueue";
        const LABELS: &[&str] = &["name"];
        const DEPTH_LABELS: &[&str] = &["name", "priority"];
        let opts = |name: &str, help: &str| Opts::new(name, help).subsystem(SUBSYSTEM);
        // client-go: prometheus.ExponentialBuckets(10e-9, 10, 12), 10 ns up to 1000 s.
        let buckets = prometheus::exponential_buckets(10e-9, 10.0, 12)?;
        let histogram = |name: &str, help: &str| HistogramOpts::from(opts(name, help)).buckets(buckets.clone());

        let provider = Self {
            depth: IntGaugeVec::new(
                opts("depth", "Current depth of workqueue by workqueue and priority"),
                DEPTH_LABELS,
            )?,
            adds: IntCounterVec::new(opts("adds_total", "Total number of adds handled by workqueue"), LABELS)?,
            latency: HistogramVec::new(
                histogram(
                    "queue_duration_seconds",
                    "How long in seconds an item stays in workqueue before being requested.",
                ),
                LABELS,
            )?,
            work_duration: HistogramVec::new(
                histogram(
                    "work_duration_seconds",
                    "How long in seconds processing an item from workqueue takes.",
                ),
                LABELS,
            )?,
            unfinished_work_seconds: GaugeVec::new(
                opts(
                    "unfinished_work_seconds",
                    "How many seconds of work has done that is in progress and hasn't been \
                     observed by work_duration. Large values indicate stuck threads. One can \
                     deduce the number of stuck threads by observing the rate at which this \
                     increases.",
                ),
                LABELS,
            )?,
            longest_running_processor: GaugeVec::new(
                opts(
                    "longest_running_processor_seconds",
                    "How many seconds has the longest running processor for workqueue been \
                     running.",
                ),
                LABELS,
            )?,
            retries: IntCounterVec::new(
                opts("retries_total", "Total number of retries handled by workqueue"),
                LABELS,
            )?,
        };
        registry.register(Box::new(provider.depth.clone()))?;
        registry.register(Box::new(provider.adds.clone()))?;
        registry.register(Box::new(provider.latency.clone()))?;
        registry.register(Box::new(provider.work_duration.clone()))?;
        registry.register(Box::new(provider.unfinished_work_seconds.clone()))?;
        registry.register(Box::new(provider.longest_running_processor.clone()))?;
        registry.register(Box::new(provider.retries.clone()))?;
        Ok(provider)
    }
}

impl MetricsProvider for PrometheusMetricsProvider {
    fn new_depth_metric(&self, name: &str) -> Box<dyn GaugeMetric> {
        // No priority, as controller-runtime labels a plain queue's depth.
        Box::new(self.depth.with_label_values(&[name, ""]))
    }
    fn new_depth_with_priority_metric(&self, name: &str) -> Option<Box<dyn DepthWithPriorityMetric>> {
        Some(Box::new(PrometheusDepthWithPriority {
            depth: self.depth.clone(),
            name: name.to_owned(),
            series: std::sync::Mutex::new(Vec::new()),
            limit_reached: std::sync::atomic::AtomicBool::new(false),
        }))
    }
    fn new_adds_metric(&self, name: &str) -> Box<dyn CounterMetric> {
        Box::new(self.adds.with_label_values(&[name]))
    }
    fn new_latency_metric(&self, name: &str) -> Box<dyn HistogramMetric> {
        Box::new(self.latency.with_label_values(&[name]))
    }
    fn new_work_duration_metric(&self, name: &str) -> Box<dyn HistogramMetric> {
        Box::new(self.work_duration.with_label_values(&[name]))
    }
    fn new_unfinished_work_seconds_metric(&self, name: &str) -> Box<dyn SettableGaugeMetric> {
        Box::new(self.unfinished_work_seconds.with_label_values(&[name]))
    }
    fn new_longest_running_processor_seconds_metric(&self, name: &str) -> Box<dyn SettableGaugeMetric> {
        Box::new(self.longest_running_processor.with_label_values(&[name]))
    }
    fn new_retries_metric(&self, name: &str) -> Box<dyn CounterMetric> {
        Box::new(self.retries.with_label_values(&[name]))
    }
}

/// How many distinct priorities get a series of their own before every priority is reported as
/// [`PRIORITY_CARDINALITY_EXCEEDED`] (controller-runtime's `maxRecommendedUniquePriorities`).
pub const MAX_PRIORITY_SERIES: usize = 25;

/// The `priority` label of every depth series once more than [`MAX_PRIORITY_SERIES`]
/// priorities were seen (controller-runtime's placeholder).
pub const PRIORITY_CARDINALITY_EXCEEDED: &str = "exceeded_cardinality_limit";

/// [`PrometheusMetricsProvider`]'s depth by priority: one `workqueue_depth{name, priority}`
/// series per priority seen, cached so a hot queue does not format a label per add.
struct PrometheusDepthWithPriority {
    depth: IntGaugeVec,
    name: String,
    /// The series of each priority seen so far (at most `MAX_PRIORITY_SERIES`, so a linear
    /// search is as fast as a map).
    series: std::sync::Mutex<Vec<(i32, IntGauge)>>,
    /// More priorities than `MAX_PRIORITY_SERIES` were seen: every change goes to the
    /// placeholder series from then on, as controller-runtime's does.
    limit_reached: std::sync::atomic::AtomicBool,
}

impl PrometheusDepthWithPriority {
    fn gauge(&self, priority: i32) -> IntGauge {
        use std::sync::atomic::Ordering;
        if self.limit_reached.load(Ordering::Relaxed) {
            return self
                .depth
                .with_label_values(&[&self.name, PRIORITY_CARDINALITY_EXCEEDED]);
        }
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, gauge)) = series.iter().find(|(p, _)| *p == priority) {
            return gauge.clone();
        }
        if series.len() >= MAX_PRIORITY_SERIES {
            self.limit_reached.store(true, Ordering::Relaxed);
            series.clear();
            return self
                .depth
                .with_label_values(&[&self.name, PRIORITY_CARDINALITY_EXCEEDED]);
        }
        let gauge = self.depth.with_label_values(&[&self.name, &priority.to_string()]);
        series.push((priority, gauge.clone()));
        gauge
    }
}

impl DepthWithPriorityMetric for PrometheusDepthWithPriority {
    fn inc(&self, priority: i32) {
        self.gauge(priority).inc();
    }
    fn dec(&self, priority: i32) {
        self.gauge(priority).dec();
    }
}

/// The metrics of one named queue, fed by the queue under its lock (client-go's
/// `defaultQueueMetrics`).
///
/// Invariants: `add_times` holds the items that are dirty (added and not yet handed out), each
/// with the time of its first add; `processing_start_times` holds the items being processed.
pub(crate) struct QueueMetrics<T> {
    depth: Depth,
    adds: Box<dyn CounterMetric>,
    latency: Box<dyn HistogramMetric>,
    work_duration: Box<dyn HistogramMetric>,
    unfinished_work_seconds: Box<dyn SettableGaugeMetric>,
    longest_running_processor: Box<dyn SettableGaugeMetric>,
    retries: Box<dyn CounterMetric>,
    add_times: HashMap<T, Instant>,
    processing_start_times: HashMap<T, Instant>,
}

/// `workqueue_depth` of one queue: one gauge, or one per priority.
enum Depth {
    Plain(Box<dyn GaugeMetric>),
    ByPriority(Box<dyn DepthWithPriorityMetric>),
}

impl Depth {
    fn inc(&self, priority: i32) {
        match self {
            Depth::Plain(gauge) => gauge.inc(),
            Depth::ByPriority(gauge) => gauge.inc(priority),
        }
    }

    fn dec(&self, priority: i32) {
        match self {
            Depth::Plain(gauge) => gauge.dec(),
            Depth::ByPriority(gauge) => gauge.dec(priority),
        }
    }
}

impl<T: Clone + Eq + Hash> QueueMetrics<T> {
    /// The metrics of a plain queue.
    pub(crate) fn new(provider: &dyn MetricsProvider, name: &str) -> Self {
        Self::with_depth(provider, name, Depth::Plain(provider.new_depth_metric(name)))
    }

    /// The metrics of a priority queue: its depth by priority if the provider has such a metric.
    pub(crate) fn with_priorities(provider: &dyn MetricsProvider, name: &str) -> Self {
        let depth = match provider.new_depth_with_priority_metric(name) {
            Some(depth) => Depth::ByPriority(depth),
            None => Depth::Plain(provider.new_depth_metric(name)),
        };
        Self::with_depth(provider, name, depth)
    }

    fn with_depth(provider: &dyn MetricsProvider, name: &str, depth: Depth) -> Self {
        Self {
            depth,
            adds: provider.new_adds_metric(name),
            latency: provider.new_latency_metric(name),
            work_duration: provider.new_work_duration_metric(name),
            unfinished_work_seconds: provider.new_unfinished_work_seconds_metric(name),
            longest_running_processor: provider.new_longest_running_processor_seconds_metric(name),
            retries: provider.new_retries_metric(name),
            add_times: HashMap::new(),
            processing_start_times: HashMap::new(),
        }
    }

    /// An item became dirty.
    pub(crate) fn add(&mut self, item: &T) {
        self.add_at(item, 0);
    }

    /// An item became ready to hand out at `priority` (a plain queue's are all 0).
    pub(crate) fn add_at(&mut self, item: &T, priority: i32) {
        self.adds.inc();
        self.depth.inc(priority);
        self.add_times.entry(item.clone()).or_insert_with(Instant::now);
    }

    /// A ready item moved from priority `old` to `new`.
    pub(crate) fn reprioritize(&self, old: i32, new: i32) {
        self.depth.dec(old);
        self.depth.inc(new);
    }

    /// An item was handed to a worker.
    pub(crate) fn get(&mut self, item: &T) {
        self.get_at(item, 0);
    }

    /// An item of priority `priority` was handed to a worker.
    pub(crate) fn get_at(&mut self, item: &T, priority: i32) {
        let now = Instant::now();
        self.depth.dec(priority);
        self.processing_start_times.insert(item.clone(), now);
        if let Some(added) = self.add_times.remove(item) {
            self.latency.observe((now - added).as_secs_f64());
        }
    }

    /// A worker finished an item.
    pub(crate) fn done(&mut self, item: &T) {
        if let Some(started) = self.processing_start_times.remove(item) {
            self.work_duration.observe(started.elapsed().as_secs_f64());
        }
    }

    /// An item was scheduled for a later add.
    pub(crate) fn retry(&self) {
        self.retries.inc();
    }

    /// Recomputes the gauges that depend on the current time.
    pub(crate) fn update_unfinished_work(&self) {
        let now = Instant::now();
        let (total, oldest) = self
            .processing_start_times
            .values()
            .map(|started| (now - *started).as_secs_f64())
            .fold((0.0, 0.0_f64), |(total, oldest), age| (total + age, oldest.max(age)));
        self.unfinished_work_seconds.set(total);
        self.longest_running_processor.set(oldest);
    }
}
