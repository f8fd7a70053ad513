//! An HTTP/1.1 connection's two bounds, told apart: a client slow to send a request's headers
//! is dropped after `Limits::header_read_timeout`, an idle keep-alive connection is closed only
//! after `Limits::idle_timeout`.
//!
//! hyper has one bound for both: its `header_read_timeout` (30 s unless set) starts whenever the
//! connection waits for the next request, idle or not (`proto/h1/conn.rs`, `poll_read_head`, in
//! hyper 1.12). With it at 10 s, handoff closed every pooled connection the API server had left
//! idle for 10 s, while the API server keeps them for 90 s (Go's `http.Transport`
//! `IdleConnTimeout`, applied by apimachinery's `SetOldTransportDefaults` in
//! `staging/src/k8s.io/apimachinery/pkg/util/net/http.go`). A review the API server wrote onto
//! such a connection in the instant it was closed failed with `EOF`, and a POST is not retried.
//! So the header bound starts here with the first byte of a request, as Go's own server does
//! (`ReadHeaderTimeout` apart from `IdleTimeout`), and the idle bound is longer than the API
//! server's, so that it is the client that closes an idle connection, never handoff.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// What one connection is doing, as its reads and its requests show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Requests handed to the service and not answered yet.
    pub in_flight: usize,
    /// The first byte of a request whose headers are not complete yet.
    pub head_since: Option<Instant>,
    /// The last answer (or the accept).
    pub idle_since: Instant,
}

/// What to do about a connection now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Its headers took longer than the header bound: drop it.
    Drop,
    /// Idle longer than the idle bound: close it (gracefully; hyper closes an idle connection).
    CloseIdle,
    /// Nothing yet: look again then, or when the connection does something.
    CheckAt(Instant),
}

/// The bounds, without I/O. A request in flight is bounded by its own deadline (`stack`), so it
/// only has the connection looked at again a header bound later.
pub fn next(s: Snapshot, now: Instant, header_read: Duration, idle: Duration) -> Next {
    if let Some(since) = s.head_since {
        let due = since + header_read;
        return if now >= due {
            Next::Drop
        } else {
            Next::CheckAt(due)
        };
    }
    if s.in_flight > 0 {
        return Next::CheckAt(now + header_read);
    }
    let due = s.idle_since + idle;
    if now >= due {
        Next::CloseIdle
    } else {
        Next::CheckAt(due)
    }
}

/// One HTTP/1.1 connection's activity, written by its reads (`Watched`) and its requests
/// (`request_began`, `answered`), read by `passed`.
#[derive(Debug)]
pub struct Activity {
    state: Mutex<Snapshot>,
    changed: Notify,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            state: Mutex::new(Snapshot {
                in_flight: 0,
                head_since: None,
                idle_since: Instant::now(),
            }),
            changed: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot(&self) -> Snapshot {
        *self.state()
    }

    /// Bytes came in: between requests, a request has begun. The one change that brings a
    /// bound nearer, so the one that wakes `passed` (the others only move it later, which
    /// `passed` sees when it wakes).
    fn read_some(&self) {
        let mut s = self.state();
        if s.in_flight == 0 && s.head_since.is_none() {
            s.head_since = Some(Instant::now());
            drop(s);
            self.changed.notify_one();
        }
    }

    /// hyper parsed a request's headers and handed it to the service.
    pub fn request_began(&self) {
        let mut s = self.state();
        s.in_flight += 1;
        s.head_since = None;
    }

    /// The service answered a request.
    pub fn answered(&self) {
        let mut s = self.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        s.idle_since = Instant::now();
    }

    /// Resolves with the bound that passed: `Next::Drop` or `Next::CloseIdle`.
    pub async fn passed(&self, header_read: Duration, idle: Duration) -> Next {
        loop {
            // Registered before the look, so that a change in between wakes it.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match next(self.snapshot(), Instant::now(), header_read, idle) {
                Next::CheckAt(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                        _ = changed => {}
                    }
                }
                passed => return passed,
            }
        }
    }
}

/// A connection's I/O, noting each read that brought bytes in `activity`.
pub struct Watched<S> {
    inner: S,
    activity: Option<Arc<Activity>>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Option<Arc<Activity>>) -> Self {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(())))
            && buf.filled().len() > before
            && let Some(a) = &self.activity
        {
            a.read_some();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(120);

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn an_idle_connection_outlives_the_header_bound_and_the_api_servers_idle_timeout() {
        let t0 = Instant::now();
        let idle = Snapshot {
            in_flight: 0,
            head_since: None,
            idle_since: t0,
        };
        // Where hyper's header_read_timeout closed it (10 s), and where Go's client gives it up
        // (90 s): still open, to be looked at again at 120 s.
        for secs in [10, 11, 90, 119] {
            assert_eq!(
                next(idle, at(t0, secs), HEADER, IDLE),
                Next::CheckAt(at(t0, 120))
            );
        }
        assert_eq!(next(idle, at(t0, 120), HEADER, IDLE), Next::CloseIdle);
    }

    #[test]
    fn a_request_head_begun_is_bounded_from_its_first_byte() {
        let t0 = Instant::now();
        let slow = Snapshot {
            in_flight: 0,
            head_since: Some(at(t0, 100)),
            idle_since: t0,
        };
        // Idle 100 s, then a head that dribbles: the header bound counts from its first byte,
        // and the idle bound no longer applies.
        assert_eq!(
            next(slow, at(t0, 105), HEADER, IDLE),
            Next::CheckAt(at(t0, 110))
        );
        assert_eq!(next(slow, at(t0, 110), HEADER, IDLE), Next::Drop);
        assert_eq!(next(slow, at(t0, 200), HEADER, IDLE), Next::Drop);
    }

    #[test]
    fn a_request_in_flight_is_left_to_its_deadline() {
        let t0 = Instant::now();
        let busy = Snapshot {
            in_flight: 1,
            head_since: None,
            idle_since: t0,
        };
        assert_eq!(
            next(busy, at(t0, 500), HEADER, IDLE),
            Next::CheckAt(at(t0, 510))
        );
    }

    #[test]
    fn activity_follows_a_request_from_its_first_byte_to_its_answer() {
        let a = Activity::new();
        a.read_some();
        let head = a.snapshot().head_since.expect("a head begun");
        // More bytes of the same head do not move its start.
        a.read_some();
        assert_eq!(a.snapshot().head_since, Some(head));
        a.request_began();
        // The body's bytes, read while the request is in flight, begin nothing.
        a.read_some();
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.head_since), (1, None));
        a.answered();
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.head_since), (0, None));
        assert!(s.idle_since >= head);
    }
}
