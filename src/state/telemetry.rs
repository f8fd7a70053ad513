//! What the sources of state count for `/metrics`: kcp reads and mirror applies, and the
//! admission policy's parameter publishing. The handles are Prometheus metric types (atomics);
//! `server::metrics` registers them, so this module needs no registry.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// `ok` or `error`.
    pub result: &'static str,
}

pub const OK: Outcome = Outcome { result: "ok" };
pub const ERROR: Outcome = Outcome { result: "error" };
/// A mirror apply refused because another field manager owns the annotation: by design.
pub const CONFLICT: Outcome = Outcome { result: "conflict" };

pub struct Telemetry {
    pub kcp_reads: Family<Outcome, Counter>,
    pub kcp_read_duration: Histogram,
    /// Unix seconds of the last read of kcp that answered (0: never).
    pub kcp_last_success: Gauge<f64, AtomicU64>,
    pub kcp_mirror_applies: Family<Outcome, Counter>,
    pub policy_publishes: Family<Outcome, Counter>,
    /// Unix seconds of the last time the parameter was found or made current (0: never).
    pub policy_last_published: Gauge<f64, AtomicU64>,
}

impl Default for Telemetry {
    fn default() -> Self {
        let t = Telemetry {
            kcp_reads: Family::default(),
            // 1 ms to ~16 s: a read of kcp crosses the network.
            kcp_read_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            kcp_last_success: Gauge::default(),
            kcp_mirror_applies: Family::default(),
            policy_publishes: Family::default(),
            policy_last_published: Gauge::default(),
        };
        // Both results from the start, so that a rate over them is 0 rather than absent.
        for o in [OK, ERROR] {
            let _ = t.kcp_reads.get_or_create(&o);
            let _ = t.kcp_mirror_applies.get_or_create(&o);
            let _ = t.policy_publishes.get_or_create(&o);
        }
        let _ = t.kcp_mirror_applies.get_or_create(&CONFLICT);
        t
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Telemetry")
    }
}

/// Now, as Unix seconds (what Prometheus' `time()` compares with).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
