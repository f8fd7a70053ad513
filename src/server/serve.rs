//! `Server`: everything `handoff serve` starts, in the order it starts it. `main` and the test
//! harness (`tests/support/https.rs`) both start this, so a test runs what a pod runs.
//!
//! `bind` loads the certificate and opens the ports, and starts nothing: every start-up error
//! stops the process before a port answers. `run` has the supervisor start the background
//! work (`supervisor`: watches, the kcp mirror, policy publishing, the certificate and config
//! reloads), serves, and on `shutdown` drains: readiness fails first, the listener closes after
//! the drain delay, in-flight requests get the drain timeout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;

use super::metrics::Metrics;
use super::supervisor::{Background, Supervisor};
use super::tls::{CertSource, CertStore, TlsError};
use super::{App, Limits};
use crate::admission_policy::ParamsRef;
use crate::state::State;

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
    /// Followed for enforcement modes and exemptions (`supervisor`'s config reload).
    pub config_file: Option<PathBuf>,
    /// Where the guard publishes its identities for the admission policy, and how often.
    pub policy_params: ParamsRef,
    pub policy_publish_interval: Duration,
    /// Served behind the same request stack as the webhooks (the tests add one that panics).
    pub extra_routes: Option<Router<App>>,
}

/// A port `bind` could not open, named by its flag.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {source}")]
pub struct BindError {
    /// The flag and its value (`--listen 0.0.0.0:8443`).
    pub flag: String,
    #[source]
    pub source: std::io::Error,
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
    ) -> Result<Server, BindError> {
        let mut metrics = Metrics::new();
        metrics.register_telemetry(&state.telemetry);
        let app = App::new(state, Arc::new(metrics), opts.limits.clone());
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|source| BindError {
                flag: format!("--listen {}", opts.listen),
                source,
            })?;
        opts.listen = listener.local_addr().unwrap_or(opts.listen);
        let plain =
            match opts.metrics_listen {
                Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(
                    |source| BindError {
                        flag: format!("--metrics-listen {addr}"),
                        source,
                    },
                )?),
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
        let ServingTls { store, config } = opts.tls;
        // Stopped when `run` returns: a test's server leaves nothing polling behind it.
        let _background = Supervisor::start(
            app.state.clone(),
            client,
            app.metrics.clone(),
            Background {
                cert_store: store,
                cert_reload_interval: opts.cert_reload_interval,
                config_file: opts.config_file.clone(),
                policy_params: opts.policy_params.clone(),
                policy_publish_interval: opts.policy_publish_interval,
            },
        );

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
