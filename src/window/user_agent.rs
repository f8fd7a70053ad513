//! Who makes each request: `handoff/<version>`, and while `handoff move` performs a step,
//! `handoff/<version> (move step StopTarget)` (a backup's and a restore's: `(backup step Stop)`,
//! `(restore step RunClusterctl)`). The API server's audit log then names the step behind each
//! of handoff's writes, and so does the crash suite's proxy, which kills handoff at the first
//! write of each step (`tests/capi/crash.rs`): a new step is a new crash point.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{HeaderValue, Request, header::USER_AGENT};
use tower::{Layer, Service};

use crate::window::plan::declare::{Of, StepName};

/// The step performed now, shared by the driver (which sets it) and the clients' layer
/// (which says it).
#[derive(Clone, Debug, Default)]
pub struct StepLabel(Arc<Mutex<Option<(&'static str, &'static str)>>>);

impl StepLabel {
    /// `of` performs `step` from now on.
    pub fn set(&self, of: Of, step: impl StepName) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((of.as_str(), step.as_str()));
    }

    /// The User-Agent of a request sent now.
    pub fn user_agent(&self) -> String {
        let version = env!("CARGO_PKG_VERSION");
        match *self.0.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((of, step)) => format!("handoff/{version} ({of} step {step})"),
            None => format!("handoff/{version}"),
        }
    }

    /// The layer that puts it on every request of a client
    /// (`kube::client::ClientBuilder::with_layer`).
    pub fn layer(&self) -> UserAgentLayer {
        UserAgentLayer(self.clone())
    }
}

#[derive(Clone)]
pub struct UserAgentLayer(StepLabel);

impl<S> Layer<S> for UserAgentLayer {
    type Service = UserAgent<S>;

    fn layer(&self, inner: S) -> UserAgent<S> {
        UserAgent {
            inner,
            label: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct UserAgent<S> {
    inner: S,
    label: StepLabel,
}

impl<S, B> Service<Request<B>> for UserAgent<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        if let Ok(v) = HeaderValue::from_str(&self.label.user_agent()) {
            req.headers_mut().insert(USER_AGENT, v);
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_says_the_step_performed_when_it_was_sent() {
        let label = StepLabel::default();
        let mut svc = label
            .layer()
            .layer(tower::service_fn(|req: Request<()>| async move {
                Ok::<_, std::convert::Infallible>(
                    req.headers()[USER_AGENT].to_str().unwrap().to_string(),
                )
            }));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut send = || runtime.block_on(svc.call(Request::new(()))).unwrap();
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(send(), format!("handoff/{version}"));
        label.set(
            Of::Move,
            crate::window::plan::move_next::StepName::StopTarget,
        );
        assert_eq!(send(), format!("handoff/{version} (move step StopTarget)"));
        label.set(
            Of::Backup,
            crate::window::plan::directory_plan::DirectoryStep::WaitUnblocked,
        );
        assert_eq!(
            send(),
            format!("handoff/{version} (backup step WaitUnblocked)")
        );
    }
}
