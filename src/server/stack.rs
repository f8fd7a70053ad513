//! The request path, in the order a request meets it, one step each:
//!
//! 1. panic recovery around everything: a 500 that says the request was not decided;
//! 2. health and metrics beside the webhooks, never shed, so probes answer under load;
//! 3. the concurrency limit, which also fixes the request's deadline: a waiter whose slot does
//!    not come in time is shed with 503;
//!
//! then, for a webhook (`admission`, one line per step):
//!
//! 4. `served`: a webhook this replica does not serve (`--webhooks`) is a 404;
//! 5. `count`: every answer from here in is counted (requests by verdict and code, latency,
//!    denials by reason, exemptions);
//! 6. `require_json`: Content-Type `application/json`, else 415;
//! 7. `whole_body`: the body, within the limit (413) and by the deadline (408);
//! 8. `admit`: decode (400), decide by the deadline, encode, log.
//!
//! Steps 1–3 are middleware, since they wrap more than the webhooks; 4–8 are plain functions
//! called in order, since an axum middleware per step cost about 15% of the throughput
//! (BENCHMARKS.md, "The request path as one function").
//!
//! Content-Type, body and decode refusals say why in the answer and in one `bad admission
//! request` event; a 404, a shed 503 or a panic's 500 says why in the answer only.

use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State as AxState};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tower_http::catch_panic::CatchPanicLayer;

use super::admit::{Outcome, admit};
use super::body::{BodyError, Deadline, read_limited};
use super::metrics::{DenialLabels, Metrics, RequestLabels, WebhookLabels};
use super::refusal::{bad, plain};
use crate::rules::rollout::Verdict;
use crate::webhook::Webhook;

use super::{App, health_router};

/// The whole HTTPS router: the webhooks behind their layers, `extra` routes (the tests add one
/// that panics) behind the concurrency limit and panic recovery only, health and metrics.
pub fn router(app: App, extra: Option<Router<App>>) -> Router {
    let panics = app.metrics.clone();
    // A method other than POST gets its 405 from the router.
    let webhooks = Webhook::ALL.into_iter().fold(Router::new(), |r, w| {
        r.route(w.path(), post(move |app, req| admission(app, w, req)))
    });
    let webhooks = match extra {
        Some(extra) => webhooks.merge(extra),
        None => webhooks,
    };
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

/// Steps 4–8 for one webhook request, in order.
async fn admission(AxState(app): AxState<App>, webhook: Webhook, req: Request) -> Response {
    // Fixed by `limit_concurrency`, which every webhook route is behind.
    let deadline = req
        .extensions()
        .get::<Deadline>()
        .copied()
        .unwrap_or_else(|| Deadline::of(req.uri(), &app.limits));
    // 4.
    if let Some(refused) = served(&app, webhook) {
        return refused;
    }
    // 5. counted from here, whoever answers.
    let start = Instant::now();
    let answered = async {
        // 6.
        if let Some(refused) = require_json(webhook, req.headers()) {
            return Err(refused);
        }
        // 7.
        let bytes = whole_body(&app, webhook, deadline, req.into_body()).await?;
        // 8.
        Ok(admit(&app, webhook, deadline, start, &bytes).await)
    };
    let (resp, outcome) = answered.await.unwrap_or_else(|refused| (refused, None));
    count(&app, webhook, &resp, outcome, start);
    resp
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

/// A webhook this replica was not started to serve: the webhook configuration points at the
/// wrong Service. The refusal, if any.
fn served(app: &App, webhook: Webhook) -> Option<Response> {
    if app.state.serves(webhook) {
        return None;
    }
    Some(plain(
        StatusCode::NOT_FOUND,
        format!(
            "this handoff does not serve the {} webhook (--webhooks); check the webhook configuration's service",
            webhook.as_str()
        ),
    ))
}

/// Count an answer: by operation and verdict when it was decided (`Outcome`), as `error` when
/// a step before `admit` refused the request.
fn count(app: &App, webhook: Webhook, resp: &Response, outcome: Option<Outcome>, start: Instant) {
    let webhook = webhook.as_str();
    let (operation, verdict) = outcome.map_or(("", "error"), |o| (o.operation, o.verdict.as_str()));
    let m = &app.metrics;
    m.requests
        .get_or_create(&RequestLabels {
            webhook,
            operation,
            verdict,
            code: resp.status().as_u16(),
        })
        .inc();
    m.latency
        .get_or_create(&WebhookLabels { webhook })
        .observe(start.elapsed().as_secs_f64());
    if let Some(o) = outcome {
        if matches!(o.verdict, Verdict::Deny | Verdict::WouldDeny) {
            m.denials
                .get_or_create(&DenialLabels {
                    webhook,
                    reason: o.reason,
                })
                .inc();
        }
        if o.verdict == Verdict::Exempt {
            m.exempt.get_or_create(&WebhookLabels { webhook }).inc();
        }
    }
}

fn require_json(webhook: Webhook, headers: &HeaderMap) -> Option<Response> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if mime.eq_ignore_ascii_case("application/json") {
        return None;
    }
    Some(bad(
        webhook,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!("Content-Type must be application/json, got {content_type:?}"),
    ))
}

/// One deadline for reading the body and deciding: answer before the API server gives up on
/// us, with a verdict rather than a timeout, so the outcome is ours and not the
/// failurePolicy's; and a client that trickles its body cannot hold a slot for longer.
async fn whole_body(
    app: &App,
    webhook: Webhook,
    Deadline { at, budget }: Deadline,
    body: Body,
) -> Result<bytes::Bytes, Response> {
    let limit = app.limits.body_limit;
    read_limited(body, limit, at).await.map_err(|e| match e {
        BodyError::Timeout => bad(
            webhook,
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {budget:?}"),
        ),
        BodyError::TooLarge => bad(
            webhook,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("AdmissionReview body exceeds the {limit}-byte limit"),
        ),
        BodyError::Read(e) => bad(
            webhook,
            StatusCode::BAD_REQUEST,
            format!("cannot read request body: {e}"),
        ),
    })
}
