//! The one metrics registry (Prometheus text on `GET /metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub webhook: &'static str,
    pub operation: &'static str,
    pub verdict: &'static str,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub webhook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub webhook: &'static str,
    pub mode: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<WebhookLabels, Histogram>,
    pub in_flight: Gauge,
    pub panics: Counter,
    pub shed: Counter,
    pub cert_reloads: Counter,
    pub cert_reload_errors: Counter,
    pub namespaces: Gauge,
    pub open_windows: Gauge,
    pub pinned_deployments: Gauge,
    /// 1 for each webhook's enforcement mode in force, 0 for the others.
    pub enforcement: Family<ModeLabels, Gauge>,
    pub exempt: Family<WebhookLabels, Counter>,
    pub config_reloads: Counter,
    pub config_reload_errors: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("handoff");
        let requests = Family::<RequestLabels, Counter>::default();
        // 50 µs to ~13 s: a decision takes microseconds, and a millisecond-granular
        // histogram would record every one of them as 0.
        let latency = Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 19))
        });
        let m = Metrics {
            requests,
            latency,
            in_flight: Gauge::default(),
            panics: Counter::default(),
            shed: Counter::default(),
            cert_reloads: Counter::default(),
            cert_reload_errors: Counter::default(),
            namespaces: Gauge::default(),
            open_windows: Gauge::default(),
            pinned_deployments: Gauge::default(),
            enforcement: Family::default(),
            exempt: Family::default(),
            config_reloads: Counter::default(),
            config_reload_errors: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "admission_requests",
            "AdmissionReview requests by webhook, operation, verdict (allow, deny, patch, error) and HTTP code",
            m.requests.clone(),
        );
        registry.register(
            "admission_duration_seconds",
            "Time from request received to response written, by webhook",
            m.latency.clone(),
        );
        registry.register(
            "in_flight_requests",
            "Requests being served",
            m.in_flight.clone(),
        );
        registry.register(
            "handler_panics",
            "Handler panics answered with 500",
            m.panics.clone(),
        );
        registry.register(
            "shed_requests",
            "Requests refused with 503 because the concurrency limit stayed full",
            m.shed.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Serving certificate reloads that took effect",
            m.cert_reloads.clone(),
        );
        registry.register(
            "certificate_reload_errors",
            "Serving certificate changes rejected (the last good pair stays)",
            m.cert_reload_errors.clone(),
        );
        registry.register(
            "namespace_cache_size",
            "Namespaces in the guard's cache",
            m.namespaces.clone(),
        );
        registry.register(
            "open_move_windows",
            "MoveWindows whose state is Open",
            m.open_windows.clone(),
        );
        registry.register(
            "pinned_deployments",
            "Deployments selected by an open MoveWindow",
            m.pinned_deployments.clone(),
        );
        registry.register(
            "enforcement_mode",
            "1 for the enforcement mode in force for each webhook (enforce, warn, audit), 0 for the others",
            m.enforcement.clone(),
        );
        registry.register(
            "exempt_requests",
            "Requests a rule would have denied or pinned that passed under a break-glass exemption",
            m.exempt.clone(),
        );
        registry.register(
            "config_reloads",
            "Config file changes that took effect",
            m.config_reloads.clone(),
        );
        registry.register(
            "config_reload_errors",
            "Config file changes refused (the settings in force stay)",
            m.config_reload_errors.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Publish the rollout in force.
    pub fn set_rollout(&self, r: &crate::policy::rollout::Rollout) {
        use crate::policy::rollout::Mode;
        for (webhook, mode) in [
            ("sync-finalizer", r.sync_finalizer),
            ("move-window", r.move_window),
        ] {
            for m in Mode::ALL {
                self.enforcement
                    .get_or_create(&ModeLabels {
                        webhook,
                        mode: m.as_str(),
                    })
                    .set(i64::from(m == mode));
            }
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
