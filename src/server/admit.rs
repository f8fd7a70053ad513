//! The last step of the admission path (`stack`): decode, decide by the deadline, encode,
//! log. What it decided goes back to `count` as `Outcome`.

use std::time::{Duration, Instant};

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::App;
use super::body::Deadline;
use super::refusal::bad;
use crate::admission;
use crate::rules::rollout::Verdict;
use crate::webhook::{self, Decision, Reason, Webhook};

/// What was decided, for `count`.
#[derive(Clone, Copy)]
pub(super) struct Outcome {
    pub operation: &'static str,
    pub verdict: Verdict,
    pub reason: &'static str,
}

/// Decode, decide by the deadline, encode, log. `start` is when the request was first
/// counted: the decision's logged latency counts from there.
pub(super) async fn admit(
    app: &App,
    webhook: Webhook,
    deadline: Deadline,
    start: Instant,
    bytes: &[u8],
) -> (Response, Option<Outcome>) {
    let review = match admission::decode_review(bytes) {
        Ok(r) => r,
        Err(e) => return (bad(webhook, StatusCode::BAD_REQUEST, e.to_string()), None),
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
    log_decision(webhook, &review, &decision, start.elapsed());
    let resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        admission::encode_review(&decision.response),
    )
        .into_response();
    let outcome = Outcome {
        operation: review.operation.as_str(),
        verdict: decision.verdict,
        reason: decision.reason.as_str(),
    };
    (resp, Some(outcome))
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
