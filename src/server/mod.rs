//! The HTTPS server: what every request shares (`App`: state, metrics, health, limits), the
//! routes for health and metrics, and its parts: `serve` (`Server`: what `handoff serve`
//! starts), `stack` (the request path, one layer each), `admit` (the admission handler),
//! `refusal` (a request refused undecided, by either of those two), `body` (the deadline and
//! the body), `listener` (TLS, HTTP/2 or HTTP/1.1, and the drain on SIGTERM), `keep_alive`
//! (an HTTP/1.1 connection's header and idle bounds, told apart), `tls`
//! (certificates and their reload), `metrics`.

mod admit;
mod body;
mod keep_alive;
mod listener;
pub mod metrics;
mod refusal;
mod serve;
mod stack;
mod supervisor;
pub mod tls;

pub use crate::duration::parse_go_duration;
pub use body::request_timeout;
pub use listener::{run, run_plain};
pub use serve::{BindError, Options, Server, ServingTls};
pub(crate) use stack::router;

use crate::duration::GoDuration;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State as AxState;
use axum::http::{StatusCode, header};
use axum::routing::get;
use tokio::sync::Semaphore;

use crate::state::State;
use metrics::Metrics;

/// Limits of the request path and of each connection: every bound a client meets, in one
/// place. The first four are flags of `handoff serve`; the connection bounds are not, since
/// the API server's own behaviour fixes what they must allow.
#[derive(Debug, Clone)]
pub struct Limits {
    pub body_limit: usize,
    /// Used when the API server sends no `?timeout=`.
    pub default_timeout: Duration,
    pub max_concurrency: usize,
    /// How long a request may wait for a slot before it is shed with 503.
    pub queue_timeout: Duration,
    /// A client that connects and never finishes the TLS handshake is dropped after this.
    pub handshake_timeout: Duration,
    /// An HTTP/1.1 client that does not finish a request's headers this long after their
    /// first byte is dropped; bodies are bounded by the request deadline (`whole_body` in
    /// `stack`).
    pub header_read_timeout: Duration,
    /// An idle HTTP/1.1 connection is closed after this: longer than the API server keeps an
    /// idle connection (90 s), so that the client closes it first and never writes a review
    /// onto a connection handoff is closing (`keep_alive`).
    pub idle_timeout: Duration,
    /// HTTP/2 pings an idle connection this often, and drops it when a ping goes unanswered
    /// for `h2_keep_alive_timeout`, so a peer that vanished does not hold a connection.
    pub h2_keep_alive_interval: Duration,
    pub h2_keep_alive_timeout: Duration,
}

/// The deadline when the API server sends no `?timeout=` (`--default-timeout`).
pub const DEFAULT_TIMEOUT: GoDuration = GoDuration::new("10s");
/// How long a request waits for a slot (`--queue-timeout`).
pub const QUEUE_TIMEOUT: GoDuration = GoDuration::new("1s");

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_limit: 8 * 1024 * 1024,
            default_timeout: DEFAULT_TIMEOUT.get(),
            max_concurrency: 1024,
            queue_timeout: QUEUE_TIMEOUT.get(),
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            h2_keep_alive_interval: Duration::from_secs(30),
            h2_keep_alive_timeout: Duration::from_secs(10),
        }
    }
}

/// Liveness and readiness facts.
#[derive(Debug)]
pub struct Health {
    /// The TLS listener accepted a connection from the server itself.
    pub listener_answers: AtomicBool,
    /// SIGTERM received (`start_drain`): readiness fails so the endpoint is removed before
    /// connections stop, and the connections, which wait on it, are told to go.
    drain: tokio::sync::watch::Sender<bool>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            listener_answers: AtomicBool::new(false),
            drain: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl Health {
    /// Begin the drain. Readiness fails, so the endpoint leaves the Service; and clients are
    /// moved off this pod while it still answers: HTTP/2 connections get a GOAWAY at once, and
    /// every HTTP/1.1 answer from now on says `Connection: close`. The API server calls
    /// admission webhooks over HTTP/1.1 with a pool of keep-alive connections (kubernetes
    /// PR #82090), and a POST it writes onto a pooled connection just as the server closes it
    /// fails with `EOF` and is not retried. A connection the client was told to close is never
    /// reused; what remains at the listener's close is an HTTP/1.1 connection that carried no
    /// request for the whole drain delay, closed idle: the same race, made rare, since nothing
    /// on the server's side can tell an idle HTTP/1.1 client to stop.
    pub fn start_drain(&self) {
        self.drain.send_replace(true);
    }

    pub fn is_draining(&self) -> bool {
        *self.drain.borrow()
    }

    /// Resolves once `start_drain` has been called (at once if it already was).
    fn drain_started(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.drain.subscribe();
        async move {
            let _ = rx.wait_for(|d| *d).await;
        }
    }
}

/// What every handler shares. One `Arc`: axum clones the state for every extractor of every
/// request, and five reference counts cost five times one.
#[derive(Clone)]
pub struct App(Arc<AppParts>);

pub struct AppParts {
    pub state: Arc<State>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub limits: Limits,
    slots: Arc<Semaphore>,
}

impl std::ops::Deref for App {
    type Target = AppParts;
    fn deref(&self) -> &AppParts {
        &self.0
    }
}

impl App {
    pub fn new(state: Arc<State>, metrics: Arc<Metrics>, limits: Limits) -> Self {
        App(Arc::new(AppParts {
            state,
            metrics,
            health: Arc::new(Health::default()),
            slots: Arc::new(Semaphore::new(limits.max_concurrency)),
            limits,
        }))
    }

    /// Ready once the caches are synced, a certificate is loaded (it is, or start-up failed),
    /// the listener answers, and no drain has begun.
    pub fn readiness(&self) -> Result<(), String> {
        if self.health.is_draining() {
            return Err("draining: shutting down".into());
        }
        self.state.readiness()?;
        if !self.health.listener_answers.load(Ordering::Acquire) {
            return Err("the HTTPS listener has not answered yet".into());
        }
        Ok(())
    }
}

/// Health and metrics, also served on the plain-HTTP `--metrics-listen` port.
pub fn health_router() -> Router<App> {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|AxState(app): AxState<App>| async move {
                let r = app.state.rollout();
                let modes = format!(
                    "sync-finalizer: {}, move-window: {}",
                    if app.state.serving.guard {
                        r.sync_finalizer.as_str()
                    } else {
                        "not served"
                    },
                    if app.state.serving.pin {
                        r.move_window.as_str()
                    } else {
                        "not served"
                    },
                );
                match app.readiness() {
                    Ok(()) => (StatusCode::OK, format!("ok ({modes})\n")),
                    Err(why) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready: {why}\n"),
                    ),
                }
            }),
        )
        .route(
            "/metrics",
            get(|AxState(app): AxState<App>| async move {
                app.metrics.observe(&app.state);
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    app.metrics.encode(),
                )
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_api_servers_timeout() {
        let d = Duration::from_secs(10);
        assert_eq!(
            request_timeout(Some("timeout=5s"), d),
            Duration::from_secs(5)
        );
        assert_eq!(
            request_timeout(Some("a=b&timeout=1m0s"), d),
            Duration::from_secs(60)
        );
        assert_eq!(
            request_timeout(Some("timeout=250ms"), d),
            Duration::from_millis(250)
        );
        assert_eq!(request_timeout(Some("timeout=bogus"), d), d);
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("1h2m3s"), Some(Duration::from_secs(3723)));
        assert_eq!(parse_go_duration("10"), None);
        // Absurd values neither panic nor hold a request for long.
        assert_eq!(parse_go_duration("100000000000000000000000s"), None);
        assert_eq!(parse_go_duration("1e400s"), None);
        assert_eq!(
            request_timeout(Some("timeout=9999999h"), d),
            Duration::from_secs(600)
        );
        assert_eq!(request_timeout(Some("timeout="), d), d);
        assert_eq!(request_timeout(None, d), d);
    }
}
