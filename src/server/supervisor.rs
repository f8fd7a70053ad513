//! The supervisor: everything `handoff serve` runs beside its listener, owned in one place
//! and stopped together when the server returns. The kube watches that feed the caches, the
//! kcp watch and mirror, the guard's publishing of its identities for the admission policy,
//! the serving certificate's reload and the config file's. The server only serves.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::metrics::Metrics;
use super::tls::CertStore;
use crate::admission_policy::ParamsRef;
use crate::config::{ConfigFile, InvalidConfig};
use crate::state::State;

/// How often the kcp mirror compares each located namespace with its kcp namespace.
const KCP_MIRROR_EVERY: Duration = Duration::from_secs(2);

/// What the background work needs beside the state, the cluster and the metrics.
pub struct Background {
    pub cert_store: Arc<CertStore>,
    pub cert_reload_interval: Duration,
    /// Followed for enforcement modes and exemptions (`watch_config`).
    pub config_file: Option<PathBuf>,
    pub policy_params: ParamsRef,
    pub policy_publish_interval: Duration,
}

/// The running background tasks; dropped, they stop.
pub struct Supervisor {
    _tasks: tokio::task::JoinSet<()>,
}

impl Supervisor {
    /// Start what the state's sources and `b` ask for: each task only where its source is
    /// configured (a cluster for the watches and publishing, kcp for the mirror, a file for
    /// the config reload).
    pub fn start(
        state: Arc<State>,
        client: Option<kube::Client>,
        metrics: Arc<Metrics>,
        b: Background,
    ) -> Supervisor {
        let mut tasks = tokio::task::JoinSet::new();
        if let Some(kcp) = state.kcp.clone().filter(|_| state.serving.guard) {
            tasks.spawn(kcp.clone().watch());
            if let Some(client) = &client {
                tasks.spawn(crate::state::kcp::mirror(
                    state.clone(),
                    kcp,
                    client.clone(),
                    KCP_MIRROR_EVERY,
                ));
            }
        }
        if let Some(client) = client {
            if state.serving.guard {
                tasks.spawn(crate::admission_policy::apply::keep_published(
                    client.clone(),
                    state.clone(),
                    b.policy_params,
                    b.policy_publish_interval,
                ));
            }
            crate::state::cluster::spawn_watches(&mut tasks, client, state.clone());
        }
        tasks.spawn(b.cert_store.watch(b.cert_reload_interval, metrics.clone()));
        metrics.set_rollout(&state.rollout());
        if let Some(path) = b.config_file {
            tasks.spawn(watch_config(path, state, metrics));
        }
        Supervisor { _tasks: tasks }
    }
}

/// Re-read the config file whenever its bytes change (a mounted ConfigMap is swapped by the
/// kubelet like a Secret): the enforcement modes and exemptions take effect at once; a file
/// that does not parse is refused and the settings in force stay. Identities, domains and key
/// schemes are read at start-up only.
async fn watch_config(path: PathBuf, state: Arc<State>, metrics: Arc<Metrics>) {
    let mut applied = std::fs::read(&path).ok();
    // A change is taken only once two reads a second apart agree, and what is parsed is the
    // bytes read: a file caught halfway through a rewrite is never applied.
    let mut seen: Option<Vec<u8>> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                if applied.is_some() {
                    tracing::error!(config = %path.display(), error = %e, "config file unreadable; the settings in force stay");
                    metrics.config_reload_errors.inc();
                    applied = None;
                }
                continue;
            }
        };
        if applied.as_deref() == Some(&now[..]) {
            seen = None;
            continue;
        }
        if seen.as_deref() != Some(&now[..]) {
            seen = Some(now);
            continue;
        }
        applied = seen.take();
        let parsed = std::str::from_utf8(&now)
            .map_err(InvalidConfig::from)
            .and_then(ConfigFile::parse);
        match parsed {
            Err(e) => {
                tracing::error!(config = %path.display(), error = %e, "config change refused; the settings in force stay");
                metrics.config_reload_errors.inc();
            }
            Ok(cfg) => {
                let rollout = cfg.rollout();
                tracing::info!(
                    config = %path.display(),
                    sync_finalizer = %rollout.sync_finalizer,
                    move_window = %rollout.move_window,
                    exemptions = rollout.exemptions.len(),
                    "config reloaded: enforcement modes and exemptions in force (identities, domains and key schemes change only on restart)"
                );
                metrics.set_rollout(&rollout);
                metrics.config_reloads.inc();
                state.set_rollout(rollout);
            }
        }
    }
}
