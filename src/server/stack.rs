//! The request path, in the order a request meets it (`with_stack`): panic → 500 around
//! everything; health and metrics beside the webhooks, never shed; the concurrency limit, whose
//! waiters are shed with 503 when their slot does not come in time; then the admission handler:
//! the body up to the limit (413), decode (400/415), decide within the deadline the API server
//! sent in `?timeout=`, encode, log the decision and count it.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State as AxState};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tower_http::catch_panic::CatchPanicLayer;

use super::metrics::{Metrics, RequestLabels, WebhookLabels};
use crate::admission;
use crate::rules::rollout::Verdict;
use crate::webhook::{self, Decision, Reason, Webhook};

use super::{App, Limits, health_router};

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
            error = &*crate::rules::one_line_str(&msg),
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
    use crate::rules::one_line_str as esc;
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
