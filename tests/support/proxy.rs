//! What the test proxies in front of a real API server share (`fault_proxy.rs`, `kcp.rs`): a
//! loopback listener served from a runtime of its own, plain HTTP/1.1 towards handoff, and
//! requests forwarded over HTTPS as the API server's admin through kube's client.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::UnsyncBoxBody};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Out = http::Response<UnsyncBoxBody<Bytes, BoxError>>;

pub struct Proxy {
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Serve `handle` on a free loopback port. `kubeconfig` is the admin's, parsed by the caller
    /// (on its own thread: a test's kubectl calls may rewrite the file); `retry` keeps kube's
    /// retry of 503s.
    pub fn start<H, F>(kubeconfig: kube::config::Kubeconfig, retry: bool, handle: H) -> Proxy
    where
        H: Fn(http::Request<hyper::body::Incoming>, kube::Client) -> F
            + Clone
            + Send
            + Sync
            + 'static,
        F: std::future::Future<Output = Out> + Send + 'static,
    {
        let listener =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("proxy listener");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        // A runtime of its own: a proxy serves sync tests and outlives any test's runtime.
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve(listener, kubeconfig, retry, handle, stop_rx));
            // Whatever is still running (watch streams) goes with the runtime.
            rt.shutdown_background();
        });
        Proxy {
            port,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig for `server` (this proxy's URL, or a path under it) at `path`, with a
    /// token the proxy ignores.
    pub fn write_kubeconfig(&self, path: &Path, server: &str, namespace: Option<&str>) -> PathBuf {
        let namespace = namespace.map_or(String::new(), |ns| format!("    namespace: {ns}\n"));
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: {server}\nusers:\n- name: handoff\n  user:\n    token: ignored-by-the-proxy\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: handoff\n{namespace}current-context: proxy\n"
            ),
        )
        .expect("proxy kubeconfig");
        path.to_path_buf()
    }

    /// The listener and every connection close, open watches included.
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve<H, F>(
    listener: std::net::TcpListener,
    kubeconfig: kube::config::Kubeconfig,
    retry: bool,
    handle: H,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) where
    H: Fn(http::Request<hyper::body::Incoming>, kube::Client) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Out> + Send + 'static,
{
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("client config");
    config.default_retry = retry;
    let client = kube::Client::try_from(config).expect("client");
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let (client, handle) = (client.clone(), handle.clone());
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let reply = handle(req, client.clone());
                        async move { Ok::<_, Infallible>(reply.await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
    // Dropping the set aborts every connection, open watches included.
    connections.abort_all();
}

/// A `Status` answer, as the API server writes one.
pub fn status(code: u16, reason: &str, message: &str) -> Out {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
    .to_string();
    http::Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .expect("response")
}

pub enum ForwardError {
    /// The client's request body could not be read.
    Body(String),
    /// The API server could not be reached.
    Send(String),
}

/// `method target` with the request's body and its `Accept` and `Content-Type`, to the API
/// server; its answer as it gives it (the body still streaming).
pub async fn forward(
    client: &kube::Client,
    parts: &http::request::Parts,
    target: &str,
    body: hyper::body::Incoming,
) -> Result<http::Response<kube::client::Body>, ForwardError> {
    let body = body
        .collect()
        .await
        .map_err(|e| ForwardError::Body(e.to_string()))?
        .to_bytes();
    forward_bytes(client, parts, target, body).await
}

/// `forward`, with the request's body read already.
pub async fn forward_bytes(
    client: &kube::Client,
    parts: &http::request::Parts,
    target: &str,
    body: Bytes,
) -> Result<http::Response<kube::client::Body>, ForwardError> {
    let mut request = http::Request::builder()
        .method(parts.method.clone())
        .uri(target);
    for h in [http::header::ACCEPT, http::header::CONTENT_TYPE] {
        if let Some(v) = parts.headers.get(&h) {
            request = request.header(h, v);
        }
    }
    let request = request
        .body(kube::client::Body::from(body.to_vec()))
        .expect("request");
    client
        .send(request)
        .await
        .map_err(|e| ForwardError::Send(e.to_string()))
}

/// The API server's answer to the client, headers and status as given, the body streamed as it
/// comes (a watch) until `until` completes.
pub fn relay(
    response: http::Response<kube::client::Body>,
    until: impl std::future::Future<Output = ()> + Send + 'static,
) -> Out {
    use futures::StreamExt as _;
    let (parts, body) = response.into_parts();
    let mut out = http::Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        // The body is re-framed here; the server's framing headers do not apply.
        if name != http::header::CONTENT_LENGTH
            && name != http::header::TRANSFER_ENCODING
            && name != http::header::CONNECTION
        {
            out = out.header(name, value);
        }
    }
    let stream = body
        .into_data_stream()
        .map(|chunk| {
            chunk
                .map(hyper::body::Frame::data)
                .map_err(|e| Box::new(e) as BoxError)
        })
        .take_until(until);
    out.body(http_body_util::StreamBody::new(stream).boxed_unsync())
        .expect("response")
}

/// A request's method and `path?query` as sent, and whether it writes (POST, PUT, PATCH,
/// DELETE).
pub fn request_line<B>(req: &http::Request<B>) -> (http::Method, String, bool) {
    let method = req.method().clone();
    let target = req
        .uri()
        .path_and_query()
        .map_or("/".to_string(), |p| p.as_str().to_string());
    // A server-side dry run (`dryRun=All`) changes nothing: no write to count, fail or kill
    // before (`wait_policy_in_force` makes as many as the API server's policy cache needs).
    let write = matches!(
        method,
        http::Method::POST | http::Method::PUT | http::Method::PATCH | http::Method::DELETE
    ) && !target.contains("dryRun=All");
    (method, target, write)
}
