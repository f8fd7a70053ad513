//! `Server`: everything `handoff serve` starts, in the order it starts it. `main` and the test
//! harness (`tests/support/https.rs`) both start this, so a test runs what a pod runs.
//!
//! `bind` loads the certificate and opens the ports, and starts nothing: every start-up error
//! stops the process before a port answers. `run` starts the watches and publishers, serves,
//! and on `shutdown` drains: readiness fails first, the listener closes after the drain delay,
//! in-flight requests get the drain timeout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;

use super::metrics::Metrics;
use super::tls::{CertSource, CertStore, TlsError};
use super::{App, Limits};
use crate::admission_policy::ParamsRef;
use crate::config::{ConfigFile, InvalidConfig};
use crate::state::State;

/// How often the kcp mirror compares each located namespace with its kcp namespace.
const KCP_MIRROR_EVERY: Duration = Duration::from_secs(2);

/// The serving certificate, loaded, and the TLS configuration around it. Loaded on its own,
/// before the state is built, so that a bad certificate is the first thing start-up names.
pub struct ServingTls {
    store: Arc<CertStore>,
    config: Arc<rustls::ServerConfig>,
}

impl ServingTls {
    /// `client_ca`: client certificates are required, and must chain to this CA.
    pub fn load(
        certificate: CertSource,
        client_ca: Option<&std::path::Path>,
    ) -> Result<Self, TlsError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = Arc::new(CertStore::load(certificate)?);
        let config = super::tls::server_config(store.clone(), client_ca)?;
        Ok(ServingTls {
            store,
            config: Arc::new(config),
        })
    }
}

/// What `handoff serve`'s flags say, less the state (built before, from the state flags).
pub struct Options {
    pub listen: SocketAddr,
    /// Plain HTTP for `/healthz`, `/readyz` and `/metrics`.
    pub metrics_listen: Option<SocketAddr>,
    pub tls: ServingTls,
    pub cert_reload_interval: Duration,
    pub limits: Limits,
    /// Readiness fails this long before the listener closes, so the endpoint leaves the
    /// Service while handoff still answers.
    pub drain_delay: Duration,
    /// In-flight requests get this long after the listener closes.
    pub drain_timeout: Duration,
    /// Followed for enforcement modes and exemptions (`watch_config`).
    pub config_file: Option<PathBuf>,
    /// Where the guard publishes its identities for the admission policy, and how often.
    pub policy_params: ParamsRef,
    pub policy_publish_interval: Duration,
    /// Served behind the same request stack as the webhooks (the tests add one that panics).
    pub extra_routes: Option<Router<App>>,
}

pub struct Server {
    app: App,
    listener: tokio::net::TcpListener,
    plain: Option<tokio::net::TcpListener>,
    /// The cluster the state's watches read, if it comes from one.
    client: Option<kube::Client>,
    opts: Options,
}

impl Server {
    /// Bind the ports; an error names the flag of the address it could not bind.
    pub async fn bind(
        state: Arc<State>,
        client: Option<kube::Client>,
        mut opts: Options,
    ) -> anyhow::Result<Server> {
        let mut metrics = Metrics::new();
        metrics.register_telemetry(&state.telemetry);
        let app = App::new(state, Arc::new(metrics), opts.limits.clone());
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .with_context(|| format!("--listen {}", opts.listen))?;
        opts.listen = listener.local_addr().unwrap_or(opts.listen);
        let plain = match opts.metrics_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("--metrics-listen {addr}"))?,
            ),
            None => None,
        };
        Ok(Server {
            app,
            listener,
            plain,
            client,
            opts,
        })
    }

    /// The HTTPS address, with the port the kernel chose for `:0`.
    pub fn local_addr(&self) -> SocketAddr {
        self.opts.listen
    }

    pub fn app(&self) -> &App {
        &self.app
    }

    /// Start the background work, serve until `shutdown` resolves, then drain.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let Server {
            app,
            listener,
            plain,
            client,
            opts,
        } = self;
        let state = app.state.clone();
        let metrics = app.metrics.clone();
        // What runs beside the listener, stopped when `run` returns (a test's server leaves
        // nothing polling behind it).
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
                    opts.policy_params.clone(),
                    opts.policy_publish_interval,
                ));
            }
            crate::state::cluster::spawn_watches(&mut tasks, client, state.clone());
        }
        let ServingTls { store, config } = opts.tls;
        tasks.spawn(store.watch(opts.cert_reload_interval, metrics.clone()));
        metrics.set_rollout(&state.rollout());
        if let Some(path) = opts.config_file.clone() {
            tasks.spawn(watch_config(path, state.clone(), metrics.clone()));
        }

        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        if let Some(l) = plain {
            let mut rx = stop_rx.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let stop = async move {
                    let _ = rx.wait_for(|s| *s).await;
                };
                if let Err(e) = super::run_plain(l, app, stop).await {
                    tracing::error!(error = %e, "metrics listener failed");
                }
            });
        }
        let health = app.health.clone();
        let drain_delay = opts.drain_delay;
        let shutdown = async move {
            shutdown.await;
            // Readiness fails first, so the endpoint is removed while we still answer.
            health.start_drain();
            tracing::info!(
                ?drain_delay,
                "SIGTERM: readiness now fails; closing the listener after the drain delay"
            );
            tokio::time::sleep(drain_delay).await;
            let _ = stop_tx.send(true);
        };
        let service = super::router(app.clone(), opts.extra_routes);
        super::run(
            listener,
            config,
            service,
            app.health.clone(),
            &opts.limits,
            shutdown,
            opts.drain_timeout,
        )
        .await;
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
