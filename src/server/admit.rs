//! The admission handler, once the layers have passed the request (`stack`): decode, decide
//! by the deadline, encode, log. What it decided travels back to `count` as `Outcome`.

use std::time::Duration;

use axum::extract::{Request, State as AxState};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::App;
use super::stack::{bad, deadline_of};
use crate::admission;
use crate::rules::rollout::Verdict;
use crate::webhook::{self, Decision, Reason, Webhook};

/// The body `whole_body` read.
#[derive(Clone)]
pub(super) struct ReviewBody(pub bytes::Bytes);

/// When `count` first saw the request: the decision's logged latency counts from there.
#[derive(Clone, Copy)]
pub(super) struct Started(pub std::time::Instant);

/// What was decided, for `count`.
#[derive(Clone, Copy)]
pub(super) struct Outcome {
    pub operation: &'static str,
    pub verdict: Verdict,
    pub reason: &'static str,
}

pub(super) async fn admit(AxState(app): AxState<App>, mut req: Request) -> Response {
    let webhook = Webhook::from_path(req.uri().path()).expect("a webhook route");
    let deadline = deadline_of(&req, &app);
    let started = req.extensions().get::<Started>().map(|s| s.0);
    let Some(ReviewBody(bytes)) = req.extensions_mut().remove::<ReviewBody>() else {
        unreachable!("whole_body runs before every webhook route");
    };
    let review = match admission::decode_review(&bytes) {
        Ok(r) => r,
        Err(e) => return bad(webhook, StatusCode::BAD_REQUEST, e.to_string()),
    };
    let decision = match tokio::time::timeout_at(
        deadline.at,
        webhook::decide_by(&app.state, webhook, &review, Some(deadline.at)),
    )
    .await
    {
        Ok(d) => d,
        Err(_) => webhook::deliver(
            &app.state.rollout(),
            webhook,
            &review,
            Decision::deny(
                &review,
                Reason::Deadline,
                format!(
                    "handoff could not decide within {:?} (the API server's timeout less a margin); refused so that nothing is deleted or started unchecked",
                    deadline.budget
                ),
            ),
        ),
    };
    let latency = started.map(|s| s.elapsed()).unwrap_or_default();
    log_decision(webhook, &review, &decision, latency);
    let mut resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        admission::encode_review(&decision.response),
    )
        .into_response();
    resp.extensions_mut().insert(Outcome {
        operation: review.operation.as_str(),
        verdict: decision.verdict,
        reason: decision.reason.as_str(),
    });
    resp
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
