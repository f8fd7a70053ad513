//! The one metrics registry (Prometheus text on `GET /metrics`).

use std::sync::atomic::AtomicU64;

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
pub struct DenialLabels {
    pub webhook: &'static str,
    /// The rule's machine-readable reason: a fixed set.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    pub watch: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WindowLabels {
    /// MoveWindows are few and named by operators: a bounded label.
    pub window: String,
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
    /// The served certificate's notAfter, Unix seconds.
    pub cert_expiry: Gauge<f64, AtomicU64>,
    /// When a certificate was last loaded (start-up or reload), Unix seconds.
    pub cert_last_reload: Gauge<f64, AtomicU64>,
    /// 1 from a rejected change of the certificate files until a good pair is loaded.
    pub cert_reload_failing: Gauge,
    pub denials: Family<DenialLabels, Counter>,
    /// Set at each scrape: how long ago the namespace cache was last proven current.
    pub namespaces_proven_age: Gauge<f64, AtomicU64>,
    pub namespaces_staleness_bound: Gauge<f64, AtomicU64>,
    /// Set at each scrape: how long each watch has been failing (0 while it is not).
    pub watch_failing: Family<WatchLabels, Gauge<f64, AtomicU64>>,
    pub watch_stale_after: Gauge<f64, AtomicU64>,
    pub window_opened: Family<WindowLabels, Gauge<f64, AtomicU64>>,
    pub window_held_leases: Family<WindowLabels, Gauge>,
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
            cert_expiry: Gauge::default(),
            cert_last_reload: Gauge::default(),
            cert_reload_failing: Gauge::default(),
            denials: Family::default(),
            namespaces_proven_age: Gauge::default(),
            namespaces_staleness_bound: Gauge::default(),
            watch_failing: Family::default(),
            watch_stale_after: Gauge::default(),
            window_opened: Family::default(),
            window_held_leases: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "admission_requests",
            "AdmissionReview requests by webhook, operation, verdict (allow, deny, patch, would-deny, would-pin, exempt, or error for a request that reached no decision) and HTTP code",
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
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, as Unix seconds",
            m.cert_expiry.clone(),
        );
        registry.register(
            "certificate_last_reload_timestamp_seconds",
            "When the serving certificate was last loaded (start-up or reload), as Unix seconds",
            m.cert_last_reload.clone(),
        );
        registry.register(
            "certificate_reload_failing",
            "1 from a rejected change of the serving certificate files until a good pair is loaded (the last good one serves meanwhile)",
            m.cert_reload_failing.clone(),
        );
        registry.register(
            "denials",
            "Requests denied (or, in warn and audit mode, that would be), by webhook and the rule's reason (state-unavailable, kcp-unavailable and deadline are handoff's own trouble)",
            m.denials.clone(),
        );
        registry.register(
            "namespace_cache_proven_age_seconds",
            "How long ago the namespace watch last proved the guard's cache current (+Inf: never); past --max-staleness a sync target's delete needs a fresh read",
            m.namespaces_proven_age.clone(),
        );
        registry.register(
            "namespace_cache_max_staleness_seconds",
            "--max-staleness: how old a namespace view may be before a sync target's delete needs a fresh read",
            m.namespaces_staleness_bound.clone(),
        );
        registry.register(
            "watch_failing_seconds",
            "How long each watch has been failing (0 while it is not); past --stale-after its cache is untrusted",
            m.watch_failing.clone(),
        );
        registry.register(
            "watch_stale_after_seconds",
            "--stale-after: how long a watch may fail before its cache is untrusted",
            m.watch_stale_after.clone(),
        );
        registry.register(
            "move_window_opened_timestamp_seconds",
            "When each open MoveWindow was opened (status.openedAt), as Unix seconds",
            m.window_opened.clone(),
        );
        registry.register(
            "move_window_held_leases",
            "Leader-election Leases each open MoveWindow holds",
            m.window_held_leases.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Register what the sources of state count (kcp, the policy parameter).
    pub fn register_telemetry(&mut self, t: &crate::state::telemetry::Telemetry) {
        let r = &mut self.registry;
        r.register(
            "kcp_reads",
            "Reads of kcp namespaces, by result",
            t.kcp_reads.clone(),
        );
        r.register(
            "kcp_read_duration_seconds",
            "Time a read of a kcp namespace took",
            t.kcp_read_duration.clone(),
        );
        r.register(
            "kcp_last_success_timestamp_seconds",
            "When a read of kcp last answered, as Unix seconds (0: never)",
            t.kcp_last_success.clone(),
        );
        r.register(
            "kcp_mirror_applies",
            "Server-side applies of kcp's sync finalizers onto physical namespaces, by result",
            t.kcp_mirror_applies.clone(),
        );
        r.register(
            "policy_params_publishes",
            "Attempts to keep the guard policy's parameter ConfigMap current, by result",
            t.policy_publishes.clone(),
        );
        r.register(
            "policy_params_last_success_timestamp_seconds",
            "When the parameter ConfigMap was last found current, made current, or found absent (the policy not installed), as Unix seconds (0: never)",
            t.policy_last_published.clone(),
        );
    }

    /// Set the gauges that are read at scrape time from the state.
    pub fn observe(&self, state: &crate::state::State) {
        use crate::state::WatchHealth;
        let windows = state.windows.snapshot();
        self.namespaces.set(state.namespaces.len() as i64);
        self.open_windows.set(windows.open.len() as i64);
        self.pinned_deployments
            .set(state.deployments.count_selected(&windows.open) as i64);
        let watches: [(&'static str, &WatchHealth, bool); 3] = [
            ("namespaces", &state.watches.namespaces, state.serving.guard),
            ("movewindows", &state.watches.windows, state.serving.pin),
            ("deployments", &state.watches.deployments, state.serving.pin),
        ];
        for (watch, h, served) in watches {
            if served {
                self.watch_failing
                    .get_or_create(&WatchLabels { watch })
                    .set(h.failing_for().map_or(0.0, |d| d.as_secs_f64()));
            }
        }
        if let Some(k) = state.kcp.as_ref().filter(|_| state.serving.guard) {
            self.watch_failing
                .get_or_create(&WatchLabels { watch: "kcp" })
                .set(k.health.failing_for().map_or(0.0, |d| d.as_secs_f64()));
        }
        self.watch_stale_after.set(state.stale_after.as_secs_f64());
        if state.serving.guard {
            self.namespaces_proven_age.set(
                state
                    .namespaces
                    .proven_ago()
                    .map_or(f64::INFINITY, |d| d.as_secs_f64()),
            );
            self.namespaces_staleness_bound
                .set(state.max_staleness.as_secs_f64());
        }
        // Windows come and go: only the open ones have series.
        self.window_opened.clear();
        self.window_held_leases.clear();
        for g in &windows.gauges {
            let l = WindowLabels {
                window: g.name.clone(),
            };
            if let Some(t) = g.opened_at {
                self.window_opened.get_or_create(&l).set(t as f64);
            }
            self.window_held_leases
                .get_or_create(&l)
                .set(g.held_leases as i64);
        }
    }

    /// Publish the rollout in force.
    pub fn set_rollout(&self, r: &crate::rules::rollout::Rollout) {
        use crate::rules::rollout::Mode;
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
