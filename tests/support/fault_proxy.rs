//! A fault-injecting, request-logging HTTP proxy in front of a real kube-apiserver.
//!
//! It exists only for what a real API server cannot do on cue:
//! - log every request handoff makes (`METHOD /path?query`, in arrival order, with a place in
//!   one sequence shared by every proxy of the test binary), so a test can count reads, writes
//!   and watches, and order the writes made to two clusters;
//! - answer slowly (`set_latency`): a loaded API server;
//! - be unavailable (`set_unavailable`): every request is answered `503` with a `Status` body, as
//!   a load balancer in front of a kube-apiserver that went away answers, and every open watch
//!   stream ends, so watchers reconnect and meet the 503s. A 503 rather than a refused
//!   connection: the proxy keeps logging what handoff still asks while the server is away;
//! - refuse writes after N (`fail_writes_after`): POST, PUT, PATCH and DELETE past the N-th are
//!   answered 503 without reaching the server, so to the cluster the client died after its
//!   N-th write;
//! - fail the watchers alone (`fail_watches`): every watch request and every watcher's list
//!   (kube-runtime's watcher pages its lists, `limit=`) is answered 503 and every open watch
//!   stream ends, while a decision's reads (one object, or an unpaged list) and writes pass: a
//!   watch that broke while the server answers (a connection reset, a timeout on the watch alone);
//! - hold requests (`hold`): those whose `METHOD /path?query` contains a pattern wait, unlogged
//!   by the server, until the hold is lifted, so a test orders what it races (one watch failing
//!   after the others, eight requests waiting on one read) by the state it sees, not by time;
//! - act right after the server answered a request (`after_answer`): a write of someone else's
//!   that lands after the client read the state and before it can look again, whatever the
//!   machine's speed.
//!
//! Everything else (storage, validation, defaulting, admission, watches, patches) is the real
//! server's. A frozen watch connection is `FreezingProxy` in `apiserver.rs`.
//!
//! It speaks plain HTTP/1.1 to handoff on loopback (the kubeconfig it writes carries a token it
//! ignores) and forwards over HTTPS as the API server's admin, streaming bodies so that watches
//! work. The clients it hands out have kube's retry of 503s switched off: kube would retry a 503
//! for minutes and hide the outage a test makes. The `handoff` binary, given `kubeconfig`, keeps
//! kube's defaults. Every request reaches the server as the admin: the proxy is not where RBAC
//! is tested (`tests/apiserver.rs` is).
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::apiserver::{ADMIN, ApiServer};
use super::proxy::{ForwardError, Out, Proxy, forward, relay, request_line};

/// One sequence across every proxy in the process: a test orders the writes to two clusters.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone)]
pub struct Logged {
    pub seq: u64,
    pub write: bool,
    /// `METHOD /path?query`, the query as sent (percent-encoded).
    pub line: String,
}

/// What `after_answer` runs: the request line and the proxy's own client (the server's admin).
pub type AfterAnswer =
    Arc<dyn Fn(String, kube::Client) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

struct Faults {
    log: Mutex<Vec<Logged>>,
    /// A request line's prefix, and what to run once the server answered such a request.
    after: Mutex<Option<(String, AfterAnswer)>>,
    latency_ms: AtomicU64,
    unavailable: tokio::sync::watch::Sender<bool>,
    /// Writes still let through; negative: all of them.
    write_budget: AtomicI64,
    watches_down: tokio::sync::watch::Sender<bool>,
    /// Requests whose line contains this wait until it is `None` (or another pattern).
    hold: tokio::sync::watch::Sender<Option<String>>,
    /// Requests waiting at the hold now.
    held: AtomicU64,
}

pub struct FaultProxy {
    pub port: u16,
    faults: Arc<Faults>,
    proxy: Proxy,
}

impl FaultProxy {
    /// In front of `api`, on a free loopback port, forwarding as its admin.
    pub fn start(api: &ApiServer) -> FaultProxy {
        // Parsed now, on the caller's thread: the test's own kubectl calls rewrite the file.
        let kubeconfig =
            kube::config::Kubeconfig::read_from(api.kubeconfig(ADMIN)).expect("admin kubeconfig");
        let faults = Arc::new(Faults {
            log: Mutex::new(Vec::new()),
            after: Mutex::new(None),
            latency_ms: AtomicU64::new(0),
            unavailable: tokio::sync::watch::Sender::new(false),
            write_budget: AtomicI64::new(-1),
            watches_down: tokio::sync::watch::Sender::new(false),
            hold: tokio::sync::watch::Sender::new(None),
            held: AtomicU64::new(0),
        });
        let f = faults.clone();
        // What the server answers is what handoff sees: no retries on its behalf.
        let proxy = Proxy::start(kubeconfig, false, move |req, client| {
            handle(req, client, f.clone())
        });
        FaultProxy {
            port: proxy.port,
            faults,
            proxy,
        }
    }

    pub fn url(&self) -> String {
        self.proxy.url()
    }

    /// A `kube::Config` for the proxy, without kube's retry of 503s.
    pub fn config(&self) -> kube::Config {
        let mut config = kube::Config::new(self.url().parse().expect("proxy url"));
        config.default_retry = false;
        config
    }

    /// A client for handoff's code, through the proxy.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("proxy client")
    }

    /// A kubeconfig for the proxy (for the `handoff` binary), written into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        self.proxy.write_kubeconfig(
            &dir.join(format!("fault-proxy-kubeconfig-{}", self.port)),
            &self.url(),
            Some("default"),
        )
    }

    /// Delay every request by `d` before it is forwarded.
    pub fn set_latency(&self, d: Duration) {
        self.faults
            .latency_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// While true: 503 to every request, and every open watch stream ends.
    pub fn set_unavailable(&self, yes: bool) {
        self.faults.unavailable.send_replace(yes);
    }

    /// Let `n` more writes through, then answer every write 503 until `None`.
    pub fn fail_writes_after(&self, n: Option<u64>) {
        self.faults
            .write_budget
            .store(n.map_or(-1, |n| n as i64), Ordering::SeqCst);
    }

    /// While true: 503 to every watch request and every watcher's (paged) list, and every open
    /// watch stream ends; other reads and writes pass.
    pub fn fail_watches(&self, yes: bool) {
        self.faults.watches_down.send_replace(yes);
    }

    /// Hold every request whose `METHOD /path?query` contains `pattern` until `hold(None)`
    /// (logged when it arrives, forwarded when released).
    pub fn hold(&self, pattern: Option<&str>) {
        self.faults.hold.send_replace(pattern.map(str::to_string));
    }

    /// How many requests wait at the hold now.
    pub fn held(&self) -> u64 {
        self.faults.held.load(Ordering::SeqCst)
    }

    /// Once the server has answered a request whose line (`METHOD /path?query`) starts with
    /// `prefix`, run `hook` and only then pass the answer on: the client has read the state as
    /// it was before the hook's writes, and its next request comes after them. `None` clears it.
    pub fn after_answer(&self, hook: Option<(&str, AfterAnswer)>) {
        *self.faults.after.lock().unwrap_or_else(|e| e.into_inner()) =
            hook.map(|(prefix, h)| (prefix.to_string(), h));
    }

    fn log(&self) -> Vec<Logged> {
        self.faults
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every request so far, refused ones included.
    pub fn requests(&self) -> Vec<String> {
        self.log().into_iter().map(|l| l.line).collect()
    }

    /// The writes (POST, PUT, PATCH, DELETE) so far, refused ones included.
    pub fn writes(&self) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.write)
            .map(|l| l.line)
            .collect()
    }

    /// The writes with their place in the process-wide sequence.
    pub fn sequenced_writes(&self) -> Vec<(u64, String)> {
        self.log()
            .into_iter()
            .filter(|l| l.write)
            .map(|l| (l.seq, l.line))
            .collect()
    }

    pub fn stop(&mut self) {
        self.proxy.stop();
    }
}

fn unavailable(message: &str) -> Out {
    super::proxy::status(503, "ServiceUnavailable", message)
}

async fn handle(
    req: http::Request<hyper::body::Incoming>,
    client: kube::Client,
    faults: Arc<Faults>,
) -> Out {
    let (method, target, write) = request_line(&req);
    let line = format!("{method} {target}");
    faults
        .log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Logged {
            seq: SEQUENCE.fetch_add(1, Ordering::SeqCst),
            write,
            line: line.clone(),
        });
    let holds = |p: &Option<String>| p.as_deref().is_some_and(|p| line.contains(p));
    if holds(&faults.hold.borrow()) {
        faults.held.fetch_add(1, Ordering::SeqCst);
        let _ = faults.hold.subscribe().wait_for(|p| !holds(p)).await;
        faults.held.fetch_sub(1, Ordering::SeqCst);
    }
    let latency = faults.latency_ms.load(Ordering::SeqCst);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    if *faults.unavailable.borrow() {
        return unavailable("the API server is unavailable (FaultProxy::set_unavailable)");
    }
    let watch = target.contains("watch=true") || target.contains("watch=1");
    let watchers_list = method == "GET" && target.contains("limit=");
    if (watch || watchers_list) && *faults.watches_down.borrow() {
        return unavailable("the watch is refused (FaultProxy::fail_watches)");
    }
    if write {
        // Taken only while positive: a refused write leaves the budget at 0.
        let let_through = faults
            .write_budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| match b {
                0 => None,
                b if b > 0 => Some(b - 1),
                b => Some(b),
            })
            .is_ok();
        if !let_through {
            return unavailable("the proxy refuses further writes (FaultProxy::fail_writes_after)");
        }
    }
    let (parts, body) = req.into_parts();
    let response = match forward(&client, &parts, &target, body).await {
        Ok(r) => r,
        Err(ForwardError::Body(e)) => {
            return unavailable(&format!("reading the request body: {e}"));
        }
        Err(ForwardError::Send(e)) => return unavailable(&format!("forwarding: {e}")),
    };
    let after = faults
        .after
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .filter(|(prefix, _)| line.starts_with(prefix.as_str()))
        .map(|(_, hook)| hook.clone());
    if let Some(hook) = after {
        hook(line, client.clone()).await;
    }
    // Streamed as it comes (a watch), until the proxy is made unavailable (or, for a watch,
    // until watches fail).
    let (mut gone, mut watches_down) = (
        faults.unavailable.subscribe(),
        faults.watches_down.subscribe(),
    );
    relay(response, async move {
        let server_gone = gone.wait_for(|u| *u);
        let watch_gone = async {
            match watch {
                true => drop(watches_down.wait_for(|d| *d).await),
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = server_gone => {}
            _ = watch_gone => {}
        }
    })
}

/// A new API server with the MoveWindow CRD, and a proxy in front of it. Starting one blocks
/// for seconds: done off the calling test's runtime.
pub async fn start_with_crd() -> (ApiServer, FaultProxy) {
    tokio::task::spawn_blocking(|| {
        let api = ApiServer::start();
        api.install_crd();
        let proxy = FaultProxy::start(&api);
        (api, proxy)
    })
    .await
    .expect("API server start")
}
