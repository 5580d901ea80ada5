//! The webhook server's metrics, with controller-runtime's names (`pkg/webhook/internal/metrics`),
//! so dashboards written for Go webhooks work unchanged.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `controller_runtime_webhook_requests_total` | counter | `webhook` (the path), `code` (the HTTP status code answered) |
//! | `controller_runtime_webhook_latency_seconds` | histogram | `webhook` |
//! | `controller_runtime_webhook_requests_in_flight` | gauge | `webhook` |
//! | `controller_runtime_webhook_panics_total` | counter | none |
//!
//! As in controller-runtime, `code` is the HTTP status of the response: an admission request
//! that was denied or failed is still answered `200` (the verdict is in the body). Requests to
//! a path with no webhook are not counted (controller-runtime's mux answers them before the
//! instrumented handler).

use std::time::Instant;

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

/// The webhook metric families of one registry. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct WebhookMetrics {
    requests_total: IntCounterVec,
    latency: HistogramVec,
    in_flight: IntGaugeVec,
    panics: IntCounter,
}

impl WebhookMetrics {
    /// Registers the families in `registry`.
    pub(crate) fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = WebhookMetrics {
            requests_total: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_webhook_requests_total",
                    "Total number of admission requests by HTTP status code.",
                ),
                &["webhook", "code"],
            )?,
            latency: HistogramVec::new(
                HistogramOpts::new(
                    "controller_runtime_webhook_latency_seconds",
                    "Histogram of the latency of processing admission requests",
                ),
                &["webhook"],
            )?,
            in_flight: IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_webhook_requests_in_flight",
                    "Current number of admission requests being served.",
                ),
                &["webhook"],
            )?,
            panics: IntCounter::new(
                "controller_runtime_webhook_panics_total",
                "Total number of webhook panics",
            )?,
        };
        registry.register(Box::new(metrics.requests_total.clone()))?;
        registry.register(Box::new(metrics.latency.clone()))?;
        registry.register(Box::new(metrics.in_flight.clone()))?;
        registry.register(Box::new(metrics.panics.clone()))?;
        Ok(metrics)
    }

    /// Counts a request in flight until the returned guard is finished or dropped.
    pub(crate) fn start(&self, webhook: &str) -> InFlight {
        let gauge = self.in_flight.with_label_values(&[webhook]);
        gauge.inc();
        InFlight {
            metrics: self.clone(),
            webhook: webhook.to_owned(),
            gauge,
            started: Instant::now(),
        }
    }

    pub(crate) fn panicked(&self) {
        self.panics.inc();
    }
}

/// One request in flight; [`finish`](Self::finish) records its status and latency.
pub(crate) struct InFlight {
    metrics: WebhookMetrics,
    webhook: String,
    gauge: prometheus::IntGauge,
    started: Instant,
}

impl InFlight {
    pub(crate) fn finish(self, code: u16) {
        self.metrics
            .latency
            .with_label_values(&[&self.webhook])
            .observe(self.started.elapsed().as_secs_f64());
        self.metrics
            .requests_total
            .with_label_values(&[self.webhook.as_str(), &code.to_string()])
            .inc();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
