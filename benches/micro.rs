//! Micro-benchmarks of the request path's pure parts, through the public API only:
//! decoding a DELETE review whose object is 2 KB, the guard's decision, the pin's patch,
//! encoding the response, and the whole decode → decide → encode path as `serve` runs it.
//!
//! `cargo bench --bench micro`. Fixtures are read at run time from `tests/fixtures`
//! (or `$HANDOFF_FIXTURES`); figures and their meaning are in BENCHMARKS.md.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use handoff::admission::{AdmissionResponse, decode_review, encode_review};
use handoff::rules::identity::Identities;
use handoff::rules::move_window::{self, PinRequest, PinVerdict, WindowView};
use handoff::rules::rollout::Verdict;
use handoff::rules::sync_finalizer::{self, DeleteRequest, NamespaceMeta, NamespaceState};
use handoff::state::State;
use handoff::state::namespaces::{CacheEntry, NamespaceCache};
use handoff::webhook::{self, Webhook};

/// The namespace the recorded syncer requests act in, held by its sync finalizer.
const HELD_NS: &str = "kcp-33jbiactwhg0";
const FINALIZER: &str = "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g";
const LOCATOR: &str = r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}"#;

fn fixtures() -> PathBuf {
    std::env::var_os("HANDOFF_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn fixture(name: &str) -> serde_json::Value {
    let path = fixtures().join(name);
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The recorded syncer DELETE of a ConfigMap, compact as the API server sends it, with the
/// ConfigMap's `data` padded so that `oldObject` is exactly 2,048 bytes of JSON.
fn delete_2kb() -> Vec<u8> {
    let mut review = fixture("delete-configmap-by-syncer.json");
    let old = &mut review["request"]["oldObject"];
    old["data"]["padding"] = serde_json::Value::String(String::new());
    let len = serde_json::to_vec(old).unwrap().len();
    assert!(len <= 2048, "oldObject is already {len} bytes");
    old["data"]["padding"] = serde_json::Value::String("x".repeat(2048 - len));
    assert_eq!(serde_json::to_vec(old).unwrap().len(), 2048);
    serde_json::to_vec(&review).unwrap()
}

/// A recorded client-side `kubectl apply` to a Cluster API controller Deployment: 10.8 KB of
/// compact JSON (the recording is pretty-printed).
fn deployment_update() -> Vec<u8> {
    serde_json::to_vec(&fixture("apply-deployment-client-side.json")).unwrap()
}

fn held_meta(ids: &Identities) -> NamespaceMeta {
    let annotations = BTreeMap::from([
        (FINALIZER.to_string(), "glbc-migration".to_string()),
        ("kcp.io/namespace-locator".to_string(), LOCATOR.to_string()),
    ]);
    NamespaceMeta::from_annotations(Some(&annotations), ids)
}

/// `n` namespaces as a physical cluster under kcp holds them: every one located, one in ten
/// held (the held kcp namespace of the review among them).
fn namespaces(n: usize, ids: &Identities) -> Vec<(String, NamespaceMeta)> {
    let located = NamespaceMeta {
        finalizers: None,
        ..held_meta(ids)
    };
    let mut out: Vec<(String, NamespaceMeta)> = (0..n)
        .map(|i| {
            let meta = match i % 10 {
                0 => held_meta(ids),
                _ => located.clone(),
            };
            (format!("kcp-{i:012}"), meta)
        })
        .collect();
    out.push((HELD_NS.to_string(), held_meta(ids)));
    out
}

/// Drive a future that never waits (state from files answers synchronously).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the decision waited on I/O; benches use file state only"),
    }
}

fn example_state(n: usize) -> State {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/state");
    let state = State::from_dir(&dir, Identities::default()).expect("examples/state loads");
    let all = namespaces(n, &state.ids);
    state
        .namespaces
        .replace_all(all.iter().map(|(n, m)| (n.as_str(), m.clone())));
    state
}

fn bench_decode(c: &mut Criterion) {
    let delete = delete_2kb();
    let update = deployment_update();
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Bytes(delete.len() as u64));
    g.bench_function("delete-review-2KiB-object", |b| {
        b.iter(|| decode_review(black_box(&delete)).unwrap())
    });
    g.throughput(Throughput::Bytes(update.len() as u64));
    g.bench_function("deployment-update-review-11KB", |b| {
        b.iter(|| decode_review(black_box(&update)).unwrap())
    });
    g.finish();
}

fn bench_guard(c: &mut Criterion) {
    let ids = Identities::default();
    let req = decode_review(&delete_2kb()).unwrap();
    let meta = held_meta(&ids);
    let admin = {
        let mut r = req.clone();
        r.user_info.username = "admin".into();
        r
    };
    let mut g = c.benchmark_group("guard");
    // The syncer deletes in a held namespace: resolve it by the kcp convention (the locator's
    // hashes were done when `meta` was built, as when a namespace enters the cache), find the
    // hold, write the denial.
    g.bench_function("decide-deny-held-namespace", |b| {
        b.iter(|| {
            let d = DeleteRequest::from_review(black_box(&req)).unwrap();
            let v = sync_finalizer::decide(&d, NamespaceState::Known(&meta), &ids);
            assert!(!v.is_allowed());
            v
        })
    });
    // The same syncer where nothing holds: still resolved, then allowed.
    let free = NamespaceMeta {
        finalizers: None,
        ..meta.clone()
    };
    g.bench_function("decide-allow-unheld-namespace", |b| {
        b.iter(|| {
            let d = DeleteRequest::from_review(black_box(&req)).unwrap();
            let v = sync_finalizer::decide(&d, NamespaceState::Known(&free), &ids);
            assert!(v.is_allowed());
            v
        })
    });
    // Anyone who is not a sync target: decided on the username alone.
    g.bench_function("decide-allow-not-a-syncer", |b| {
        b.iter(|| {
            let d = DeleteRequest::from_review(black_box(&admin)).unwrap();
            sync_finalizer::decide(&d, NamespaceState::Plain, &ids)
        })
    });
    // The cache read in front of the decision, at 100,000 namespaces.
    let cache = NamespaceCache::default();
    let all = namespaces(100_000, &ids);
    cache.replace_all(all.iter().map(|(n, m)| (n.as_str(), m.clone())));
    g.bench_function("cache-lookup-and-decide-100k-namespaces", |b| {
        b.iter(|| {
            let d = DeleteRequest::from_review(black_box(&req)).unwrap();
            let entry = cache.get(d.namespace_to_read(&ids).unwrap());
            let CacheEntry::Relevant(m) = entry else {
                panic!("the held namespace is cached")
            };
            sync_finalizer::decide(&d, NamespaceState::Known(&m), &ids)
        })
    });
    g.finish();
}

fn bench_pin(c: &mut Criterion) {
    let state = example_state(0);
    let windows = state.windows.open();
    assert!(!windows.is_empty(), "examples/state has an open MoveWindow");
    let req = decode_review(&deployment_update()).unwrap();
    let mut g = c.benchmark_group("pin");
    g.bench_function("decide-and-patch-deployment-update", |b| {
        b.iter(|| {
            let pin = PinRequest::from_review(black_box(&req)).unwrap();
            match move_window::decide(&pin, &WindowView::known(&windows), &state.own) {
                PinVerdict::Pin { ops, .. } => AdmissionResponse::allow(&req.uid).with_patch(&ops),
                other => panic!("not pinned: {other:?}"),
            }
        })
    });
    g.finish();
}

fn bench_encode(c: &mut Criterion) {
    let state = example_state(0);
    let delete = decode_review(&delete_2kb()).unwrap();
    let update = decode_review(&deployment_update()).unwrap();
    let deny = ready(webhook::decide(&state, Webhook::SyncFinalizer, &delete));
    assert_eq!(deny.verdict, Verdict::Deny);
    let patch = ready(webhook::decide(&state, Webhook::MoveWindow, &update));
    assert_eq!(patch.verdict, Verdict::Patch);
    let allow = AdmissionResponse::allow(&delete.uid);
    let mut g = c.benchmark_group("encode");
    g.bench_function("allow", |b| b.iter(|| encode_review(black_box(&allow))));
    g.bench_function("deny-with-message", |b| {
        b.iter(|| encode_review(black_box(&deny.response)))
    });
    g.bench_function("pin-with-patch-and-warning", |b| {
        b.iter(|| encode_review(black_box(&patch.response)))
    });
    g.finish();
}

/// What `serve` does between reading the body and writing the response, less logging and
/// metrics: decode, look up state (10,000 namespaces), decide, encode.
fn bench_path(c: &mut Criterion) {
    let state = example_state(10_000);
    let delete = delete_2kb();
    let update = deployment_update();
    let mut g = c.benchmark_group("path");
    g.bench_function("delete-2KiB-decode-decide-encode", |b| {
        b.iter(|| {
            let req = decode_review(black_box(&delete)).unwrap();
            let d = ready(webhook::decide(&state, Webhook::SyncFinalizer, &req));
            encode_review(&d.response)
        })
    });
    g.bench_function("deployment-update-decode-decide-encode", |b| {
        b.iter(|| {
            let req = decode_review(black_box(&update)).unwrap();
            let d = ready(webhook::decide(&state, Webhook::MoveWindow, &req));
            encode_review(&d.response)
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_decode,
    bench_guard,
    bench_pin,
    bench_encode,
    bench_path
);
criterion_main!(benches);
