//! handoff against a real kube-apiserver (envtest's binaries, see `tests/support/apiserver.rs`):
//! registered with the project's own `local` overlay, `handoff serve` watching as the base
//! manifests' ServiceAccount, and the cluster driven with kubectl as a user would, `--as` a
//! syncer where a syncer acts.
//!
//! Tests that share the one API server of this binary use namespaces of their own. Tests that
//! restart the API server, narrow handoff's RBAC or start without the CRD get one each.

mod support;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use support::apiserver::{
    ADMIN, ApiServer, FreezingProxy, GUARD_USER, HANDOFF_USER, Handoff, LOCATOR, NOBODY,
    SYNC_TARGET_KEY, SYNCER, app_deployment, capi_deployment, eventually, handoff_cmd, http_get,
    skip, text,
};

const SAVED: &str = "handoff.dev/replicas-before-move";
/// A second sync target, `eu-central1` in `root:org:ws`, that no namespace here holds.
const OTHER_KEY: &str = "7XC4490ppLf1aQRWnp9UqVybxCnQjtBwRpBHQ9";
const WAIT: Duration = Duration::from_secs(20);

struct Env {
    api: ApiServer,
    handoff: Handoff,
}

/// The API server every test of this binary shares, with handoff registered and ready. It
/// lives until the binary exits (the harness's processes die with it).
fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let api = ApiServer::start();
        let (handoff, _) = start_registered(&api, HANDOFF_USER, true, &[]);
        Env { api, handoff }
    })
}

/// handoff's RBAC from the base manifests (both roles bound to `HANDOFF_USER`, which serves
/// both webhooks) and the syncers' own rights.
fn grant(api: &ApiServer) {
    let rbac = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/base/rbac.yaml"),
    )
    .expect("rbac.yaml");
    api.apply(&rbac);
    // One process serving both webhooks holds both servers' roles, exactly as the manifests
    // grant them.
    for role in ["handoff-guard", "handoff-pin"] {
        api.apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-both-{role}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {role}\nsubjects:\n- kind: User\n  name: {HANDOFF_USER}\n"
        ));
    }
    // Syncers delete what they synced: give the impersonated ServiceAccount those rights.
    api.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-syncers\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\nsubjects:\n- kind: User\n  name: {SYNCER}\n"
    ));
}

/// `grant`, handoff serving and registered (with or without the CRD), ready when `wait` says
/// so.
fn start_registered(api: &ApiServer, user: &str, wait: bool, extra: &[&str]) -> (Handoff, String) {
    grant(api);
    let mut handoff = Handoff::start(api, user, extra);
    let rendered = handoff.rendered_local_overlay();
    api.apply(&rendered);
    if wait {
        handoff.wait_ready();
    }
    (handoff, rendered)
}

fn held_namespace(api: &ApiServer, name: &str, key: &str) {
    api.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  annotations:\n    kcp.io/namespace-locator: '{LOCATOR}'\n    finalizers.workload.kcp.io/{key}: glbc-migration\n"
    ));
}

fn configmaps(api: &ApiServer, ns: &str, names: &[&str]) {
    for n in names {
        api.ok(ADMIN, &["-n", ns, "create", "configmap", n]);
    }
}

fn exists(api: &ApiServer, args: &[&str]) -> bool {
    api.kubectl(ADMIN, &[&["get"], args].concat())
        .status
        .success()
}

/// `kubectl … --as <syncer>`: `(succeeded, stderr)`.
fn as_syncer(api: &ApiServer, args: &[&str]) -> (bool, String) {
    let out = api.kubectl(ADMIN, &[args, &["--as", SYNCER]].concat());
    (out.status.success(), text(&out.stderr))
}

fn assert_held(api: &ApiServer, args: &[&str], ns: &str) {
    let (ok, err) = as_syncer(api, args);
    assert!(!ok, "kubectl {} --as syncer passed", args.join(" "));
    assert!(
        err.contains("admission webhook \"sync-finalizer.handoff.dev\" denied the request")
            && err.contains(&format!("namespace \"{ns}\""))
            && err.contains(&format!("finalizers.workload.kcp.io/{SYNC_TARGET_KEY}"))
            && err.contains("us-west1"),
        "kubectl {}: {err}",
        args.join(" ")
    );
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_sync_targets_deletes_are_held_in_its_namespace_and_nobody_elses() {
    if skip() {
        return;
    }
    let api = &env().api;
    let ns = "guard-held";
    held_namespace(api, ns, SYNC_TARGET_KEY);
    configmaps(api, ns, &["db-config", "cache-config", "admin-owned"]);

    // A plain delete, a dry run and a delete-collection of the sync target are held.
    assert_held(api, &["-n", ns, "delete", "configmap", "db-config"], ns);
    assert_held(
        api,
        &[
            "-n",
            ns,
            "delete",
            "configmap",
            "db-config",
            "--dry-run=server",
        ],
        ns,
    );
    assert_held(
        api,
        &[
            "delete",
            "--raw",
            &format!("/api/v1/namespaces/{ns}/configmaps"),
        ],
        ns,
    );
    // The namespace itself (its deletion would cascade past the hold).
    assert_held(api, &["delete", "namespace", ns, "--wait=false"], ns);
    assert!(exists(api, &["-n", ns, "configmap", "db-config"]));
    assert!(exists(api, &["-n", ns, "configmap", "cache-config"]));
    let phase = api.ok(
        ADMIN,
        &["get", "namespace", ns, "-o", "jsonpath={.status.phase}"],
    );
    assert_eq!(phase, "Active");

    // The admin is never held (and the matchCondition means handoff is not even asked).
    api.ok(ADMIN, &["-n", ns, "delete", "configmap", "admin-owned"]);

    // Lifting the hold releases the sync target, as soon as handoff's watch sees it.
    api.ok(
        ADMIN,
        &[
            "annotate",
            "namespace",
            ns,
            &format!("finalizers.workload.kcp.io/{SYNC_TARGET_KEY}-"),
        ],
    );
    eventually("the lifted hold lets the syncer delete", WAIT, || {
        as_syncer(api, &["-n", ns, "delete", "configmap", "db-config"])
            .0
            .then_some(())
    });
    let (ok, err) = as_syncer(
        api,
        &[
            "delete",
            "--raw",
            &format!("/api/v1/namespaces/{ns}/configmaps"),
        ],
    );
    assert!(ok, "delete-collection after the hold was lifted: {err}");
    assert!(!exists(api, &["-n", ns, "configmap", "cache-config"]));
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_hold_for_another_sync_target_or_no_hold_lets_the_syncer_delete() {
    if skip() {
        return;
    }
    let api = &env().api;
    held_namespace(api, "guard-other", OTHER_KEY);
    configmaps(api, "guard-other", &["x"]);
    let (ok, err) = as_syncer(api, &["-n", "guard-other", "delete", "configmap", "x"]);
    assert!(ok, "another sync target's hold held this one: {err}");

    api.ok(ADMIN, &["create", "namespace", "guard-plain"]);
    configmaps(api, "guard-plain", &["y"]);
    let (ok, err) = as_syncer(api, &["-n", "guard-plain", "delete", "configmap", "y"]);
    assert!(ok, "a namespace without a hold held the syncer: {err}");
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_namespace_created_a_moment_before_the_delete_is_held() {
    if skip() {
        return;
    }
    let api = &env().api;
    let ns = "guard-fresh";
    // One apply creates the held namespace and its object; the delete follows at once, before
    // or after handoff's watch saw the namespace: either way it is held.
    api.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  annotations:\n    kcp.io/namespace-locator: '{LOCATOR}'\n    finalizers.workload.kcp.io/{SYNC_TARGET_KEY}: migrating\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: db-password\n  namespace: {ns}\nstringData:\n  p: x\n"
    ));
    assert_held(api, &["-n", ns, "delete", "secret", "db-password"], ns);
    assert!(exists(api, &["-n", ns, "secret", "db-password"]));
}

/// `(spec.replicas, the saved-count annotation)` of a Deployment.
fn replicas(api: &ApiServer, ns: &str, name: &str) -> (i64, Option<String>) {
    let d: Value =
        serde_json::from_str(&api.ok(ADMIN, &["-n", ns, "get", "deployment", name, "-o", "json"]))
            .expect("json");
    (
        d["spec"]["replicas"].as_i64().expect("replicas"),
        d["metadata"]["annotations"][SAVED]
            .as_str()
            .map(str::to_string),
    )
}

fn metric(handoff: &Handoff, name: &str) -> Option<f64> {
    let (_, body) = http_get(handoff.metrics_port, "/metrics")?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Only one test opens windows on the shared API server: a window is cluster-wide.
static WINDOWS: Mutex<()> = Mutex::new(());

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn an_open_window_pins_creates_applies_and_scales_and_close_restores() {
    if skip() {
        return;
    }
    let _one = WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    let Env { api, handoff } = env();
    api.ok(ADMIN, &["create", "namespace", "pin-capi"]);
    api.ok(ADMIN, &["create", "namespace", "pin-app"]);
    api.apply(&capi_deployment(
        "pin-capi",
        "capi-controller-manager",
        Some(2),
    ));
    api.apply(&app_deployment("pin-app", "web", 1));

    // A dry run says what open would do and writes nothing.
    let out = handoff_cmd(api, &["window", "open", "capi-move", "--dry-run"]);
    assert!(out.status.success(), "dry run: {}", text(&out.stderr));
    let plan = text(&out.stdout);
    assert!(
        plan.contains("cluster: would create MoveWindow capi-move (Open)")
            && plan.contains(
                "pin-capi/capi-controller-manager: Scale: would pin to 0 replicas, saving 2"
            )
            && !plan.contains("pin-app")
            && plan.contains("nothing was written"),
        "{plan}"
    );
    assert_eq!(
        replicas(api, "pin-capi", "capi-controller-manager"),
        (2, None)
    );
    assert!(!exists(api, &["movewindow", "capi-move"]));

    let out = handoff_cmd(
        api,
        &[
            "window",
            "open",
            "capi-move",
            "--reason",
            "test move",
            "--wait-timeout",
            "10s",
        ],
    );
    assert!(out.status.success(), "window open: {}", text(&out.stderr));
    assert_eq!(
        replicas(api, "pin-capi", "capi-controller-manager"),
        (0, Some("2".into()))
    );
    eventually("handoff sees the open window", WAIT, || {
        (metric(handoff, "handoff_open_move_windows") == Some(1.0)).then_some(())
    });

    // `handoff review` against the cluster gives the server's answer: a scale of the pinned
    // controller (recorded request, moved to this test's namespace) is pinned, an app's is not.
    let review = |ns: &str, name: &str| {
        let mut v: Value =
            serde_json::from_slice(&support::https::fixture("scale-deployment.json"))
                .expect("fixture");
        v["request"]["namespace"] = ns.into();
        v["request"]["name"] = name.into();
        v["request"]["object"]["metadata"]["namespace"] = ns.into();
        v["request"]["object"]["metadata"]["name"] = name.into();
        let file = handoff.dir.path().join(format!("review-{ns}-{name}.json"));
        std::fs::write(&file, v.to_string()).expect("review file");
        let out = handoff_cmd(api, &["review", file.to_str().expect("utf-8")]);
        assert!(out.status.success(), "review: {}", text(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).expect("response json")["response"].clone()
    };
    let pinned = review("pin-capi", "capi-controller-manager");
    assert_eq!(pinned["allowed"], true, "{pinned}");
    assert_eq!(pinned["patchType"], "JSONPatch", "{pinned}");
    assert!(
        pinned["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("MoveWindow \"capi-move\" pins")),
        "{pinned}"
    );
    let app = review("pin-app", "web");
    assert_eq!(app["allowed"], true, "{app}");
    assert!(app.get("patch").is_none(), "{app}");

    // A create of a selected Deployment: stored at 0, the asked-for count kept, and kubectl
    // prints the warning.
    let out = api.kubectl_stdin(
        ADMIN,
        &["apply", "-f", "-"],
        Some(&capi_deployment(
            "pin-capi",
            "capi-kubeadm-bootstrap",
            Some(3),
        )),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let warning = text(&out.stderr);
    assert!(
        warning.contains("Warning: MoveWindow \"capi-move\" pins Deployment pin-capi/capi-kubeadm-bootstrap to 0 replicas")
            && warning.contains("restored to 3"),
        "{warning}"
    );
    assert_eq!(
        replicas(api, "pin-capi", "capi-kubeadm-bootstrap"),
        (0, Some("3".into()))
    );

    // A client-side apply that asks for 4.
    let out = api.kubectl_stdin(
        ADMIN,
        &["apply", "-f", "-"],
        Some(&capi_deployment(
            "pin-capi",
            "capi-controller-manager",
            Some(4),
        )),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("Warning: MoveWindow"));
    assert_eq!(
        replicas(api, "pin-capi", "capi-controller-manager"),
        (0, Some("4".into()))
    );

    // A server-side apply that asks for 5 (its manifest carries no annotation).
    let out = api.kubectl_stdin(
        ADMIN,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gitops",
            "-f",
            "-",
        ],
        Some(&capi_deployment(
            "pin-capi",
            "capi-controller-manager",
            Some(5),
        )),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        replicas(api, "pin-capi", "capi-controller-manager"),
        (0, Some("5".into()))
    );

    // kubectl scale: the Scale is pinned, the saved count stands.
    let out = api.kubectl(
        ADMIN,
        &[
            "-n",
            "pin-capi",
            "scale",
            "deployment",
            "capi-controller-manager",
            "--replicas=6",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The count the server-side apply saved, read from handoff's Deployment watch.
    assert!(
        text(&out.stderr).contains("Warning: MoveWindow \"capi-move\" pins")
            && text(&out.stderr).contains("restored to 5"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        replicas(api, "pin-capi", "capi-controller-manager"),
        (0, Some("5".into()))
    );

    // An application is never touched.
    api.ok(
        ADMIN,
        &[
            "-n",
            "pin-app",
            "scale",
            "deployment",
            "web",
            "--replicas=3",
        ],
    );
    assert_eq!(replicas(api, "pin-app", "web"), (3, None));

    let out = handoff_cmd(api, &["window", "status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("capi-move") && table.contains("pin-capi/capi-controller-manager"),
        "{table}"
    );

    let out = handoff_cmd(api, &["window", "close", "capi-move"]);
    assert!(out.status.success(), "window close: {}", text(&out.stderr));
    assert_eq!(
        replicas(api, "pin-capi", "capi-controller-manager"),
        (5, None)
    );
    assert_eq!(
        replicas(api, "pin-capi", "capi-kubeadm-bootstrap"),
        (3, None)
    );
    eventually("handoff sees the window closed", WAIT, || {
        (metric(handoff, "handoff_open_move_windows") == Some(0.0)).then_some(())
    });
    api.ok(
        ADMIN,
        &[
            "-n",
            "pin-capi",
            "scale",
            "deployment",
            "capi-controller-manager",
            "--replicas=2",
        ],
    );
    assert_eq!(
        replicas(api, "pin-capi", "capi-controller-manager"),
        (2, None)
    );
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn the_watch_lists_again_after_the_api_server_restarts() {
    if skip() {
        return;
    }
    let mut api = ApiServer::start();
    let (mut handoff, _) = start_registered(&api, HANDOFF_USER, true, &[]);
    held_namespace(&api, "before-restart", SYNC_TARGET_KEY);
    configmaps(&api, "before-restart", &["a"]);
    assert_held(
        &api,
        &["-n", "before-restart", "delete", "configmap", "a"],
        "before-restart",
    );

    let synced = |h: &Handoff| h.log().matches("cache synced").count();
    let before = synced(&handoff);
    api.restart_apiserver(Duration::from_secs(1));
    // A namespace created after the restart, seen plain by the new list...
    api.ok(ADMIN, &["create", "namespace", "after-restart"]);
    configmaps(&api, "after-restart", &["b"]);
    eventually("every watch lists again after the restart", WAIT, || {
        (synced(&handoff) >= before + 3).then_some(())
    });
    let (ok, err) = as_syncer(&api, &["-n", "after-restart", "delete", "configmap", "b"]);
    assert!(ok, "a plain namespace held the syncer: {err}");
    configmaps(&api, "after-restart", &["c"]);
    // ...then held: only the resumed watch can bring that news, as handoff has the namespace.
    api.ok(
        ADMIN,
        &[
            "annotate",
            "namespace",
            "after-restart",
            &format!("kcp.io/namespace-locator={LOCATOR}"),
            &format!("finalizers.workload.kcp.io/{SYNC_TARGET_KEY}=after-restart"),
        ],
    );
    // A dry run gets the real verdict and deletes nothing, so polling with it cannot lose the
    // object to the moment before the watch event arrives.
    let delete_c = ["-n", "after-restart", "delete", "configmap", "c"];
    eventually("the hold set after the restart holds", WAIT, || {
        let (ok, _) = as_syncer(&api, &[&delete_c[..], &["--dry-run=server"]].concat());
        (!ok).then_some(())
    });
    assert_held(&api, &delete_c, "after-restart");
    assert!(exists(&api, &["-n", "after-restart", "configmap", "c"]));
    handoff.stop();
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn without_rights_to_movewindows_the_guard_still_holds_and_apps_scale() {
    if skip() {
        return;
    }
    let api = ApiServer::start();
    // handoff's rights, less movewindows: RBAC narrowed by hand, or an old ClusterRole.
    api.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: handoff-narrow\nrules:\n- apiGroups: [\"\"]\n  resources: [namespaces]\n  verbs: [get, list, watch]\n- apiGroups: [apps]\n  resources: [deployments]\n  verbs: [get, list, watch]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: handoff-narrow\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: handoff-narrow\nsubjects:\n- kind: User\n  name: {NOBODY}\n"
    ));
    let (handoff, _) = start_registered(&api, NOBODY, false, &[]);
    eventually("the movewindows watch reports RBAC", WAIT, || {
        handoff
            .log()
            .contains("movewindows.handoff.dev is forbidden")
            .then_some(())
    });
    held_namespace(&api, "narrow", SYNC_TARGET_KEY);
    configmaps(&api, "narrow", &["c"]);
    assert_held(
        &api,
        &["-n", "narrow", "delete", "configmap", "c"],
        "narrow",
    );
    api.ok(ADMIN, &["-n", "narrow", "delete", "configmap", "c"]);

    // An application's scale-up is none of the pin's business, whatever handoff cannot read.
    api.ok(ADMIN, &["create", "namespace", "shop"]);
    api.apply(&app_deployment("shop", "web", 1));
    let out = api.kubectl(
        ADMIN,
        &["-n", "shop", "scale", "deployment", "web", "--replicas=3"],
    );
    assert!(
        out.status.success(),
        "an app's scale-up was refused: {}",
        text(&out.stderr)
    );
    assert_eq!(replicas(&api, "shop", "web"), (3, None));
}

/// A client that writes `role: null` and `stop: null` (a JSON pipeline, a GitOps tool) gets a
/// window without them, as `None` means, instead of "Unsupported value: null"; a value the
/// enum does not list is still refused.
#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_movewindow_written_with_null_role_and_stop_is_taken_without_them() {
    if skip() {
        return;
    }
    let api = ApiServer::start();
    api.install_crd();
    let window = |name: &str, role: &str| {
        format!(
            r#"{{"apiVersion":"handoff.dev/v1alpha1","kind":"MoveWindow","metadata":{{"name":"{name}"}},"spec":{{"state":"Closed","role":{role},"stop":null}}}}"#
        )
    };
    let out = api.kubectl_stdin(
        ADMIN,
        &["create", "-f", "-"],
        Some(&window("nulls", "null")),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let spec = api.ok(
        ADMIN,
        &["get", "movewindow", "nulls", "-o", "jsonpath={.spec}"],
    );
    assert_eq!(spec, r#"{"state":"Closed"}"#);
    let out = api.kubectl_stdin(
        ADMIN,
        &["create", "-f", "-"],
        Some(&window("middle", r#""middle""#)),
    );
    assert!(
        !out.status.success()
            && text(&out.stderr).contains(r#"spec.role: Unsupported value: "middle""#),
        "{}",
        text(&out.stderr)
    );
    // A merge patch's null removes the field, as it does anywhere.
    api.ok(
        ADMIN,
        &[
            "patch",
            "movewindow",
            "nulls",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"role":"source"}}"#,
        ],
    );
    api.ok(
        ADMIN,
        &[
            "patch",
            "movewindow",
            "nulls",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"role":null}}"#,
        ],
    );
    let spec = api.ok(
        ADMIN,
        &["get", "movewindow", "nulls", "-o", "jsonpath={.spec}"],
    );
    assert_eq!(spec, r#"{"state":"Closed"}"#);
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_crd_installed_after_start_up_is_picked_up() {
    if skip() {
        return;
    }
    let api = ApiServer::start();
    grant(&api);
    let mut handoff = Handoff::start(&api, HANDOFF_USER, &[]);
    // Everything but the CRD first.
    let rendered = handoff.rendered_local_overlay();
    let (crd, rest): (Vec<&str>, Vec<&str>) = rendered
        .split("\n---\n")
        .partition(|doc| doc.contains("kind: CustomResourceDefinition"));
    api.apply(&rest.join("\n---\n"));
    eventually(
        "the movewindows watch fails for want of the CRD",
        WAIT,
        || handoff.log().contains("watch failed").then_some(()),
    );
    assert!(handoff.readyz().is_some_and(|(code, _)| code == 503));
    api.apply(&crd.join("\n---\n"));
    api.ok(
        ADMIN,
        &[
            "wait",
            "--for=condition=Established",
            "crd/movewindows.handoff.dev",
        ],
    );
    eventually(
        "handoff lists MoveWindows once the CRD exists",
        WAIT * 3,
        || {
            handoff
                .log()
                .lines()
                .any(|l| l.contains("cache synced") && l.contains("movewindows"))
                .then_some(())
        },
    );
    handoff.wait_ready();
    api.ok(ADMIN, &["create", "namespace", "late-capi"]);
    api.apply(&capi_deployment(
        "late-capi",
        "capi-controller-manager",
        Some(1),
    ));
    let out = handoff_cmd(&api, &["window", "open", "late", "--wait-timeout", "0s"]);
    assert!(out.status.success(), "window open: {}", text(&out.stderr));
    eventually("handoff sees the window", WAIT, || {
        (metric(&handoff, "handoff_open_move_windows") == Some(1.0)).then_some(())
    });
    api.ok(
        ADMIN,
        &[
            "-n",
            "late-capi",
            "scale",
            "deployment",
            "capi-controller-manager",
            "--replicas=2",
        ],
    );
    assert_eq!(
        replicas(&api, "late-capi", "capi-controller-manager"),
        (0, Some("1".into()))
    );
    handoff.stop();
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_silently_dead_watch_never_lets_a_sync_target_delete_under_a_hold_it_missed() {
    if skip() {
        return;
    }
    let api = ApiServer::start();
    let proxy = FreezingProxy::start(api.port);
    grant(&api);
    // handoff reaches the API server only through the proxy.
    let mut handoff = Handoff::start_with_kubeconfig(
        &api.kubeconfig_at(HANDOFF_USER, &proxy.url()),
        &["--max-staleness", "2s"],
    );
    api.apply(&handoff.rendered_local_overlay());
    handoff.wait_ready();
    api.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: quiet\n  annotations:\n    kcp.io/namespace-locator: '{LOCATOR}'\n"
    ));
    configmaps(&api, "quiet", &["x", "y"]);
    let (ok, err) = as_syncer(&api, &["-n", "quiet", "delete", "configmap", "x"]);
    assert!(ok, "no hold yet: {err}");

    // The watch connection goes silent; the hold that follows never reaches handoff's cache.
    proxy.freeze();
    api.ok(
        ADMIN,
        &[
            "annotate",
            "namespace",
            "quiet",
            &format!("finalizers.workload.kcp.io/{SYNC_TARGET_KEY}=migrating"),
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    let (ok, err) = as_syncer(&api, &["-n", "quiet", "delete", "configmap", "y"]);
    assert!(
        !ok,
        "deleted under a hold that the dead watch never delivered"
    );
    // Denied on the fresh read: it saw the hold, or (its pooled connection frozen too) it
    // failed, which denies as well; never on the stale cache's "no hold".
    assert!(
        err.contains("denied the request")
            && (err.contains(&format!("finalizers.workload.kcp.io/{SYNC_TARGET_KEY}"))
                || err.contains("reading namespace quiet failed")),
        "{err}"
    );
    assert!(exists(&api, &["-n", "quiet", "configmap", "y"]));
    // Nobody else waits for any of this.
    api.ok(ADMIN, &["-n", "quiet", "delete", "configmap", "y"]);
    handoff.stop();
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_guard_only_replica_needs_and_watches_nothing_of_the_pin() {
    if skip() {
        return;
    }
    let api = ApiServer::start();
    // The guard's own identity and rights from the manifests: namespaces, nothing of the pin.
    grant(&api);
    let mut guard = Handoff::start(&api, GUARD_USER, &["--webhooks", "sync-finalizer"]);
    api.apply(&guard.rendered_local_overlay());
    guard.wait_ready();
    let log = guard.log();
    assert!(
        !log.contains("movewindows") && !log.contains("deployments"),
        "a guard-only replica touched the pin's resources:\n{log}"
    );
    held_namespace(&api, "alone", SYNC_TARGET_KEY);
    configmaps(&api, "alone", &["c"]);
    assert_held(&api, &["-n", "alone", "delete", "configmap", "c"], "alone");
    // Sent here by mistake, a scale is answered 404 (not decided), and the scale entry's
    // failurePolicy Ignore lets an app's scale through.
    api.apply(&app_deployment("alone", "web", 1));
    api.ok(
        ADMIN,
        &["-n", "alone", "scale", "deployment", "web", "--replicas=2"],
    );
    assert_eq!(replicas(&api, "alone", "web"), (2, None));
    guard.stop();
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn warn_audit_and_break_glass_as_users_meet_them_and_back_to_enforce_without_a_restart() {
    if skip() {
        return;
    }
    let api = ApiServer::start();
    let cfg_dir = tempfile::tempdir().expect("temp dir");
    let cfg = cfg_dir.path().join("config.yaml");
    let write_cfg = |guard: &str| {
        std::fs::write(
            &cfg,
            format!("enforcement:\n  syncFinalizer: {guard}\n  moveWindow: enforce\nexemptions:\n- group: move-breakglass\n"),
        )
        .expect("config");
    };
    write_cfg("warn");
    let (handoff, _) = start_registered(
        &api,
        HANDOFF_USER,
        true,
        &["--config", cfg.to_str().expect("utf-8")],
    );
    let modes = |want: &str| {
        eventually(&format!("/readyz shows {want}"), WAIT, || {
            handoff
                .readyz()
                .filter(|(code, body)| *code == 200 && body.contains(want))
                .map(|_| ())
        })
    };
    modes("sync-finalizer: warn, move-window: enforce");
    held_namespace(&api, "rollout", SYNC_TARGET_KEY);
    configmaps(&api, "rollout", &["a", "b", "c"]);

    // warn: the delete goes through and kubectl prints what enforce would have said.
    let (ok, err) = as_syncer(&api, &["-n", "rollout", "delete", "configmap", "a"]);
    assert!(ok, "warn denied: {err}");
    assert!(
        err.contains("Warning: handoff would deny this request (sync-finalizer is in warn mode): namespace \"rollout\" carries the sync finalizer"),
        "{err}"
    );

    // audit: through, silently; the API server's audit log records what would have happened.
    write_cfg("audit");
    modes("sync-finalizer: audit");
    let (ok, err) = as_syncer(&api, &["-n", "rollout", "delete", "configmap", "b"]);
    assert!(ok, "audit denied: {err}");
    assert!(!err.contains("Warning"), "audit warned: {err}");
    let annotations = eventually("the audit event of the delete", WAIT, || {
        api.audit_events().into_iter().find_map(|e| {
            let deleted_b = e["verb"] == "delete"
                && e["objectRef"]["name"] == "b"
                && e["stage"] == "ResponseComplete";
            deleted_b.then(|| e["annotations"].clone())
        })
    });
    assert_eq!(
        annotations["sync-finalizer.handoff.dev/decision"], "would-deny",
        "{annotations}"
    );
    assert_eq!(
        annotations["sync-finalizer.handoff.dev/reason"], "namespace-sync-finalizer",
        "{annotations}"
    );

    // Break-glass: a member of the exempt group scales a pinned controller during a window.
    api.ok(ADMIN, &["create", "namespace", "bg-capi"]);
    api.apply(&capi_deployment(
        "bg-capi",
        "capi-controller-manager",
        Some(2),
    ));
    let out = handoff_cmd(&api, &["window", "open", "bg", "--wait-timeout", "0s"]);
    assert!(out.status.success(), "window open: {}", text(&out.stderr));
    eventually("handoff sees the window", WAIT, || {
        (metric(&handoff, "handoff_open_move_windows") == Some(1.0)).then_some(())
    });
    api.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: oncall\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\nsubjects:\n- kind: User\n  name: oncall\n"
    );
    let scale = [
        "-n",
        "bg-capi",
        "scale",
        "deployment",
        "capi-controller-manager",
        "--replicas=1",
        "--as",
        "oncall",
    ];
    let out = api.kubectl(ADMIN, &scale);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        replicas(&api, "bg-capi", "capi-controller-manager"),
        (0, Some("2".into())),
        "not in the group: pinned"
    );
    let out = api.kubectl(
        ADMIN,
        &[&scale[..], &["--as-group", "move-breakglass"]].concat(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(
            "Warning: exempt from the move-window rule as a member of group \"move-breakglass\""
        ),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        replicas(&api, "bg-capi", "capi-controller-manager").0,
        1,
        "the exempt scale went through"
    );
    // Counted per call: an exempt scale-up meets both entries that match it, the installed
    // one (which fails open) and the window's own (`handoff-window-<name>`, which fails
    // closed); a pinned one meets only the first, since the second skips a scale to 0.
    assert!(
        http_get(handoff.metrics_port, "/metrics").is_some_and(
            |(_, m)| m.contains("handoff_exempt_requests_total{webhook=\"move-window\"} 2")
        ),
        "exempt counter"
    );

    // Back to enforce, no restart: held again.
    write_cfg("enforce");
    modes("sync-finalizer: enforce");
    assert_held(
        &api,
        &["-n", "rollout", "delete", "configmap", "c"],
        "rollout",
    );
    assert!(exists(&api, &["-n", "rollout", "configmap", "c"]));
}
