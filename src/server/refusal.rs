//! A webhook request refused before it was decided. The answer is an HTTP error with a
//! plain-text reason, not an AdmissionReview, so the API server counts the call as failed and
//! the webhook's failurePolicy settles the request. `stack`'s steps and `admit` both refuse;
//! the refusal lives below them both so that neither imports the other.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::webhook::Webhook;

/// A request refused before it could be decided: the answer says why, and so does one event.
pub(super) fn bad(webhook: Webhook, code: StatusCode, msg: String) -> Response {
    tracing::warn!(
        webhook = webhook.as_str(),
        code = code.as_u16(),
        error = &*crate::rules::one_line_str(&msg),
        "bad admission request"
    );
    plain(code, msg)
}

pub(super) fn plain(code: StatusCode, message: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message + "\n",
    )
        .into_response()
}
