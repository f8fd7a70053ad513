//! What the request path knows of time and size: the deadline the API server gives a review
//! (`?timeout=`), and the body read within it and within the limit.

use crate::duration::parse_go_duration;
use std::time::Duration;

use axum::body::Body;
use axum::http::Uri;

use super::Limits;

/// When the answer must be out: 80% of the `?timeout=` the API server sent, counted from the
/// moment the request arrived, so that the wait for a slot, the body and the decision all fit
/// in the time the API server gives us.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    pub at: tokio::time::Instant,
    pub budget: Duration,
}

impl Deadline {
    pub fn of(uri: &Uri, limits: &Limits) -> Self {
        let budget = request_timeout(uri.query(), limits.default_timeout) * 4 / 5;
        Deadline {
            at: tokio::time::Instant::now() + budget,
            budget,
        }
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

pub(super) enum BodyError {
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
pub(super) async fn read_limited(
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
