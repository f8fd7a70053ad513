//! The real binary against a (slow) cluster: SIGTERM under load answers every accepted request,
//! readiness fails first, the process exits 0, and every decision was logged as JSON. The
//! cluster is a real kube-apiserver; the fault proxy in front of it makes it slow on cue.

mod support;

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use handoff::certs::Ca;
use support::apiserver::skip;
use support::fault_proxy::start_with_crd;
use support::https::{Client, Proto, fixture};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Poll `check` until it holds; the minute only bounds a test that would otherwise hang.
async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// GET over plain HTTP/1.1 (the metrics port); the status code, or None if refused.
fn plain_get(port: u16, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn sigterm_under_load_answers_every_accepted_request() {
    if skip() {
        return;
    }
    let (_api, proxy) = start_with_crd().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = proxy.kubeconfig(dir.path());
    let ca = Ca::new("drain CA", 1).unwrap();
    let (cert, key) = ca
        .serving_cert(&["localhost".into()], &["127.0.0.1".parse().unwrap()], 1)
        .unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), key).unwrap();
    let (port, metrics_port) = (free_port(), free_port());

    let mut child = Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["--log-format", "json", "serve"])
        // These decisions are allows, which are logged at debug.
        .env("RUST_LOG", "info,handoff::decision=debug")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .args([
            "--drain-delay",
            "300ms",
            "--drain-timeout",
            "120s",
            "--api-timeout",
            "60s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let mut ready = false;
    for _ in 0..300 {
        if plain_get(metrics_port, "/readyz") == Some(200) {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !ready {
        let exited = child.try_wait();
        let _ = child.kill();
        panic!(
            "never ready: {:?} {exited:?}\n{}\nAPI requests: {:?}",
            plain_get(metrics_port, "/readyz"),
            log.join().unwrap(),
            proxy.requests()
        );
    }

    // Every decision waits on its read of the API server (cache misses), which the proxy holds
    // until the test has seen the listener close: all of them are in flight through the
    // drain, however slow the machine.
    proxy.hold(Some("GET /api/v1/namespaces/kcp-unseen-"));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut inflight = Vec::new();
    for i in 0..16 {
        let ca_pem = ca.cert_pem.clone();
        let proto = if i % 2 == 0 { Proto::H1 } else { Proto::H2 };
        let mut review: serde_json::Value =
            serde_json::from_slice(&fixture("delete-configmap-by-syncer.json")).unwrap();
        review["request"]["namespace"] = format!("kcp-unseen-{i}").into();
        review["request"]["uid"] = format!("drain-{i}").into();
        let mut c = Client::connect(addr, &ca_pem, proto, None).await.unwrap();
        inflight.push(tokio::spawn(async move {
            c.send(
                "POST",
                "/validate/sync-finalizer?timeout=30s",
                Some("application/json"),
                serde_json::to_vec(&review).unwrap(),
            )
            .await
        }));
    }
    wait_until("all 16 decisions waiting on their reads", || {
        proxy.held() == 16
    })
    .await;
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );

    // Readiness fails first, while requests are still being answered.
    wait_until("readiness to fail on SIGTERM", || {
        plain_get(metrics_port, "/readyz") == Some(503)
    })
    .await;
    // The listener closes after the drain delay, while every request waits.
    let mut closed = false;
    for _ in 0..6000 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(closed, "the listener stayed open");
    assert!(
        inflight.iter().all(|r| !r.is_finished()),
        "requests finished before the listener closed: the drain was not exercised"
    );
    proxy.hold(None);
    for (i, r) in inflight.into_iter().enumerate() {
        let reply = r
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("request {i} was accepted but not answered: {e}"));
        assert_eq!(reply.status, 200, "request {i}");
        assert_eq!(reply.json()["response"]["uid"], format!("drain-{i}"));
    }

    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        Client::connect(addr, &ca.cert_pem, Proto::H1, None)
            .await
            .is_err(),
        "the listener is closed"
    );

    // One JSON event per decision, with what an operator searches by.
    let log = log.join().unwrap();
    let decisions: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "decision")
        .collect();
    assert_eq!(decisions.len(), 16, "{log}");
    let d = &decisions[0];
    for field in [
        "webhook",
        "uid",
        "user",
        "operation",
        "resource",
        "namespace",
        "name",
        "verdict",
        "reason",
        "latency_us",
    ] {
        assert!(d.get(field).is_some(), "decision log lacks {field}: {d}");
    }
    assert_eq!(
        d["user"],
        "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw"
    );
    assert!(log.contains("all connections drained"), "{log}");
}

/// From the start of the drain (while the listener still accepts, for the drain delay), clients
/// are moved off the server without a race: an HTTP/1.1 answer says `Connection: close` and the
/// connection is closed after it, so a pooled connection is never written to as the server
/// closes it (the API server's `EOF`); an HTTP/2 connection gets a GOAWAY at once. New
/// connections are still served until the listener closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_moves_clients_off_before_the_listener_closes() {
    use support::https::{TestServer, fixture_state};
    let server = TestServer::start(fixture_state()).await;
    let mut h1 = server.connect(Proto::H1).await;
    let mut h2 = server.connect(Proto::H2).await;
    let before = h1.get("/healthz").await;
    assert_eq!(before.status, 200);
    assert_eq!(before.connection, None, "keep-alive before the drain");
    assert_eq!(h2.get("/healthz").await.status, 200);

    server.app.health.start_drain();
    // HTTP/2: the GOAWAY arrives without any request.
    closed_within(&h2, "no GOAWAY on the HTTP/2 connection").await;
    // HTTP/1.1: the next answer is still given, and says the connection ends with it.
    let during = h1.get("/healthz").await;
    assert_eq!(
        during.status,
        200,
        "answered while draining: {}",
        during.text()
    );
    assert_eq!(during.connection.as_deref(), Some("close"));
    closed_within(
        &h1,
        "the HTTP/1.1 connection stayed open after Connection: close",
    )
    .await;
    // The listener is still open: a new client is served (and told to go too).
    let mut late = server.connect(Proto::H1).await;
    let r = late
        .review(
            "/validate/sync-finalizer",
            fixture("delete-configmap-by-syncer.json"),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.connection.as_deref(), Some("close"));
    let mut late2 = server.connect(Proto::H2).await;
    let r = late2
        .review(
            "/validate/sync-finalizer",
            fixture("delete-configmap-by-syncer.json"),
        )
        .await;
    assert_eq!(
        r.status, 200,
        "an HTTP/2 client that connects during the drain is answered"
    );
    assert_eq!(r.connection, None, "no Connection header on HTTP/2");
    assert_eq!(
        late2.get("/healthz").await.status,
        200,
        "and kept until the listener closes"
    );
    server.stop().await;
}

/// Wait (up to 5 s) for the server to end `client`'s connection.
async fn closed_within(client: &Client, what: &str) {
    let mut waited = Duration::ZERO;
    while !client.is_closed() {
        assert!(waited < Duration::from_secs(5), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
}
