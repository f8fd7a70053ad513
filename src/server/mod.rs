//! The HTTPS server: listener, TLS, the request path as one explicit stack, health, metrics,
//! and drain on SIGTERM.
//!
//! Request path, outermost first (see `router`): panic → 500, concurrency limit whose waiters
//! time out → 503, then the admission handler, which reads the body up to the limit (413),
//! decodes (400/415), decides within the deadline the API server sent in `?timeout=`, logs the
//! decision and counts it.

pub mod metrics;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State as AxState};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::catch_panic::CatchPanicLayer;

use crate::admission;
use crate::policy::rollout::Verdict;
use crate::state::State;
use crate::webhook::{self, Decision, Reason, Webhook};
use metrics::{Metrics, RequestLabels, WebhookLabels};

/// Limits of the request path.
#[derive(Debug, Clone)]
pub struct Limits {
    pub body_limit: usize,
    /// Used when the API server sends no `?timeout=`.
    pub default_timeout: Duration,
    pub max_concurrency: usize,
    /// How long a request may wait for a slot before it is shed with 503.
    pub queue_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_limit: 8 * 1024 * 1024,
            default_timeout: Duration::from_secs(10),
            max_concurrency: 1024,
            queue_timeout: Duration::from_secs(1),
        }
    }
}

/// Liveness and readiness facts.
#[derive(Debug)]
pub struct Health {
    /// The TLS listener accepted a connection from the server itself.
    pub listener_answers: AtomicBool,
    /// SIGTERM received: readiness fails so the endpoint is removed before connections stop.
    /// Set only by `start_drain`, which also tells the connections.
    draining: AtomicBool,
    /// The same fact for connections to wait on (`start_drain`).
    drain: tokio::sync::watch::Sender<bool>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            listener_answers: AtomicBool::new(false),
            draining: AtomicBool::new(false),
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
        self.draining.store(true, Ordering::Release);
        self.drain.send_replace(true);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
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

/// The HTTPS router: webhooks, health and metrics, behind the request-path stack.
pub fn router(app: App) -> Router {
    with_stack(webhook_routes(), app)
}

/// The webhook endpoints.
pub fn webhook_routes() -> Router<App> {
    Router::new()
        .route(
            "/validate/sync-finalizer",
            post(|s, d, u, h, b| admit(s, Webhook::SyncFinalizer, d, u, h, b)),
        )
        .route(
            "/mutate/move-window",
            post(|s, d, u, h, b| admit(s, Webhook::MoveWindow, d, u, h, b)),
        )
        .route(
            "/validate/lease-hold",
            post(|s, d, u, h, b| admit(s, Webhook::LeaseHold, d, u, h, b)),
        )
}

/// The whole request path in one place, outermost last: the concurrency limit around the
/// webhooks, health and metrics beside them (never shed, so probes answer under load), a
/// fallback, and panic recovery around everything.
pub fn with_stack(webhooks: Router<App>, app: App) -> Router {
    let panics = app.metrics.clone();
    webhooks
        .layer(middleware::from_fn_with_state(app.clone(), limit_concurrency))
        .merge(health_router())
        .fallback(|uri: Uri| async move {
            (
                StatusCode::NOT_FOUND,
                format!(
                    "no such endpoint {}: handoff serves POST /validate/sync-finalizer, POST /mutate/move-window, POST /validate/lease-hold, GET /healthz, /readyz, /metrics\n",
                    uri.path()
                ),
            )
        })
        .layer(CatchPanicLayer::custom(move |_: Box<dyn std::any::Any + Send>| {
            panics.panics.inc();
            tracing::error!("handler panicked; answered 500");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "handoff hit an internal error deciding this request; it was not decided\n",
            )
                .into_response()
        }))
        .with_state(app)
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

/// When the answer must be out: 80% of the `?timeout=` the API server sent, counted from the
/// moment the request arrived, so that the wait for a slot, the body and the decision all fit
/// in the time the API server gives us.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: tokio::time::Instant,
    budget: Duration,
}

impl Deadline {
    fn of(uri: &Uri, limits: &Limits) -> Self {
        let budget = request_timeout(uri.query(), limits.default_timeout) * 4 / 5;
        Deadline {
            at: tokio::time::Instant::now() + budget,
            budget,
        }
    }
}

async fn limit_concurrency(AxState(app): AxState<App>, mut req: Request, next: Next) -> Response {
    let deadline = Deadline::of(req.uri(), &app.limits);
    req.extensions_mut().insert(deadline);
    let wait_until = deadline
        .at
        .min(tokio::time::Instant::now() + app.limits.queue_timeout);
    let permit = match tokio::time::timeout_at(wait_until, app.slots.clone().acquire_owned()).await
    {
        Ok(Ok(p)) => p,
        _ => {
            app.metrics.shed.inc();
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "handoff is saturated: {} requests in flight and none finished within {:?} (--queue-timeout, or the request's own deadline if sooner); retry\n",
                    app.limits.max_concurrency,
                    app.limits.queue_timeout.min(deadline.budget)
                ),
            )
                .into_response();
        }
    };
    // Dropped on return and on unwind alike, so a panicking handler frees its slot.
    let _in_flight = InFlight::enter(&app.metrics, permit);
    next.run(req).await
}

struct InFlight<'a> {
    metrics: &'a Metrics,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl<'a> InFlight<'a> {
    fn enter(metrics: &'a Metrics, permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        metrics.in_flight.inc();
        InFlight {
            metrics,
            _permit: permit,
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// The API server appends `?timeout=<n>s`: the time it will wait for us.
/// Capped at ten minutes: the API server never waits longer than 30 s, and a bigger number is
/// someone else's mistake, not a reason to hold a slot.
pub fn request_timeout(query: Option<&str>, default: Duration) -> Duration {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("timeout="))
        .and_then(parse_go_duration)
        .unwrap_or(default)
        .min(Duration::from_secs(600))
}

/// The subset of Go's duration syntax the API server writes: `10s`, `1m0s`, `500ms`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total = total.checked_add(Duration::try_from_secs_f64(value * unit).ok()?)?;
    }
    Some(total)
}

enum BodyError {
    Timeout,
    TooLarge,
    Read(axum::Error),
}

/// Past the limit, how much more of a body is read and thrown away before answering 413.
const DRAIN_FACTOR: usize = 16;

/// The body, up to `limit` bytes, by `deadline`. A larger body is read to its end (up to
/// `DRAIN_FACTOR` times the limit, within the deadline) and discarded before the 413 goes out:
/// over h2, answering while the client still sends ends in a stream reset that clients report
/// as a transport error (curl: exit 92) instead of the 413 and its message.
async fn read_body(
    body: Body,
    limit: usize,
    deadline: tokio::time::Instant,
) -> Result<bytes::Bytes, BodyError> {
    use http_body_util::BodyExt as _;
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) if seen > limit => return Err(BodyError::TooLarge),
            Err(_) => return Err(BodyError::Timeout),
            Ok(None) if seen > limit => return Err(BodyError::TooLarge),
            Ok(None) => return Ok(buf.freeze()),
            // Past the limit already: the 413 is the answer, whatever broke the stream.
            Ok(Some(Err(_))) if seen > limit => return Err(BodyError::TooLarge),
            Ok(Some(Err(e))) => return Err(BodyError::Read(e)),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen <= limit {
            buf.extend_from_slice(&data);
        } else {
            buf = bytes::BytesMut::new();
            if seen > limit.saturating_mul(DRAIN_FACTOR) {
                return Err(BodyError::TooLarge);
            }
        }
    }
}

fn plain(code: StatusCode, message: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message + "\n",
    )
        .into_response()
}

async fn admit(
    AxState(app): AxState<App>,
    webhook: Webhook,
    deadline: Option<axum::Extension<Deadline>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !app.state.serves(webhook) {
        return plain(
            StatusCode::NOT_FOUND,
            format!(
                "this handoff does not serve the {} webhook (--webhooks); check the webhook configuration's service",
                webhook.as_str()
            ),
        );
    }
    let start = Instant::now();
    let (resp, op, verdict) =
        admit_inner(&app, webhook, deadline.map(|d| d.0), &uri, &headers, body).await;
    let code = resp.status().as_u16();
    app.metrics
        .requests
        .get_or_create(&RequestLabels {
            webhook: webhook.as_str(),
            operation: op,
            verdict,
            code,
        })
        .inc();
    app.metrics
        .latency
        .get_or_create(&WebhookLabels {
            webhook: webhook.as_str(),
        })
        .observe(start.elapsed().as_secs_f64());
    resp
}

async fn admit_inner(
    app: &App,
    webhook: Webhook,
    deadline: Option<Deadline>,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> (Response, &'static str, &'static str) {
    let start = Instant::now();
    let bad = |code: StatusCode, msg: String| {
        tracing::warn!(
            webhook = webhook.as_str(),
            code = code.as_u16(),
            error = &*crate::policy::one_line_str(&msg),
            "bad admission request"
        );
        (plain(code, msg), "", "error")
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return bad(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Type must be application/json, got {content_type:?}"),
        );
    }
    // One deadline for reading the body and deciding: answer before the API server gives up
    // on us, with a verdict rather than a timeout, so the outcome is ours and not the
    // failurePolicy's; and a client that trickles its body cannot hold a slot for longer.
    let Deadline {
        at: deadline,
        budget,
    } = deadline.unwrap_or_else(|| Deadline::of(uri, &app.limits));
    let limit = app.limits.body_limit;
    let bytes = match read_body(body, limit, deadline).await {
        Ok(b) => b,
        Err(BodyError::Timeout) => {
            return bad(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {budget:?}"),
            );
        }
        Err(BodyError::TooLarge) => {
            return bad(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("AdmissionReview body exceeds the {limit}-byte limit"),
            );
        }
        Err(BodyError::Read(e)) => {
            return bad(
                StatusCode::BAD_REQUEST,
                format!("cannot read request body: {e}"),
            );
        }
    };
    let req = match admission::decode_review(&bytes) {
        Ok(r) => r,
        Err(e) => return bad(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let op = req.operation.as_str();
    let decision = match tokio::time::timeout_at(
        deadline,
        webhook::decide_by(&app.state, webhook, &req, Some(deadline)),
    )
    .await
    {
        Ok(d) => d,
        Err(_) => webhook::deliver(
            &app.state.rollout(),
            webhook,
            &req,
            Decision::deny(
                &req,
                Reason::Deadline,
                format!(
                    "handoff could not decide within {budget:?} (the API server's timeout less a margin); refused so that nothing is deleted or started unchecked"
                ),
            ),
        ),
    };
    if matches!(decision.verdict, Verdict::Deny | Verdict::WouldDeny) {
        app.metrics
            .denials
            .get_or_create(&crate::server::metrics::DenialLabels {
                webhook: webhook.as_str(),
                reason: decision.reason.as_str(),
            })
            .inc();
    }
    if decision.verdict == Verdict::Exempt {
        app.metrics
            .exempt
            .get_or_create(&WebhookLabels {
                webhook: webhook.as_str(),
            })
            .inc();
    }
    log_decision(webhook, &req, &decision, start.elapsed());
    let body = admission::encode_review(&decision.response);
    let resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response();
    (resp, op, decision.verdict.as_str())
}

/// One event per decision: denials, pins and errors at `info`, allows at `debug`. Every value
/// a request supplies goes through `one_line_str`, here and only here, so neither format can be
/// split or forged by a username, a name or a message (JSON escapes control characters but
/// not U+2028/U+2029, which some log tools split on).
fn log_decision(
    webhook: Webhook,
    req: &admission::AdmissionRequest,
    d: &Decision,
    latency: Duration,
) {
    use crate::policy::one_line_str as esc;
    macro_rules! event {
        ($level:expr) => {
            tracing::event!(
                target: "handoff::decision",
                $level,
                webhook = webhook.as_str(),
                uid = &*esc(&req.uid),
                user = &*esc(&req.user_info.username),
                operation = req.operation.as_str(),
                resource = &*esc(&req.resource_display().to_string()),
                namespace = &*esc(req.namespace.as_deref().unwrap_or("")),
                name = &*esc(req.object_name().unwrap_or("")),
                dry_run = req.is_dry_run(),
                verdict = d.verdict.as_str(),
                reason = d.reason.as_str(),
                detail = &*esc(&d.detail),
                latency_us = latency.as_micros() as u64,
                "decision"
            )
        };
    }
    if d.verdict == Verdict::Allow {
        event!(tracing::Level::DEBUG);
    } else {
        event!(tracing::Level::INFO);
    }
}

/// Serve HTTPS on `listener` until `shutdown` resolves, then drain: stop accepting, let
/// in-flight requests finish (at most `drain_timeout`), and return. From `Health::start_drain`
/// on (before `shutdown`, by the drain delay), connections are already being moved away.
pub async fn run(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: Router,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()>,
    drain_timeout: Duration,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let local = listener.local_addr().ok();
    if let Some(addr) = local {
        tokio::spawn(self_check(addr, health.clone()));
    }
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let _ = tcp.set_nodelay(true);
        let conn = serve_connection(
            tcp,
            peer,
            acceptor.clone(),
            service.clone(),
            health.clone(),
            closing.clone(),
        );
        connections.spawn(conn);
    }
    drop(listener);
    let _ = closing_tx.send(true);
    tracing::info!("listener closed; draining in-flight requests");
    let drained = async { while connections.join_next().await.is_some() {} };
    match tokio::time::timeout(drain_timeout, drained).await {
        Ok(()) => tracing::info!("all connections drained"),
        Err(_) => {
            tracing::warn!(
                ?drain_timeout,
                "drain timed out; closing remaining connections"
            );
            connections.abort_all();
        }
    }
}

/// One accepted connection: TLS, then HTTP/2 or HTTP/1.1 by ALPN, until the client closes it
/// or the drain does (gracefully: in-flight requests are answered first).
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    service: Router,
    health: Arc<Health>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client that opens a connection and never finishes its headers must not hold it
    // forever; bodies are bounded by the request deadline in the handler.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let builder = if h2 {
        builder.http2_only()
    } else {
        builder.http1_only()
    };
    // A connection made during the drain is told when the listener closes: told at once, its
    // first request would be refused (a GOAWAY before any stream was processed), and its
    // client would only come back here until the endpoint is gone everywhere.
    let early_goaway = h2 && !health.is_draining();
    let drain_started = health.drain_started();
    let svc = TowerToHyperService::new(close_when_draining(service, health, h2));
    let conn = builder.serve_connection(TokioIo::new(tls), svc);
    tokio::pin!(conn);
    tokio::pin!(drain_started);
    // HTTP/2 is told to go at the start of the drain; HTTP/1.1 is told with each answer
    // (`close_when_draining`) and what is left idle is closed with the listener.
    let mut told = false;
    let result = loop {
        tokio::select! {
            r = conn.as_mut() => break r,
            _ = &mut drain_started, if early_goaway && !told => {
                conn.as_mut().graceful_shutdown();
                told = true;
            }
            _ = closing.wait_for(|c| *c), if !told => {
                conn.as_mut().graceful_shutdown();
                told = true;
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// On an HTTP/1.1 connection, every answer given while draining says `Connection: close`, so
/// the client closes the connection after reading it instead of pooling it.
fn close_when_draining(
    service: Router,
    health: Arc<Health>,
    h2: bool,
) -> tower::util::MapResponse<Router, impl FnOnce(Response) -> Response + Clone> {
    type Incoming = http::Request<hyper::body::Incoming>;
    <Router as tower::ServiceExt<Incoming>>::map_response(service, move |mut r: Response| {
        if !h2 && health.is_draining() {
            r.headers_mut()
                .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        r
    })
}

/// Prove the listener answers by connecting to it, as the kubelet and API server will.
async fn self_check(addr: SocketAddr, health: Arc<Health>) {
    let target = if addr.ip().is_unspecified() {
        SocketAddr::new(
            if addr.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            },
            addr.port(),
        )
    } else {
        addr
    };
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(target).await.is_ok() {
            health.listener_answers.store(true, Ordering::Release);
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::error!(%target, "the HTTPS listener does not answer; staying unready");
}

/// Serve `/healthz`, `/readyz` and `/metrics` over plain HTTP.
pub async fn run_plain(
    listener: TcpListener,
    app: App,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = health_router().with_state(app);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
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
