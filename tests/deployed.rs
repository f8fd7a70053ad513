//! handoff as the manifests deploy it (`support::shipped`): the API server calls both webhooks
//! through their Services (ClusterIP, port 443, the paths), verifies the serving certificate
//! for `<service>.handoff-system.svc` against the caBundle cainjector would inject, and reaches
//! pods that run with the Deployments' own args, env, mounted Secret, ServiceAccount token and
//! RBAC, made ready by their own probes (`support::kubelet`, `support::kube_proxy`). No webhook
//! configuration is rewritten.
//!
//! `deployed_as_shipped` (every run): each kind of request answered right, then under load a
//! certificate rotation, one rollout of each Deployment and a `kill -9` of a replica, with no
//! failed call, no wrong answer, and no connection closed by a pod that was not stopping (the
//! API server's `EOF`: `server::keep_alive`). `rollout_under_load` (`cargo test --test deployed --
//! --ignored --nocapture rollout_under_load`) is the measurement the book reports (docs/src/development.md): three
//! rollouts of each at 25 requests a second.

mod support;

use std::time::{Duration, Instant};

use support::apiserver::{
    ADMIN, ApiServer, LOCATOR, SYNC_TARGET_KEY, SYNCER, app_deployment, capi_deployment,
    handoff_cmd, text,
};
use support::load::{Load, Report, Targets};
use support::shipped::{NAMESPACE, Shipped, get_json};

const ROLLOUT_WITHIN: Duration = Duration::from_secs(120);

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn deployed_as_shipped() {
    if support::apiserver::skip() || !support::netns::in_own_netns("deployed_as_shipped") {
        return;
    }
    exercise(1, 10).assert_clean();
}

#[test]
#[ignore = "the rollout measurement (about 3 minutes): cargo test --test deployed -- --ignored --nocapture rollout_under_load"]
fn rollout_under_load() {
    if support::apiserver::skip() || !support::netns::in_own_netns("rollout_under_load") {
        return;
    }
    let env = |k: &str, d: u32| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    exercise(env("HANDOFF_ROLLOUTS", 3) as usize, env("HANDOFF_RATE", 25)).assert_clean();
}

/// Deploy, check the deployment is the shipped one, then load at `per_second` through
/// `rollouts` rollouts of each Deployment, one `kill -9` and one certificate rotation.
fn exercise(rollouts: usize, per_second: u32) -> Report {
    let api = ApiServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let shipped = Shipped::deploy(&api, dir.path());
    println!(
        "deployed as shipped in {:.1} s: {:?}",
        started.elapsed().as_secs_f64(),
        shipped
            .kubelet
            .pods()
            .iter()
            .map(|p| format!("{} {}", p.name, p.ip))
            .collect::<Vec<_>>()
    );
    registered_as_shipped(&api, &shipped);
    let targets = prepare(&api);

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let admin = rt.block_on(config(&api));
    let mut syncer = admin.clone();
    syncer.auth_info.impersonate = Some(SYNCER.into());

    // Every kind of request, answered right before anything moves.
    let quiet = Load::start(admin.clone(), syncer.clone(), targets.clone(), 10);
    std::thread::sleep(Duration::from_secs(3));
    let first = Report::new(&quiet.stop(), &[], None);
    first.print("before any disturbance");
    assert!(
        first.all.right == first.all.sent && first.all.sent >= 25,
        "not every request was answered right: see above"
    );

    // What the drain is built for (`Health::start_drain`): the API server calls admission
    // webhooks over HTTP/1.1 only (kubernetes PR #82090), with a pool of keep-alive connections.
    for svc in ["handoff-guard:https", "handoff-pin:https"] {
        let offered = shipped.kubelet.proxy(svc).alpn_offered();
        assert_eq!(
            offered,
            vec![vec!["http/1.1".to_string()]],
            "ALPN the API server offered to {svc}"
        );
    }
    let counted_before = apiserver_webhook_counts(&api);
    let load = Load::start(admin, syncer, targets, per_second);
    let load_started = load.started;
    let mut windows = Vec::new();
    std::thread::sleep(Duration::from_secs(3));
    let k = &shipped.kubelet;
    // A certificate renewal: the Secret replaced, every pod's volume swapped by `..data`. First,
    // so that the API server connects anew to pods serving the new certificate: its pooled
    // connections outlive a rotation (and handoff never closes them while they are idle).
    let from = load.elapsed();
    shipped.rotate_serving_certificate(&api);
    rotated_everywhere(&shipped);
    let rotated = std::time::SystemTime::now();
    windows.push((from, load.elapsed()));
    std::thread::sleep(Duration::from_secs(2));

    for round in 0..rollouts {
        let only = std::env::var("HANDOFF_ROLLOUT_ONLY").ok();
        for d in shipped
            .deployments()
            .into_iter()
            .filter(|d| only.as_ref().is_none_or(|o| o == d))
        {
            let from = load.elapsed();
            k.rollout(NAMESPACE, &d, ROLLOUT_WITHIN);
            k.wait_terminated(&d, Duration::from_secs(60));
            windows.push((from, load.elapsed()));
            println!(
                "rollout {} of {d}: {:.1} s",
                round + 1,
                (load.elapsed() - from).as_secs_f64()
            );
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    // A crash: kill -9 of the guard replica that took the API server's latest connection (the
    // one carrying its calls); the kubelet restarts it, its probe readmits it.
    let carrying = k.proxy("handoff-guard:https").last_routed();
    let victim = k
        .pods_of("handoff-guard")
        .into_iter()
        .filter(|p| p.ready)
        .max_by_key(|p| Some(&p.name) == carrying.as_ref())
        .expect("a ready guard pod");
    let crash_at = load.elapsed();
    k.signal_pod(&victim.name, libc::SIGKILL);
    support::apiserver::eventually("the killed pod restarted", Duration::from_secs(10), || {
        k.pods()
            .iter()
            .any(|p| p.name == victim.name && p.restarts == 1)
            .then_some(())
    });
    k.wait_ready(&victim.name, Duration::from_secs(60));
    windows.push((crash_at, load.elapsed()));
    println!(
        "kill -9 of {}: ready again after {:.1} s",
        victim.name,
        (load.elapsed() - crash_at).as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(3));
    let after_rotation = k
        .proxy("handoff-guard:https")
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.opened > rotated)
        .count();
    assert!(
        after_rotation > 0,
        "no connection to the guard was made after the rotation"
    );

    let duration = load.elapsed();
    let samples = load.stop();
    let closes = pod_closes(k);
    let mut report = Report::new(&samples, &windows, Some(crash_at));
    report.expected = (duration.as_secs_f64() * f64::from(per_second)) as usize;
    let counted_after = apiserver_webhook_counts(&api);
    the_scrape_counted_the_load(&counted_before, &counted_after);
    report.apiserver_failed_calls = counted_after.failed - counted_before.failed;
    report.apiserver_fail_open = counted_after.fail_open - counted_before.fail_open;
    report.print(&format!(
        "{rollouts} rollout(s) of each Deployment, a kill -9, a rotation, {per_second}/s"
    ));
    for (t, e) in k.events() {
        if e.contains("rollout") || e.contains("signal") || e.contains("updated") {
            println!("  {t:>7.1} s  {e}");
        }
    }
    for t in k.traffic() {
        println!("  {t}");
    }
    println!("{}", closes.summary());
    for c in &closes.by_running_pods {
        println!("  closed by a running pod: {c}");
    }
    if !report.wrong().is_empty() || !report.all.failed.is_empty() || !report.all.other.is_empty() {
        let t0 = std::time::SystemTime::now() - load_started.elapsed();
        for f in report.all.failed.iter().chain(&report.all.wrong) {
            println!("failure: {f}");
        }
        println!("load started at {}", wall(t0));
        for name in ["handoff-guard:https", "handoff-pin:https"] {
            for c in k.proxy(name).log.lock().unwrap().iter() {
                let ends: Vec<String> = c
                    .ends
                    .iter()
                    .map(|(t, w)| format!("{w} {}", wall(*t)))
                    .collect();
                println!("  {name} -> {} opened {} {ends:?}", c.pod, wall(c.opened));
            }
        }
        let keep = std::env::temp_dir().join(format!("handoff-deployed-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&keep);
        for e in std::fs::read_dir(dir.path().join("node/pods"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.path().extension().is_some_and(|x| x == "log") {
                let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
            }
        }
        println!("every pod's log is kept in {}", keep.display());
    }
    k.shutdown();
    assert!(
        closes.by_running_pods.is_empty(),
        "{} connection(s) closed by a pod that was not stopping, each a review the API server may write as it closes (an EOF it does not retry): see above",
        closes.by_running_pods.len()
    );
    report
}

/// How the API server's connections to the pods ended, from the kube-proxy's log.
struct PodCloses {
    total: usize,
    by_client: usize,
    /// Closed first by a pod while it was stopping (its drain, or the kill -9 until its
    /// restart): how long after the client's last request.
    by_stopping_pods: Vec<f64>,
    /// Closed first by a pod that was not stopping: none may be.
    by_running_pods: Vec<String>,
}

impl PodCloses {
    fn summary(&self) -> String {
        let idle = |min: bool| {
            self.by_stopping_pods
                .iter()
                .copied()
                .reduce(if min { f64::min } else { f64::max })
                .unwrap_or(0.0)
        };
        format!(
            "connections to the pods: {}; closed by the client {}, by a stopping pod {} ({:.1} .. {:.1} s after the client's last request), by a running pod {}",
            self.total,
            self.by_client,
            self.by_stopping_pods.len(),
            idle(true),
            idle(false),
            self.by_running_pods.len()
        )
    }
}

fn pod_closes(k: &support::kubelet::Kubelet) -> PodCloses {
    let stopping = k.stopping();
    let mut closes = PodCloses {
        total: 0,
        by_client: 0,
        by_stopping_pods: Vec::new(),
        by_running_pods: Vec::new(),
    };
    for name in ["handoff-guard:https", "handoff-pin:https"] {
        for c in k.proxy(name).log.lock().unwrap().iter() {
            closes.total += 1;
            let Some(at) = c.closed_by_pod() else {
                closes.by_client += usize::from(!c.ends.is_empty());
                continue;
            };
            let idle = c
                .last_from_client
                .and_then(|b| at.duration_since(b).ok())
                .unwrap_or_default()
                .as_secs_f64();
            let was_stopping = stopping
                .get(&c.pod)
                .is_some_and(|w| w.iter().any(|w| w.contains(&at)));
            if was_stopping {
                closes.by_stopping_pods.push(idle);
            } else {
                closes.by_running_pods.push(format!(
                    "{name} -> {}: opened {}, {:?} at {} {idle:.1} s after the client's last request",
                    c.pod,
                    wall(c.opened),
                    c.ends[0].1,
                    wall(at)
                ));
            }
        }
    }
    closes
}

/// The webhook configurations in the API server are the shipped ones: Services, paths, port
/// 443, the injected CA, no `url`.
fn registered_as_shipped(api: &ApiServer, shipped: &Shipped) {
    use base64::Engine as _;
    let want_ca = base64::engine::general_purpose::STANDARD.encode(&shipped.ca.cert_pem);
    for kind in [
        "validatingwebhookconfiguration",
        "mutatingwebhookconfiguration",
    ] {
        let c = get_json(api, &["get", kind, "handoff"]);
        for w in c["webhooks"].as_array().expect("webhooks") {
            let cc = &w["clientConfig"];
            assert!(cc["url"].is_null(), "{kind} {}: a url", w["name"]);
            assert_eq!(cc["service"]["namespace"], NAMESPACE);
            assert_eq!(cc["service"]["port"], 443);
            assert_eq!(cc["caBundle"], want_ca.as_str(), "{}: caBundle", w["name"]);
        }
    }
}

/// The namespaces, objects and open window the load needs.
fn prepare(api: &ApiServer) -> Targets {
    api.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-syncers\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\nsubjects:\n- kind: User\n  name: {SYNCER}\n"
    ));
    api.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: held\n  annotations:\n    kcp.io/namespace-locator: '{LOCATOR}'\n    finalizers.workload.kcp.io/{SYNC_TARGET_KEY}: migrating\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: free\n  annotations:\n    kcp.io/namespace-locator: '{LOCATOR}'\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  namespace: held\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: apps\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: capi-system\n"
    ));
    api.apply(&app_deployment("apps", "web", 1));
    api.apply(&capi_deployment(
        "capi-system",
        "capi-controller-manager",
        Some(1),
    ));
    let out = handoff_cmd(
        api,
        &["window", "open", "capi-move", "--wait-timeout", "0s"],
    );
    assert!(
        out.status.success(),
        "window open: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    Targets {
        held_namespace: "held".into(),
        free_namespace: "free".into(),
        app: ("apps".into(), "web".into()),
        controller: ("capi-system".into(), "capi-controller-manager".into()),
    }
}

async fn config(api: &ApiServer) -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(api.kubeconfig(ADMIN)).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config")
}

/// Every pod of both Deployments is ready and serves the certificate now in the Secret.
fn rotated_everywhere(shipped: &Shipped) {
    let want = shipped.current_serving_cert();
    let replicas = shipped.replicas();
    support::apiserver::eventually(
        "every pod serves the rotated certificate",
        Duration::from_secs(30),
        || {
            let ready: Vec<_> = shipped
                .kubelet
                .pods()
                .into_iter()
                .filter(|p| !p.terminating && p.ready)
                .collect();
            (ready.len() == replicas
                && ready
                    .iter()
                    .all(|p| served_cert(p.ip).as_ref() == Some(&want)))
            .then_some(())
        },
    );
}

/// The API server's own counts of calls to handoff's webhooks: those that failed, those that
/// `failurePolicy: Ignore` let through, and every call by webhook. Checked, not assumed: the
/// scrape must succeed and every sample parse, so that neither a failed scrape nor a renamed
/// series reads as "no failed call" (`the_scrape_counted_the_load` checks the rest).
struct WebhookCounts {
    failed: f64,
    fail_open: f64,
    calls: std::collections::BTreeMap<String, f64>,
}

fn apiserver_webhook_counts(api: &ApiServer) -> WebhookCounts {
    let out = api.kubectl(ADMIN, &["get", "--raw", "/metrics"]);
    assert!(
        out.status.success(),
        "scraping the API server's /metrics failed: {}",
        text(&out.stderr)
    );
    let metrics = text(&out.stdout);
    let mut counts = WebhookCounts {
        failed: 0.0,
        fail_open: 0.0,
        calls: Default::default(),
    };
    for line in metrics.lines() {
        if line.starts_with('#') || !line.contains("handoff.dev\"") {
            continue;
        }
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("an unreadable sample in the API server's /metrics: {line}"));
        if line.starts_with("apiserver_admission_webhook_rejection_count{")
            && (line.contains("error_type=\"calling_webhook_error\"")
                || line.contains("error_type=\"apiserver_internal_error\""))
        {
            counts.failed += value;
        } else if line.starts_with("apiserver_admission_webhook_fail_open_count{") {
            counts.fail_open += value;
        } else if line.starts_with("apiserver_admission_webhook_admission_duration_seconds_count{")
        {
            let name = [",name=\"", "{name=\""]
                .iter()
                .find_map(|k| line.split_once(k))
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(name, _)| name.to_string())
                .unwrap_or_else(|| panic!("a webhook sample without a name: {line}"));
            *counts.calls.entry(name).or_default() += value;
        }
    }
    counts
}

/// The counts of failed calls are differences of series that exist only once something
/// happened: they mean "none failed" only if the same scrape counted the load's calls to each
/// webhook it drives (the guard's deletes, the scale pin's scales).
fn the_scrape_counted_the_load(before: &WebhookCounts, after: &WebhookCounts) {
    for webhook in [
        "sync-finalizer.handoff.dev",
        "move-window-scale.handoff.dev",
    ] {
        let calls = |c: &WebhookCounts| c.calls.get(webhook).copied().unwrap_or(0.0);
        assert!(
            calls(after) > calls(before),
            "the API server's /metrics count no call to {webhook} during the load \
             ({} before, {} after): its count of failed calls would prove nothing",
            calls(before),
            calls(after)
        );
    }
}

/// The leaf certificate (DER) served at `ip:8443`.
fn served_cert(ip: std::net::Ipv4Addr) -> Option<Vec<u8>> {
    support::kubelet::peer_certificate(std::net::SocketAddr::from((ip, 8443)))
}

/// Wall-clock time as the pods' JSON logs write it (UTC, to the millisecond).
fn wall(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let s = d.as_secs() % 86400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s % 3600 / 60,
        s % 60,
        d.subsec_millis()
    )
}
