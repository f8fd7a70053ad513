//! The sync-finalizer guard over real HTTPS (HTTP/1.1 and h2), fed the AdmissionReviews that a
//! real kube-apiserver sent (`tests/fixtures/`).

mod support;

use support::https::{BOTH, Proto, TestServer, fixture, fixture_state};

const PATH: &str = "/validate/sync-finalizer?timeout=10s";

/// (fixture, allowed, reason audit annotation, text the denial must contain)
const CASES: &[(&str, bool, &str, &str)] = &[
    (
        "delete-configmap-by-syncer.json",
        false,
        "namespace-sync-finalizer",
        "configmaps \"cm-syncer\"",
    ),
    (
        "delete-dryrun-by-syncer.json",
        false,
        "namespace-sync-finalizer",
        "configmaps \"cm-dryrun\"",
    ),
    (
        "delete-namespace-by-syncer-1.json",
        false,
        "namespace-itself",
        "namespaces \"kcp-33jbiactwhg0\"",
    ),
    (
        "delete-namespace-by-syncer-2.json",
        false,
        "namespace-itself",
        "deleting the namespace would delete everything in it",
    ),
    (
        "deletecollection-by-syncer-1.json",
        false,
        "namespace-sync-finalizer",
        "(delete-collection item)",
    ),
    (
        "deletecollection-by-syncer-2.json",
        false,
        "namespace-sync-finalizer",
        "(delete-collection item)",
    ),
    (
        "deletecollection-by-syncer-3.json",
        false,
        "namespace-sync-finalizer",
        "(delete-collection item)",
    ),
    (
        "deletecollection-by-syncer-4.json",
        false,
        "namespace-sync-finalizer",
        "configmaps \"kube-root-ca.crt\" (delete-collection item)",
    ),
    ("delete-by-garbage-collector.json", true, "", ""),
    ("delete-by-namespace-controller.json", true, "", ""),
    ("delete-pod-grace-1.json", true, "", ""),
    ("delete-pod-grace-2.json", true, "", ""),
    ("delete-pod-grace-3.json", true, "", ""),
    ("delete-pod-grace-bound.json", true, "", ""),
    ("delete-secret-by-admin.json", true, "", ""),
    // Writes are not the guard's business even if mis-routed to it.
    ("create-deployment-capi.json", true, "", ""),
    ("scale-deployment.json", true, "", ""),
];

fn uid_of(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["request"]["uid"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn fixtures_over_http1_and_h2() {
    let server = TestServer::start(fixture_state()).await;
    for proto in BOTH {
        let mut client = server.connect(proto).await;
        let want_alpn: &[u8] = if proto == Proto::H2 {
            b"h2"
        } else {
            b"http/1.1"
        };
        assert_eq!(client.alpn.as_deref(), Some(want_alpn));
        for (file, allowed, reason, text) in CASES {
            let body = fixture(file);
            let uid = uid_of(&body);
            let reply = client.review(PATH, body).await;
            assert_eq!(reply.status, 200, "{file} {proto:?}: {}", reply.text());
            assert_eq!(reply.content_type, "application/json");
            let v = reply.json();
            assert_eq!(v["apiVersion"], "admission.k8s.io/v1", "{file}");
            assert_eq!(v["kind"], "AdmissionReview", "{file}");
            let r = &v["response"];
            assert_eq!(r["uid"], uid.as_str(), "{file}: uid echoed");
            assert_eq!(r["allowed"], *allowed, "{file} {proto:?}: {r}");
            if !allowed {
                assert_eq!(r["status"]["code"], 403, "{file}");
                assert_eq!(r["status"]["reason"], "Forbidden", "{file}");
                let msg = r["status"]["message"].as_str().unwrap();
                for part in [
                    *text,
                    "kcp-33jbiactwhg0",
                    "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g=\"glbc-migration\"",
                    "sync target \"us-west1\" (cluster root:org:ws)",
                    "kubectl annotate namespace kcp-33jbiactwhg0",
                ] {
                    assert!(msg.contains(part), "{file}: {part:?} not in {msg}");
                }
                assert_eq!(r["auditAnnotations"]["decision"], "deny", "{file}");
                assert_eq!(r["auditAnnotations"]["reason"], *reason, "{file}");
            } else {
                assert!(r.get("status").is_none(), "{file}: {r}");
                assert!(r.get("patch").is_none(), "{file}: the guard never patches");
            }
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_4xx_with_a_message() {
    let server = TestServer::start(fixture_state()).await;
    let good = fixture("delete-configmap-by-syncer.json");
    let strip = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    };
    // (case, Content-Type, body, status, text in the message)
    type Case<'a> = (&'a str, Option<&'a str>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            Some("application/json"),
            b"{\"apiVersion\":".to_vec(),
            400,
            "not a valid AdmissionReview JSON",
        ),
        (
            "empty body",
            Some("application/json"),
            vec![],
            400,
            "not a valid AdmissionReview JSON",
        ),
        (
            "JSON array",
            Some("application/json"),
            b"[1,2]".to_vec(),
            400,
            "not a valid AdmissionReview JSON",
        ),
        (
            "missing request",
            Some("application/json"),
            strip(&|v| {
                v.as_object_mut().unwrap().remove("request");
            }),
            400,
            "no \"request\"",
        ),
        (
            "v1beta1",
            Some("application/json"),
            strip(&|v| v["apiVersion"] = "admission.k8s.io/v1beta1".into()),
            400,
            "admission.k8s.io/v1beta1",
        ),
        (
            "wrong kind",
            Some("application/json"),
            strip(&|v| v["kind"] = "ConfigMap".into()),
            400,
            "not an AdmissionReview",
        ),
        (
            "no content type",
            None,
            good.clone(),
            415,
            "Content-Type must be application/json",
        ),
        (
            "yaml content type",
            Some("application/yaml"),
            good.clone(),
            415,
            "application/yaml",
        ),
        (
            "over the body limit",
            Some("application/json"),
            vec![b' '; 9 * 1024 * 1024],
            413,
            "exceeds the 8388608-byte limit",
        ),
    ];
    for proto in BOTH {
        let mut client = server.connect(proto).await;
        for (name, ct, body, code, text) in &cases {
            let reply = client
                .send("POST", PATH, *ct, body.clone())
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(reply.status, *code, "{name} {proto:?}: {}", reply.text());
            assert!(reply.text().contains(text), "{name}: {}", reply.text());
        }
        // The server survives all of it. (HTTP/1.1 closes the connection after a 413 whose
        // body was not read, as it must; the API server opens a new one.)
        let mut client = server.connect(proto).await;
        let reply = client.review(PATH, good.clone()).await;
        assert_eq!(reply.status, 200);
        let reply = client.get("/nope").await;
        assert_eq!(reply.status, 404);
        let reply = client.get("/validate/sync-finalizer").await;
        assert_eq!(reply.status, 405);
    }
    server.stop().await;
}

#[tokio::test]
async fn health_and_readiness() {
    let server = TestServer::start(fixture_state()).await;
    let mut client = server.connect(Proto::H1).await;
    assert_eq!(client.get("/healthz").await.status, 200);
    // Ready once the listener has answered the server's own probe.
    let mut ready = false;
    for _ in 0..50 {
        if client.get("/readyz").await.status == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(ready, "readyz never turned 200");
    server.app.health.start_drain();
    let r = client.get("/readyz").await;
    assert_eq!(r.status, 503);
    assert!(r.text().contains("draining"), "{}", r.text());
    server.stop().await;
}

#[tokio::test]
async fn unsynced_cache_is_not_ready() {
    let state = handoff::state::State::new(Default::default());
    let server = TestServer::start(state).await;
    let mut client = server.connect(Proto::H2).await;
    let r = client.get("/readyz").await;
    assert_eq!(r.status, 503);
    assert!(r.text().contains("not synced yet"), "{}", r.text());
    server.stop().await;
}
