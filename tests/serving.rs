//! Production serving: certificate rotation, limits, panics, metrics, client certificates.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use handoff::certs::Ca;
use handoff::server::Limits;
use handoff::state::State;
use rustls::pki_types::ServerName;
use support::https::{BOTH, Client, Options, Proto, TestServer, fixture, fixture_state};

const GUARD: &str = "/validate/sync-finalizer";

/// Lay out a Secret volume as the kubelet does: `..<version>/` holds the files, `..data` links
/// to it, and `tls.crt`/`tls.key` link through `..data`.
fn kubelet_volume(dir: &Path, version: &str, cert: &str, key: &str) {
    let v = dir.join(format!("..{version}"));
    std::fs::create_dir_all(&v).unwrap();
    std::fs::write(v.join("tls.crt"), cert).unwrap();
    std::fs::write(v.join("tls.key"), key).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    // The atomic swap: rename the new link over the old one.
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        if std::fs::symlink_metadata(dir.join(f)).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
    }
}

/// The leaf certificate a fresh TLS connection is served.
async fn served_cert(addr: std::net::SocketAddr, ca_pem: &str) -> Result<Vec<u8>, String> {
    let cfg = support::https::tls_client_config(ca_pem, Proto::H1, None);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    Ok(tls.get_ref().1.peer_certificates().unwrap()[0].to_vec())
}

fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

fn leaf(ca: &Ca) -> (String, String) {
    ca.serving_cert(&["localhost".into()], &["127.0.0.1".parse().unwrap()], 1)
        .unwrap()
}

/// What the load was served: answers by server certificate, and each change of certificate
/// one load task saw between two of its answers in a row.
#[derive(Default)]
struct Served {
    by_cert: std::collections::HashMap<Vec<u8>, usize>,
    swaps: std::collections::HashSet<(Vec<u8>, Vec<u8>)>,
}

/// Until the load has had 20 answers under `cert`.
async fn served_under(served: &std::sync::Mutex<Served>, cert: &[u8]) {
    for _ in 0..1500 {
        if served
            .lock()
            .unwrap()
            .by_cert
            .get(cert)
            .copied()
            .unwrap_or(0)
            >= 20
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the load was never answered 20 times under the certificate");
}

async fn wait_for_cert(addr: std::net::SocketAddr, ca: &str, want: &[u8]) {
    for _ in 0..250 {
        if served_cert(addr, ca).await.ok().as_deref() == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the new certificate was never served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_by_symlink_swap_twice_under_load() {
    let ca = Ca::new("rotation CA", 1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (c1, k1) = leaf(&ca);
    kubelet_volume(dir.path(), "v1", &c1, &k1);
    let opts = Options {
        cert_files: Some((dir.path().join("tls.crt"), dir.path().join("tls.key"))),
        ..Options::default()
    };
    let server = TestServer::start_with(Arc::new(fixture_state()), opts).await;
    let addr = server.addr;
    assert_eq!(served_cert(addr, &ca.cert_pem).await.unwrap(), der_of(&c1));

    // Continuous load: new connections (each a handshake) and a review on each. Each task
    // notes the certificate each answered request was served with, and where it changed
    // between two of its requests in a row: a swap the load went through without a failure.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(std::sync::Mutex::new(Served::default()));
    let failed = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut load = Vec::new();
    for i in 0..4 {
        let (stop, served, failed, ca_pem) = (
            stop.clone(),
            served.clone(),
            failed.clone(),
            ca.cert_pem.clone(),
        );
        load.push(tokio::spawn(async move {
            let proto = if i % 2 == 0 { Proto::H1 } else { Proto::H2 };
            let body = fixture("delete-configmap-by-syncer.json");
            let mut last: Option<Vec<u8>> = None;
            while !stop.load(Ordering::Relaxed) {
                let result = async {
                    let mut c = Client::connect(addr, &ca_pem, proto, None).await?;
                    let r = c
                        .send("POST", GUARD, Some("application/json"), body.clone())
                        .await?;
                    match (r.status, c.peer) {
                        (200, Some(peer)) => Ok(peer),
                        (200, None) => Err("no server certificate".to_string()),
                        (status, _) => Err(format!("status {status}")),
                    }
                }
                .await;
                match result {
                    Ok(peer) => {
                        let mut s = served.lock().unwrap();
                        *s.by_cert.entry(peer.clone()).or_default() += 1;
                        if let Some(before) = last.replace(peer.clone())
                            && before != peer
                        {
                            s.swaps.insert((before, peer));
                        }
                    }
                    Err(e) => failed.lock().unwrap().push(e),
                }
            }
        }));
    }

    // Each swap once the load has been served under the certificate before it: waited for by
    // what was served, not by the clock.
    let (c2, k2) = leaf(&ca);
    let (c3, k3) = leaf(&ca);
    let certs = [der_of(&c1), der_of(&c2), der_of(&c3)];
    for (version, cert, key, before) in [("v2", &c2, &k2, 0), ("v3", &c3, &k3, 1)] {
        served_under(&served, &certs[before]).await;
        kubelet_volume(dir.path(), version, cert, key);
        wait_for_cert(addr, &ca.cert_pem, &certs[before + 1]).await;
    }
    served_under(&served, &certs[2]).await;

    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let failed = failed.lock().unwrap().clone();
    assert!(
        failed.is_empty(),
        "{} failed handshakes or requests: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let served = std::mem::take(&mut *served.lock().unwrap());
    for (old, new) in [(0, 1), (1, 2)] {
        assert!(
            served
                .swaps
                .contains(&(certs[old].clone(), certs[new].clone())),
            "no load task went from certificate {} to {} between two requests: {:?}",
            old + 1,
            new + 1,
            served.by_cert.values().collect::<Vec<_>>()
        );
    }
    assert_eq!(server.app.metrics.cert_reloads.get(), 2);
    assert_eq!(server.app.metrics.cert_reload_errors.get(), 0);
    server.stop().await;
}

#[tokio::test]
async fn a_corrupt_or_mismatched_new_pair_keeps_the_last_good_one() {
    let ca = Ca::new("rotation CA", 1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (c1, k1) = leaf(&ca);
    kubelet_volume(dir.path(), "v1", &c1, &k1);
    let opts = Options {
        cert_files: Some((dir.path().join("tls.crt"), dir.path().join("tls.key"))),
        ..Options::default()
    };
    let server = TestServer::start_with(Arc::new(fixture_state()), opts).await;
    let errors = || server.app.metrics.cert_reload_errors.get();

    kubelet_volume(
        dir.path(),
        "bad1",
        &c1,
        // A PEM block that is not a key (spelt out in pieces so no key-shaped text is committed).
        &format!(
            "-----BEGIN {0} KEY-----\ngarbage\n-----END {0} KEY-----\n",
            "PRIVATE"
        ),
    );
    for _ in 0..250 {
        if errors() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(errors(), 1, "the corrupt pair was noticed once");
    assert_eq!(
        served_cert(server.addr, &ca.cert_pem).await.unwrap(),
        der_of(&c1)
    );

    // A valid certificate with another certificate's key.
    let (c2, _) = leaf(&ca);
    let (_, k3) = leaf(&ca);
    kubelet_volume(dir.path(), "bad2", &c2, &k3);
    for _ in 0..250 {
        if errors() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(errors(), 2, "the mismatched pair was rejected");
    assert_eq!(
        served_cert(server.addr, &ca.cert_pem).await.unwrap(),
        der_of(&c1)
    );

    // A good pair again is picked up.
    let (c4, k4) = leaf(&ca);
    kubelet_volume(dir.path(), "v4", &c4, &k4);
    wait_for_cert(server.addr, &ca.cert_pem, &der_of(&c4)).await;
    server.stop().await;
}

/// An "API server" that accepts connections and never answers.
async fn black_hole() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

async fn stuck_state() -> State {
    let addr = black_hole().await;
    let mut cfg = kube::Config::new(format!("http://{addr}").parse().unwrap());
    cfg.default_retry = false;
    let mut state = State::new(Default::default());
    state.client = Some(kube::Client::try_from(cfg).unwrap());
    state.api_timeout = Duration::from_secs(60);
    state
}

/// A syncer delete in a namespace nobody has seen: the lookup goes to the stuck API server.
fn stuck_review() -> Vec<u8> {
    let mut v: serde_json::Value =
        serde_json::from_slice(&fixture("delete-configmap-by-syncer.json")).unwrap();
    v["request"]["namespace"] = "kcp-nobody-has-seen".into();
    serde_json::to_vec(&v).unwrap()
}

#[tokio::test]
async fn a_slow_decision_is_answered_within_the_api_servers_timeout() {
    let server = TestServer::start_with(Arc::new(stuck_state().await), Options::default()).await;
    let mut c = server.connect(Proto::H2).await;
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        c.review(&format!("{GUARD}?timeout=1s"), stuck_review()),
    )
    .await
    .expect("answered, not hung");
    assert_eq!(reply.status, 200);
    let r = &reply.json()["response"];
    assert_eq!(r["allowed"], false);
    assert_eq!(r["auditAnnotations"]["reason"], "deadline");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("could not decide within 800ms"),
        "{r}"
    );
    server.stop().await;
}

/// The wait for a slot counts against the API server's timeout: a request whose deadline
/// comes before `--queue-timeout` is answered by its deadline, not left queued past it.
#[tokio::test]
async fn the_wait_for_a_slot_is_part_of_the_deadline() {
    let opts = Options {
        limits: Limits {
            max_concurrency: 1,
            queue_timeout: Duration::from_secs(30),
            ..Limits::default()
        },
        ..Options::default()
    };
    let server = TestServer::start_with(Arc::new(stuck_state().await), opts).await;
    let mut slow = server.connect(Proto::H2).await;
    let first = tokio::spawn(async move {
        slow.review(&format!("{GUARD}?timeout=10s"), stuck_review())
            .await
    });
    // The slow request holds the only slot before the next one arrives.
    wait_for_in_flight(&server, 1).await;
    let mut c = server.connect(Proto::H1).await;
    let started = std::time::Instant::now();
    let r = c
        .review(
            &format!("{GUARD}?timeout=1s"),
            fixture("delete-secret-by-admin.json"),
        )
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("within 800ms"), "{}", r.text());
    // Far below the 30 s queue timeout: the 1 s the API server allows was what counted.
    assert!(started.elapsed() < Duration::from_secs(10));
    first.abort();
    server.stop().await;
}

/// Over h2 a body past the limit still gets the 413 and its message, however long the client
/// keeps sending (curl reported a stream reset, exit 92, before the body was drained).
#[tokio::test]
async fn an_oversized_body_over_h2_gets_a_413_not_a_reset() {
    let server = TestServer::start(fixture_state()).await;
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.json");
    std::fs::write(&big, vec![b' '; 64 * 1024 * 1024]).unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &server.ca.cert_pem).unwrap();
    let url = format!("https://localhost:{}{GUARD}", server.addr.port());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sS", "--http2", "--cacert"])
            .arg(&ca)
            .args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(format!("@{}", big.display()))
            .args(["-w", "\n%{http_code} %{http_version}"])
            .arg(url)
            .output()
    })
    .await
    .unwrap()
    .expect("curl (the h2 client here that keeps sending)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "curl: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.ends_with("413 2"), "{text}");
    assert!(text.contains("exceeds the 8388608-byte limit"), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn saturation_sheds_waiting_requests_with_503() {
    let opts = Options {
        limits: Limits {
            max_concurrency: 1,
            queue_timeout: Duration::from_millis(100),
            ..Limits::default()
        },
        ..Options::default()
    };
    let server = TestServer::start_with(Arc::new(stuck_state().await), opts).await;
    let mut slow = server.connect(Proto::H2).await;
    let first = tokio::spawn(async move {
        slow.review(&format!("{GUARD}?timeout=2s"), stuck_review())
            .await
    });
    // The slow request holds the only slot before the next one arrives.
    wait_for_in_flight(&server, 1).await;
    for proto in BOTH {
        let mut c = server.connect(proto).await;
        let r = c
            .review(GUARD, fixture("delete-secret-by-admin.json"))
            .await;
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.text().contains("handoff is saturated"), "{}", r.text());
        // Probes are not shed.
        assert_eq!(c.get("/healthz").await.status, 200);
    }
    let first = first.await.unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(server.app.metrics.shed.get(), 2);
    // With the slot free again, requests are served.
    let mut c = server.connect(Proto::H1).await;
    assert_eq!(
        c.review(GUARD, fixture("delete-secret-by-admin.json"))
            .await
            .status,
        200
    );
    server.stop().await;
}

#[tokio::test]
async fn a_panic_is_answered_500_and_the_server_lives_on() {
    use axum::routing::post;
    let opts = Options {
        extra_routes: Some(axum::Router::new().route(
            "/boom",
            post(|| async {
                if true {
                    panic!("boom");
                }
                ""
            }),
        )),
        ..Options::default()
    };
    let server = TestServer::start_with(Arc::new(fixture_state()), opts).await;
    for proto in BOTH {
        let mut c = server.connect(proto).await;
        let r = c
            .send("POST", "/boom", Some("application/json"), b"{}".to_vec())
            .await
            .unwrap();
        assert_eq!(r.status, 500);
        assert!(r.text().contains("internal error"), "{}", r.text());
        let mut c = server.connect(proto).await;
        let r = c
            .review(GUARD, fixture("delete-configmap-by-syncer.json"))
            .await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(server.app.metrics.panics.get(), 2);
    assert_eq!(
        server.app.metrics.in_flight.get(),
        0,
        "a panic does not leak an in-flight slot"
    );
    server.stop().await;
}

/// Prometheus text format: `name{labels} value` lines; returns (name, labels, value).
fn parse_metrics(text: &str) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            assert!(
                line.starts_with("# HELP ") || line.starts_with("# TYPE ") || line == "# EOF",
                "bad line {line:?}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n.to_string(), l.trim_end_matches('}').to_string()),
            None => (series.to_string(), String::new()),
        };
        out.push((name, labels, value));
    }
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends with # EOF"
    );
    out
}

#[tokio::test]
async fn metrics_parse_and_count_what_was_sent() {
    let server = TestServer::start(fixture_state()).await;
    let mut c = server.connect(Proto::H2).await;
    for _ in 0..3 {
        c.review(GUARD, fixture("delete-configmap-by-syncer.json"))
            .await;
    }
    for _ in 0..2 {
        c.review(GUARD, fixture("delete-secret-by-admin.json"))
            .await;
    }
    c.send("POST", GUARD, Some("application/json"), b"nope".to_vec())
        .await
        .unwrap();
    c.review(
        "/mutate/move-window",
        fixture("create-deployment-capi.json"),
    )
    .await;
    let r = c.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("application/openmetrics-text"));
    let m = parse_metrics(&r.text());
    let get = |name: &str, labels: &[&str]| -> f64 {
        m.iter()
            .filter(|(n, l, _)| {
                n == name && labels.iter().all(|want| l.split(',').any(|x| x == *want))
            })
            .map(|(_, _, v)| v)
            .sum()
    };
    assert_eq!(
        get(
            "handoff_admission_requests_total",
            &[
                "webhook=\"sync-finalizer\"",
                "verdict=\"deny\"",
                "operation=\"DELETE\"",
                "code=\"200\""
            ]
        ),
        3.0
    );
    assert_eq!(
        get(
            "handoff_admission_requests_total",
            &["webhook=\"sync-finalizer\"", "verdict=\"allow\""]
        ),
        2.0
    );
    assert_eq!(
        get(
            "handoff_admission_requests_total",
            &["verdict=\"error\"", "code=\"400\""]
        ),
        1.0
    );
    assert_eq!(
        get(
            "handoff_admission_requests_total",
            &["webhook=\"move-window\"", "verdict=\"allow\""]
        ),
        1.0
    );
    assert_eq!(
        get(
            "handoff_admission_duration_seconds_count",
            &["webhook=\"sync-finalizer\""]
        ),
        6.0
    );
    assert!(
        m.iter()
            .any(|(n, l, _)| n == "handoff_admission_duration_seconds_bucket"
                && l.contains("le=\"0.00005\"")),
        "50 µs bucket"
    );
    assert_eq!(get("handoff_namespace_cache_size", &[]), 2.0);
    assert_eq!(get("handoff_in_flight_requests", &[]), 0.0);
    for name in [
        "handoff_handler_panics_total",
        "handoff_certificate_reloads_total",
        "handoff_certificate_reload_errors_total",
        "handoff_open_move_windows",
        "handoff_pinned_deployments",
        "handoff_shed_requests_total",
    ] {
        assert!(m.iter().any(|(n, _, _)| n == name), "{name} missing");
    }
    server.stop().await;
}

#[tokio::test]
async fn client_certificates_are_required_when_a_client_ca_is_given() {
    let client_ca = Ca::new("API server client CA", 1).unwrap();
    let other_ca = Ca::new("someone else", 1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &client_ca.cert_pem).unwrap();
    let opts = Options {
        client_ca: Some(ca_file),
        ..Options::default()
    };
    let server = TestServer::start_with(Arc::new(fixture_state()), opts).await;
    let good = client_ca.client_cert("kube-apiserver", 1).unwrap();
    let bad = other_ca.client_cert("kube-apiserver", 1).unwrap();
    for proto in BOTH {
        let mut c = Client::connect(
            server.addr,
            &server.ca.cert_pem,
            proto,
            Some((&good.0, &good.1)),
        )
        .await
        .expect("the CA's client is accepted");
        assert_eq!(
            c.review(GUARD, fixture("delete-secret-by-admin.json"))
                .await
                .status,
            200
        );
        for (name, cert) in [
            ("no certificate", None),
            ("another CA's certificate", Some((&bad.0[..], &bad.1[..]))),
        ] {
            // TLS 1.3 finishes the client's side of the handshake before the server checks the
            // certificate, so the refusal shows on the first request at the latest.
            let refused = match Client::connect(server.addr, &server.ca.cert_pem, proto, cert).await
            {
                Err(_) => true,
                Ok(mut c) => c
                    .send(
                        "POST",
                        GUARD,
                        Some("application/json"),
                        fixture("delete-secret-by-admin.json"),
                    )
                    .await
                    .is_err(),
            };
            assert!(refused, "{name} over {proto:?} was served");
        }
    }
    server.stop().await;
}

/// `Limits`' connection bounds hold: a client that connects and never starts TLS, and one that
/// never finishes its request headers, are dropped once their bound passes (set to 300 ms here;
/// the defaults of 10 s would miss the 5 s this test waits).
#[tokio::test]
async fn a_client_that_stalls_the_handshake_or_its_headers_is_dropped() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let bound = Duration::from_millis(300);
    let server = TestServer::start_with(
        Arc::new(fixture_state()),
        Options {
            limits: Limits {
                handshake_timeout: bound,
                header_read_timeout: bound,
                ..Limits::default()
            },
            ..Options::default()
        },
    )
    .await;
    let closed_within = Duration::from_secs(5);

    // No ClientHello at all.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(closed_within, tcp.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a connection that never starts TLS is still open after {closed_within:?}: {read:?}"
    );

    // TLS, then half of a request's headers.
    let cfg = support::https::tls_client_config(&server.ca.cert_pem, Proto::H1, None);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"POST /validate/sync-finalizer HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(closed_within, tls.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "a client that never finishes its headers is still connected after {closed_within:?}"
    );
    server.stop().await;
}

/// One review on a raw HTTP/1.1 connection, kept alive: the answer's status, its headers and
/// body read whole (by Content-Length).
async fn review_on<S>(tls: &mut S) -> Result<u16, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = fixture("delete-configmap-by-syncer.json");
    let head = format!(
        "POST {GUARD} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(&body).await.map_err(|e| e.to_string())?;
    tls.flush().await.map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tls.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("EOF after {} bytes", got.len()));
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .ok_or("no Content-Length")?;
            if got.len() >= end + 4 + length {
                return text[9..12].parse().map_err(|e| format!("{e}: {text}"));
            }
        }
    }
}

/// The API server keeps an idle connection 90 s and writes a review onto it whenever it likes;
/// a server that closes it first races that write, and the review fails with `EOF`. So an
/// idle HTTP/1.1 connection outlives the header bound (here 200 ms, idle five times that
/// between two reviews), and is closed only after `idle_timeout` (here 1 s), by when the
/// client has given it up. (hyper's own header bound closed it after 200 ms.)
#[tokio::test]
async fn an_idle_keep_alive_connection_outlives_the_header_bound() {
    use tokio::io::AsyncReadExt as _;
    let start = |idle_timeout| {
        TestServer::start_with(
            Arc::new(fixture_state()),
            Options {
                limits: Limits {
                    header_read_timeout: Duration::from_millis(200),
                    idle_timeout,
                    ..Limits::default()
                },
                ..Options::default()
            },
        )
    };
    let connect = |server: &TestServer| {
        let cfg = support::https::tls_client_config(&server.ca.cert_pem, Proto::H1, None);
        let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        let addr = server.addr;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            connector
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap()
        }
    };

    let server = start(Limits::default().idle_timeout).await;
    let mut tls = connect(&server).await;
    assert_eq!(review_on(&mut tls).await, Ok(200));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        review_on(&mut tls).await,
        Ok(200),
        "the second review on a connection idle 1 s, five header bounds"
    );
    server.stop().await;

    let idle = Duration::from_secs(1);
    let server = start(idle).await;
    let mut tls = connect(&server).await;
    assert_eq!(review_on(&mut tls).await, Ok(200));
    let answered = std::time::Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), tls.read_to_end(&mut rest)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the idle connection was not closed: {read:?}"
    );
    assert!(
        answered.elapsed() >= idle,
        "closed {:?} after the answer, before the idle bound {idle:?}",
        answered.elapsed()
    );
    server.stop().await;
}

/// Wait until `n` requests are inside handoff's request path (a slot taken): what a test of
/// the limits needs, however slow the machine.
async fn wait_for_in_flight(server: &TestServer, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while server.app.metrics.in_flight.get() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {n} request(s) in flight"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
