//! The listener: TLS per connection, HTTP/2 or HTTP/1.1 by ALPN, and the drain (connections
//! told to go from `Health::start_drain`, the listener closed at `shutdown`, in-flight requests
//! finished within `drain_timeout`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use super::keep_alive::{Activity, Next, Watched};
use super::{App, Health, Limits, health_router};

/// Serve HTTPS on `listener` until `shutdown` resolves, then drain: stop accepting, let
/// in-flight requests finish (at most `drain_timeout`), and return. From `Health::start_drain`
/// on (before `shutdown`, by the drain delay), connections are already being moved away.
pub async fn run(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: Router,
    health: Arc<Health>,
    limits: &Limits,
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
            limits.clone(),
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
    limits: Limits,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
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
    // hyper's header bound would close idle keep-alive connections too: `keep_alive` bounds
    // the two apart.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.h2_keep_alive_interval)
        .keep_alive_timeout(limits.h2_keep_alive_timeout);
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
    let activity = (!h2).then(Activity::new);
    let svc = TowerToHyperService::new(watch_requests(
        close_when_draining(service, health, h2),
        activity.clone(),
    ));
    let conn = builder.serve_connection(TokioIo::new(Watched::new(tls, activity.clone())), svc);
    let bounds = async {
        match &activity {
            Some(a) => {
                a.passed(limits.header_read_timeout, limits.idle_timeout)
                    .await
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(conn);
    tokio::pin!(drain_started);
    tokio::pin!(bounds);
    // HTTP/2 is told to go at the start of the drain; HTTP/1.1 is told with each answer
    // (`close_when_draining`) and what is left idle is closed with the listener.
    let mut told = false;
    let result = loop {
        tokio::select! {
            r = conn.as_mut() => break r,
            passed = &mut bounds, if !told => match passed {
                Next::Drop => {
                    tracing::debug!(%peer, timeout = ?limits.header_read_timeout, "request headers not read in time; connection dropped");
                    return;
                }
                _ => {
                    tracing::debug!(%peer, timeout = ?limits.idle_timeout, "idle connection closed");
                    conn.as_mut().graceful_shutdown();
                    told = true;
                }
            },
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

type Incoming = http::Request<hyper::body::Incoming>;

/// Each request handed to the service and each answer, noted in an HTTP/1.1 connection's
/// `Activity`.
fn watch_requests<S>(
    service: S,
    activity: Option<Arc<Activity>>,
) -> tower::util::MapResponse<
    tower::util::MapRequest<S, impl FnMut(Incoming) -> Incoming + Clone>,
    impl FnOnce(Response) -> Response + Clone,
>
where
    S: tower::Service<Incoming, Response = Response> + Clone,
{
    use tower::ServiceExt as _;
    let began = activity.clone();
    service
        .map_request(move |r| {
            if let Some(a) = &began {
                a.request_began();
            }
            r
        })
        .map_response(move |r| {
            if let Some(a) = &activity {
                a.answered();
            }
            r
        })
}

/// On an HTTP/1.1 connection, every answer given while draining says `Connection: close`, so
/// the client closes the connection after reading it instead of pooling it.
fn close_when_draining(
    service: Router,
    health: Arc<Health>,
    h2: bool,
) -> tower::util::MapResponse<Router, impl FnOnce(Response) -> Response + Clone> {
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
