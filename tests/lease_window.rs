//! The Lease strategy of a move window, driven as a user drives it, against two real
//! kube-apiservers (the source and the target of a move) and Cluster API provider stand-ins that
//! elect their leader with client-go's leaderelection and serve fail-closed webhooks through
//! their Services, in a network namespace of the test's own.
//!
//! Proves: while the window is open no provider reconciles, a create through its fail-closed
//! webhook succeeds and its Deployment is not scaled; a provider without leader election is
//! pinned to 0 and restored; the held Lease refuses everyone but the window's operator, by the
//! webhook and by the in-API-server policy; after close each provider leads again, the
//! target's first.

mod support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::apiserver::{ADMIN, ApiServer, NOBODY, skip, text};
use support::mgmt::{BOB, Mgmt, PROVIDER_SA};
use support::providers::{
    LeaseTiming, LeaseWatch, Provider, ProviderSpec, cluster, holder_pod, led_first,
};

const WAIT: Duration = Duration::from_secs(90);
const WINDOW: &str = "capi-move";
const HELD_BY: &str = "handoff.dev/held-by-window";
const OPERATOR: &str = "handoff.dev/window-operator";
/// The holder identity the window writes into the Leases it holds.
const WINDOW_HOLDER: &str = "handoff.dev/move-window/capi-move";
/// Cluster API core's Lease, and the Deployment whose pods lead it.
const CAPI_LEASE: &str = "capi-system/controller-leader-election-capi";
const CAPI: &str = "capi-controller-manager";

/// A management cluster: Cluster API core (Lease, serving a fail-closed webhook for Clusters
/// through its Service) and, with `with_capd`, CAPD without leader election (Scale).
fn management_cluster(label: &'static str, capi_ip: [u8; 4], with_capd: bool) -> Mgmt {
    let mut specs = vec![
        ProviderSpec::capi_core()
            .replicas(2)
            .lease(LeaseTiming::FAST)
            .webhook_service("capi-webhook-service", capi_ip.into()),
    ];
    if with_capd {
        specs.push(
            ProviderSpec::new(
                "capd-system",
                "capd-controller-manager",
                "infrastructure-docker",
            )
            .leader_election(None),
        );
    }
    let m = Mgmt::start(label, specs);
    m.api.ok(ADMIN, &["create", "namespace", "clusters"]);
    m
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_lease_window_stops_the_reconcilers_and_keeps_the_webhooks() {
    if skip()
        || !support::netns::in_own_netns(
            "a_lease_window_stops_the_reconcilers_and_keeps_the_webhooks",
        )
    {
        return;
    }
    let started = Instant::now();
    let source = management_cluster("source", [10, 0, 0, 20], true);
    let target = management_cluster("target", [10, 0, 0, 21], false);
    eprintln!(
        "two clusters up after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let capd = source.provider("capd-controller-manager");
    // The in-API-server policies on the source: the held Lease must hold there without the
    // webhook, and the pin's policy must leave a Lease-stopped controller alone.
    let out = handoff(&source.api, ADMIN, &["policy", "install"]);
    assert!(
        out.status.success(),
        "policy install: {}",
        text(&out.stderr)
    );

    // --dry-run: the strategy and the Lease of each Deployment, nothing written.
    let dry = window(&source, &target, &["open", WINDOW, "--dry-run"]);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    let plan = text(&dry.stdout);
    assert!(
        plan.contains("source: capi-system/capi-controller-manager: Lease: would hold controller-leader-election-capi (held by capi-controller-manager-")
            && plan.contains("target: capi-system/capi-controller-manager: Lease: would hold")
            && plan.contains("source: capd-system/capd-controller-manager: Scale: would pin to 0 replicas, saving 1")
            && plan.contains("stopped by Lease: its webhooks keep serving"),
        "{plan}"
    );
    assert!(!exists(&source.api, &["movewindow", WINDOW]));

    // Forcing Scale brings back the preflight's refusal: capi's pods serve a fail-closed webhook.
    let scale = window(&source, &target, &["open", WINDOW, "--stop", "scale"]);
    assert!(!scale.status.success());
    let err = text(&scale.stderr);
    assert!(
        err.contains("preflight")
            && err.contains(
                "capi-system/capi-controller-manager backs Service capi-system/capi-webhook-service"
            ),
        "{err}"
    );
    assert!(!exists(&source.api, &["movewindow", WINDOW]));

    // Before: both providers reconcile and lead.
    let source_holder = source.capi().wait_leader(&source.api, WAIT);
    let target_holder = target.capi().wait_leader(&target.api, WAIT);
    rising(&source.api, source.capi());
    rising(&target.api, target.capi());
    rising(&source.api, capd);

    // Open, as the operator, without --allow-webhook-outage.
    let t = Instant::now();
    let open = window(
        &source,
        &target,
        &["open", WINDOW, "--reason", "move to target"],
    );
    let open_took = t.elapsed();
    let log = text(&open.stderr);
    assert!(open.status.success(), "open: {log}");
    eprintln!("handoff window open:\n{log}");
    for want in [
        "source: took Lease capi-system/controller-leader-election-capi from capi-controller-manager-",
        "target: took Lease capi-system/controller-leader-election-capi from capi-controller-manager-",
        "stopped by Lease, its webhooks keep serving",
        "source: pinned capd-system/capd-controller-manager to 0 replicas (was 1)",
        "waiting",
        "source: stopped and serving: capi-system/capi-controller-manager",
        "target: stopped and serving: capi-system/capi-controller-manager",
    ] {
        assert!(log.contains(want), "open did not say {want:?}:\n{log}");
    }
    // The proof waited for the former leader's leaseDurationSeconds (4 s here).
    assert!(open_took >= Duration::from_secs(4), "{open_took:?}\n{log}");

    for (m, former) in [(&source, &source_holder), (&target, &target_holder)] {
        let lease = get(
            &m.api,
            &[
                "-n",
                "capi-system",
                "lease",
                "controller-leader-election-capi",
            ],
        );
        assert_eq!(
            lease["spec"]["holderIdentity"],
            "handoff.dev/move-window/capi-move"
        );
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 315_360_000);
        assert_eq!(lease["metadata"]["labels"][HELD_BY], WINDOW);
        assert_eq!(lease["metadata"]["annotations"][OPERATOR], NOBODY);
        // Taken from the leader of the moment, or from one that took over in between.
        let recorded = lease["metadata"]["annotations"]["handoff.dev/former-holder"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            holder_pod(&recorded).starts_with("capi-controller-manager-"),
            "{recorded} (leader before: {former})"
        );
        // Not scaled: both replicas keep running and serving.
        assert_eq!(
            replicas(&m.api, "capi-system", "capi-controller-manager"),
            2
        );
        let w = get(&m.api, &["movewindow", WINDOW]);
        let entry = &w["status"]["pinned"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "capi-controller-manager")
            .cloned()
            .unwrap();
        assert_eq!(entry["strategy"], "Lease", "{w}");
        assert_eq!(entry["leases"][0]["formerLeaseDurationSeconds"], 4, "{w}");
        assert!(entry["stoppedSince"].is_string(), "{w}");
        assert_eq!(w["status"]["operator"], NOBODY);
        assert_eq!(w["status"]["phase"], "Open");
    }
    assert_eq!(
        replicas(&source.api, "capd-system", "capd-controller-manager"),
        0
    );

    // During the window: no reconciler runs anywhere. Counted from here (the proof has
    // waited out the former leader's lease), and observed once every replica is a candidate
    // again (the former leaders exit 1 on lost leadership and restart) that has read the
    // window holding the Lease, for two lease durations: a candidate that would take a held
    // Lease, by its own duration or the Lease's, would have taken it and reconciled.
    let counts = [
        source.capi().reconciles(&source.api),
        target.capi().reconciles(&target.api),
    ];
    capd.wait_replicas(&source.api, 0, WAIT);
    let capd_count = capd.reconciles(&source.api);
    let candidates =
        [&source, &target].map(|m| m.capi().wait_candidates(&m.api, WINDOW_HOLDER, WAIT));
    // A lower bound, not a race: a slower machine only observes longer.
    std::thread::sleep(LeaseTiming::FAST.duration * 2);
    assert_eq!(
        [
            source.capi().reconciles(&source.api),
            target.capi().reconciles(&target.api)
        ],
        counts,
        "a provider reconciled while its Lease was held:\n{}\n{}",
        source.capi().logs(),
        target.capi().logs()
    );
    assert_eq!(capd.reconciles(&source.api), capd_count);
    // The same candidates all along: none restarted, led or lost in between, so each was
    // trying to take the Lease for the whole observation.
    for (m, before) in [&source, &target].into_iter().zip(&candidates) {
        assert_eq!(
            m.capi().candidates_seeing(&m.api, WINDOW_HOLDER).as_ref(),
            Some(before),
            "{}: the candidates changed during the observation:\n{}",
            m.label,
            m.capi().logs()
        );
    }
    // Open again: every step already done, the proof counted from the first take-over.
    let again = window(&source, &target, &["open", WINDOW]);
    let log = text(&again.stderr);
    assert!(again.status.success(), "{log}");
    assert!(
        log.contains("source: Lease capi-system/controller-leader-election-capi already held")
            && log.contains(
                "source: capd-system/capd-controller-manager already pinned (restores to 1)"
            )
            && !log.contains("waiting"),
        "{log}"
    );
    // ... and every write through the providers' fail-closed webhooks passes, in both clusters.
    for (m, name) in [(&source, "moved-a"), (&target, "moved-b")] {
        let before = m.capi().webhook_requests(&m.api);
        let out = create_cluster(&m.api, name);
        assert!(out.status.success(), "create {name}: {}", text(&out.stderr));
        assert!(m.capi().webhook_requests(&m.api) > before);
        assert_eq!(
            m.capi().pods(&m.api).len(),
            2,
            "the Lease-stopped provider keeps its replicas"
        );
    }
    // A write to the Lease-stopped Deployment is not pinned, by the webhook (target) or by
    // the webhook and the pin's policy (source); the Scale-stopped one is.
    for m in [&source, &target] {
        m.api.ok(
            ADMIN,
            &[
                "-n",
                "capi-system",
                "label",
                "deployment",
                "capi-controller-manager",
                "touched=yes",
                "--overwrite",
            ],
        );
        assert_eq!(
            replicas(&m.api, "capi-system", "capi-controller-manager"),
            2
        );
    }
    let out = source.api.kubectl(
        ADMIN,
        &[
            "-n",
            "capd-system",
            "scale",
            "deployment",
            "capd-controller-manager",
            "--replicas=3",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        replicas(&source.api, "capd-system", "capd-controller-manager"),
        0
    );

    // The hold is guarded: nobody but the operator may change or delete the Lease. UPDATE
    // matches the old object too (the label removed), DELETE the object deleted.
    let lease = [
        "-n",
        "capi-system",
        "lease",
        "controller-leader-election-capi",
    ];
    for m in [&source, &target] {
        for who in [BOB, PROVIDER_SA] {
            for args in [
                &["annotate", lease[0], lease[1], lease[2], lease[3], "x=y"][..],
                &[
                    "label",
                    lease[0],
                    lease[1],
                    lease[2],
                    lease[3],
                    &format!("{HELD_BY}-"),
                ][..],
                &["delete", lease[0], lease[1], lease[2], lease[3]][..],
                &[
                    "patch",
                    lease[0],
                    lease[1],
                    lease[2],
                    lease[3],
                    "--type=merge",
                    "-p",
                    r#"{"spec":{"holderIdentity":"capi-controller-manager-x-y_z"}}"#,
                ][..],
            ] {
                let out = m.api.kubectl(ADMIN, &[args, &["--as", who]].concat());
                let err = text(&out.stderr);
                assert!(!out.status.success(), "{who} could {args:?}");
                assert!(
                    err.contains("is held by MoveWindow \"capi-move\"")
                        && err.contains("only its operator \"nobody\"")
                        && err.contains("handoff window close capi-move"),
                    "{who} {args:?}: {err}"
                );
            }
        }
        // Every other Lease is nobody's business: never sent to handoff.
        m.api.apply("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: unrelated\n  namespace: capi-system\nspec:\n  holderIdentity: someone\n");
        let out = m.api.kubectl(
            ADMIN,
            &[
                "-n",
                "capi-system",
                "annotate",
                "lease",
                "unrelated",
                "x=y",
                "--as",
                BOB,
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let out = m.api.kubectl(
            ADMIN,
            &[
                "-n",
                "capi-system",
                "delete",
                "lease",
                "unrelated",
                "--as",
                PROVIDER_SA,
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    // Without the webhook, the source's policy holds the Lease alone.
    source.api.ok(
        ADMIN,
        &["delete", "validatingwebhookconfiguration", "handoff"],
    );
    let refused =
        support::apiserver::eventually("the policy refusing a held Lease's write", WAIT, || {
            let out = source.api.kubectl(
                ADMIN,
                &[
                    "annotate", lease[0], lease[1], lease[2], lease[3], "x=y", "--as", BOB,
                ],
            );
            let err = text(&out.stderr);
            (!out.status.success()
                && err.contains("ValidatingAdmissionPolicy 'handoff-lease-hold'"))
            .then_some(err)
        });
    assert!(
        refused.contains("is held by MoveWindow \"capi-move\"")
            && refused.contains("only its operator \"nobody\""),
        "{refused}"
    );
    let status = window(&source, &target, &["status"]);
    let table = text(&status.stdout);
    assert!(
        table.contains(
            "Lease controller-leader-election-capi: held; former holder capi-controller-manager-"
        ) && table.contains("operator: nobody"),
        "{table}"
    );

    // Close: the target's controllers first, then the source's; the policy lets the operator
    // release the source's Lease.
    let leases =
        [&source, &target].map(|m| LeaseWatch::start(&m.api, m.label, &[CAPI_LEASE.into()]));
    let t = Instant::now();
    let close = window(&source, &target, &["close", WINDOW]);
    let close_took = t.elapsed();
    let log = text(&close.stderr);
    assert!(close.status.success(), "close: {log}");
    eprintln!("handoff window close:\n{log}");
    // As the clusters record it: the target's Lease is taken by a provider pod before the
    // source's is.
    let capi_lease = [(CAPI_LEASE.to_string(), CAPI.to_string())];
    let [source_led, target_led] = leases.map(|w| w.led_again(WINDOW_HOLDER, &capi_lease, WAIT));
    led_first(&target_led, &source_led, "the target leads again first");
    assert!(
        log.contains("source: restored capd-system/capd-controller-manager to 1"),
        "{log}"
    );
    for m in [&source, &target] {
        let lease = get(
            &m.api,
            &[
                "-n",
                "capi-system",
                "lease",
                "controller-leader-election-capi",
            ],
        );
        let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
        assert!(
            holder_pod(holder).starts_with("capi-controller-manager-"),
            "{lease}"
        );
        assert!(
            lease["metadata"]["labels"].get(HELD_BY).is_none(),
            "{lease}"
        );
        assert!(
            lease["metadata"]["annotations"].get(OPERATOR).is_none(),
            "{lease}"
        );
        rising(&m.api, m.capi());
        assert_eq!(
            get(&m.api, &["movewindow", WINDOW])["status"]["phase"],
            "Closed"
        );
    }
    capd.wait_replicas(&source.api, 1, WAIT);
    rising(&source.api, capd);
    // Released: everybody may write the Lease again (the provider's leader election does).
    let out = source.api.kubectl(
        ADMIN,
        &[
            "annotate", lease[0], lease[1], lease[2], lease[3], "x=y", "--as", BOB,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    // A run that dies midway (here during the proof wait) is finished by running it again.
    let dir = tempfile::tempdir().expect("temp dir");
    let err_path = dir.path().join("open.err");
    let mut child = Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["window", "open", "again", "--kubeconfig"])
        .arg(target.api.kubeconfig(NOBODY))
        .env_remove("KUBECONFIG")
        .stderr(std::fs::File::create(&err_path).expect("open.err"))
        .spawn()
        .expect("handoff");
    support::apiserver::eventually("open to take the Lease", WAIT, || {
        std::fs::read_to_string(&err_path)
            .ok()
            .filter(|l| l.contains("took Lease"))
    });
    child.kill().expect("kill");
    let _ = child.wait();
    let lease_now = get(
        &target.api,
        &[
            "-n",
            "capi-system",
            "lease",
            "controller-leader-election-capi",
        ],
    );
    assert_eq!(
        lease_now["metadata"]["labels"][HELD_BY], "again",
        "{lease_now}"
    );
    let again = handoff(&target.api, NOBODY, &["window", "open", "again"]);
    let log = text(&again.stderr);
    assert!(again.status.success(), "{log}");
    assert!(
        log.contains("already held") && log.contains("stopped and serving"),
        "{log}"
    );
    let close = handoff(&target.api, NOBODY, &["window", "close", "again"]);
    assert!(close.status.success(), "{}", text(&close.stderr));
    let close = handoff(&target.api, NOBODY, &["window", "close", "again"]);
    let log = text(&close.stderr);
    assert!(close.status.success() && log.contains("is closed"), "{log}");
    target.capi().wait_leader(&target.api, WAIT);

    // The Scale strategy's figures, for comparison (webhooks down meanwhile).
    let t = Instant::now();
    let open = window(
        &source,
        &target,
        &[
            "open",
            "scaled",
            "--stop",
            "scale",
            "--allow-webhook-outage",
        ],
    );
    let scale_open_took = t.elapsed();
    assert!(open.status.success(), "{}", text(&open.stderr));
    let t = Instant::now();
    let close = window(&source, &target, &["close", "scaled"]);
    assert!(close.status.success(), "{}", text(&close.stderr));
    let scale_close_returned = t.elapsed();
    for m in [&source, &target] {
        m.capi().wait_leader(&m.api, WAIT);
        rising(&m.api, m.capi());
    }
    let scale_close_took = t.elapsed();
    eprintln!(
        "timings: Lease open {:.1}s (proven stopped), close {:.1}s (every controller leads again); Scale open {:.1}s (pods gone), close {:.1}s to return, {:.1}s until every controller leads again; whole test {:.1}s",
        open_took.as_secs_f64(),
        close_took.as_secs_f64(),
        scale_open_took.as_secs_f64(),
        scale_close_returned.as_secs_f64(),
        scale_close_took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// A Lease released moments ago (a move's source at its end, a window closed just before) has
/// no holder until a candidate takes it, so nothing on it says whose it is: a window opened
/// then waits for a candidate and stops the Deployment by its Lease. Taken for a Deployment
/// without leader election instead, it would be pinned to 0, its fail-closed webhook with it.
#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_lease_released_moments_ago_is_waited_for_not_taken_for_none() {
    if skip()
        || !support::netns::in_own_netns(
            "a_lease_released_moments_ago_is_waited_for_not_taken_for_none",
        )
    {
        return;
    }
    // Candidates that try every 5 s (plus up to 120 % jitter): a Lease written free stays free
    // 5–11 s, and the window reads it well within that.
    let slow = LeaseTiming {
        duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(5),
    };
    let m = Mgmt::start(
        "cluster",
        vec![
            ProviderSpec::capi_core()
                .replicas(2)
                .lease(slow)
                .webhook_service("capi-webhook-service", [10, 0, 0, 22].into()),
        ],
    );
    let (ns, lease) = CAPI_LEASE.split_once('/').unwrap();
    support::apiserver::eventually("a pod of Cluster API core leading", WAIT, || {
        get(&m.api, &["-n", ns, "lease", lease])["spec"]["holderIdentity"]
            .as_str()
            .filter(|h| h.starts_with(CAPI))
            .map(|_| ())
    });
    // Written free as client-go's release writes it.
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    m.api.ok(
        ADMIN,
        &[
            "-n",
            ns,
            "patch",
            "lease",
            lease,
            "--type",
            "merge",
            "-p",
            &format!(
                r#"{{"spec":{{"holderIdentity":"","leaseDurationSeconds":1,"acquireTime":"{now}","renewTime":"{now}"}}}}"#
            ),
        ],
    );
    let out = handoff(
        &m.api,
        ADMIN,
        &["window", "open", "released", "--wait-timeout", "60s"],
    );
    let log = text(&out.stdout) + &text(&out.stderr);
    eprintln!("window open right after a release:\n{log}");
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "Lease {CAPI_LEASE} was released moments ago and no candidate holds it yet; waiting"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("took Lease {CAPI_LEASE} from {CAPI}-")),
        "{log}"
    );
    assert!(!log.contains("pinned"), "{log}");
    assert_eq!(replicas(&m.api, ns, CAPI), 2);
    let w = get(&m.api, &["movewindow", "released"]);
    assert_eq!(w["status"]["pinned"][0]["strategy"], "Lease", "{w}");
    let out = handoff(&m.api, ADMIN, &["window", "close", "released"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `handoff window ARGS --source S --target T` as the operator.
fn window(source: &Mgmt, target: &Mgmt, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_handoff"))
        .arg("window")
        .args(args)
        .arg("--source")
        .arg(source.api.kubeconfig(NOBODY))
        .arg("--target")
        .arg(target.api.kubeconfig(NOBODY))
        .env_remove("KUBECONFIG")
        .output()
        .expect("handoff")
}

fn handoff(api: &ApiServer, user: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(args)
        .arg("--kubeconfig")
        .arg(api.kubeconfig(user))
        .env_remove("KUBECONFIG")
        .output()
        .expect("handoff")
}

fn create_cluster(api: &ApiServer, name: &str) -> Output {
    api.kubectl_stdin(
        ADMIN,
        &["create", "-f", "-"],
        Some(&cluster("clusters", name, false)),
    )
}

fn get(api: &ApiServer, args: &[&str]) -> Value {
    let out = api.ok(ADMIN, &[&["get"], args, &["-o", "json"]].concat());
    serde_json::from_str(&out).expect("json")
}

fn exists(api: &ApiServer, args: &[&str]) -> bool {
    api.kubectl(ADMIN, &[&["get"], args].concat())
        .status
        .success()
}

fn replicas(api: &ApiServer, ns: &str, name: &str) -> i64 {
    get(api, &["-n", ns, "deployment", name])["spec"]["replicas"]
        .as_i64()
        .unwrap_or(1)
}

/// Its reconcilers run: the counter rises.
fn rising(api: &ApiServer, p: &Provider) {
    let first = p.reconciles(api);
    support::apiserver::eventually("the reconcile counter to rise", WAIT, || {
        (p.reconciles(api) > first).then_some(())
    });
}
