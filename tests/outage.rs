//! handoff-pin down, as the manifests deploy it (`support::shipped`: the API server calls it
//! through its Service, verified against the injected caBundle): outside a window nothing of
//! handoff fails closed for a Deployment or a Lease, so a provider's rollout, a `clusterctl
//! upgrade`-style update and the providers' own leader election all pass; while a window is
//! open, exactly what it stops fails closed (`window_webhook`): a pinned controller cannot be
//! scaled or updated past the pin, and nobody else's Deployment or Lease is touched.

mod support;

use std::time::Duration;

use support::apiserver::{
    ADMIN, ApiServer, app_deployment, capi_deployment, eventually, handoff_cmd, text,
};
use support::shipped::{NAMESPACE, Shipped, get_json};

const WITHIN: Duration = Duration::from_secs(60);
const WINDOW: &str = "capi-move";
const CONTROLLER: (&str, &str) = ("capi-system", "capi-controller-manager");
/// A provider's leader-election Lease in a namespace of its own (the controller in
/// `CONTROLLER` leader-elects with none, so the window pins it by Scale).
const LEASE: (&str, &str) = ("capd-system", "controller-leader-election-capd");

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn nothing_fails_closed_outside_a_window_and_a_window_holds_what_it_pins() {
    if support::apiserver::skip()
        || !support::netns::in_own_netns(
            "nothing_fails_closed_outside_a_window_and_a_window_holds_what_it_pins",
        )
    {
        return;
    }
    let api = ApiServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let shipped = Shipped::deploy(&api, dir.path());
    api.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: capi-system\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: apps\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: capd-system\n");
    api.apply(&capi_deployment(CONTROLLER.0, CONTROLLER.1, Some(1)));
    api.apply(&app_deployment("apps", "web", 1));
    renew_lease(&api, 1).expect("the provider's Lease, written with handoff up");

    // No window, handoff-pin at 0 replicas.
    pin_down(&api, &shipped);
    let (ns, name) = CONTROLLER;
    ok(&api, &["rollout", "restart", "deployment", "-n", ns, name]);
    // What `clusterctl upgrade` does to a provider: a new image in the Deployment.
    ok(
        &api,
        &[
            "set",
            "image",
            "deployment",
            "-n",
            ns,
            name,
            "manager=registry.example/capi:v2",
        ],
    );
    ok(
        &api,
        &["scale", "deployment", "-n", ns, name, "--replicas", "2"],
    );
    ok(
        &api,
        &[
            "scale",
            "deployment",
            "-n",
            "apps",
            "web",
            "--replicas",
            "2",
        ],
    );
    renew_lease(&api, 2).expect("a provider's Lease renewal, no window open, handoff-pin down");
    assert_eq!(replicas(&api, ns, name), 2, "nothing pinned it");

    // A window opened with handoff-pin up: its own configuration, failing closed for exactly
    // what it stops.
    pin_up(&api, &shipped);
    let out = handoff_cmd(&api, &["window", "open", WINDOW, "--wait-timeout", "0s"]);
    assert!(
        out.status.success(),
        "window open: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let own = get_json(
        &api,
        &[
            "get",
            "mutatingwebhookconfiguration",
            &format!("handoff-window-{WINDOW}"),
        ],
    );
    for w in own["webhooks"].as_array().expect("webhooks") {
        assert_eq!(w["failurePolicy"], "Fail", "{w}");
        assert_eq!(w["clientConfig"]["service"]["name"], "handoff-pin", "{w}");
    }
    assert_eq!(replicas(&api, ns, name), 0, "pinned by the window");
    let uid = get_json(&api, &["get", "movewindow", WINDOW])["metadata"]["uid"].clone();
    assert_eq!(
        own["metadata"]["ownerReferences"][0]["uid"], uid,
        "owned by its window"
    );
    assert!(uid.is_string());

    // handoff-pin down again, the window open.
    pin_down(&api, &shipped);
    let refused = eventually("a pinned controller's scale-up refused", WITHIN, || {
        let out = api.kubectl(
            ADMIN,
            &["scale", "deployment", "-n", ns, name, "--replicas", "3"],
        );
        (!out.status.success()).then(|| text(&out.stderr))
    });
    assert!(
        refused.contains("move-window-scale.handoff.dev"),
        "{refused}"
    );
    let out = api.kubectl(
        ADMIN,
        &[
            "patch",
            "deployment",
            "-n",
            ns,
            name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":3}}"#,
        ],
    );
    assert!(
        !out.status.success(),
        "an update past the pin passed: {}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("move-window.handoff.dev"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(replicas(&api, ns, name), 0, "still pinned");
    // Nobody else's request reaches the window's configuration.
    ok(
        &api,
        &[
            "scale",
            "deployment",
            "-n",
            "apps",
            "web",
            "--replicas",
            "3",
        ],
    );
    ok(
        &api,
        &["rollout", "restart", "deployment", "-n", "apps", "web"],
    );
    renew_lease(&api, 3).expect("a Lease the window does not hold, handoff-pin down");

    // Closed with handoff-pin up: its configuration goes, the count comes back.
    pin_up(&api, &shipped);
    let out = handoff_cmd(&api, &["window", "close", WINDOW]);
    assert!(
        out.status.success(),
        "window close: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        !api.kubectl(
            ADMIN,
            &[
                "get",
                "mutatingwebhookconfiguration",
                &format!("handoff-window-{WINDOW}")
            ]
        )
        .status
        .success(),
        "the window's configuration outlived it"
    );
    assert_eq!(replicas(&api, ns, name), 2, "restored");
    pin_down(&api, &shipped);
    eventually(
        "a provider's rollout passes again with handoff-pin down",
        WITHIN,
        || {
            api.kubectl(ADMIN, &["rollout", "restart", "deployment", "-n", ns, name])
                .status
                .success()
                .then_some(())
        },
    );
    ok(
        &api,
        &["scale", "deployment", "-n", ns, name, "--replicas", "1"],
    );
    assert_eq!(replicas(&api, ns, name), 1);
}

/// handoff-pin scaled to 0 and its pods gone: its Service has no endpoint.
fn pin_down(api: &ApiServer, shipped: &Shipped) {
    ok(
        api,
        &[
            "scale",
            "deployment",
            "-n",
            NAMESPACE,
            "handoff-pin",
            "--replicas",
            "0",
        ],
    );
    for p in shipped.kubelet.pods_of("handoff-pin") {
        if !p.terminating {
            shipped.kubelet.terminate(&p.name);
        }
    }
    shipped.kubelet.wait_terminated("handoff-pin", WITHIN);
}

/// handoff-pin back at the replicas the manifests give it, every pod ready.
fn pin_up(api: &ApiServer, shipped: &Shipped) {
    let shipped_replicas = shipped
        .rendered
        .objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "handoff-pin")
        .and_then(|d| d["spec"]["replicas"].as_u64())
        .unwrap_or(1);
    ok(
        api,
        &[
            "scale",
            "deployment",
            "-n",
            NAMESPACE,
            "handoff-pin",
            "--replicas",
            &shipped_replicas.to_string(),
        ],
    );
    shipped
        .kubelet
        .run_deployment(NAMESPACE, "handoff-pin", WITHIN);
}

fn ok(api: &ApiServer, args: &[&str]) {
    let out = api.kubectl(ADMIN, args);
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        text(&out.stderr)
    );
}

fn replicas(api: &ApiServer, ns: &str, name: &str) -> i64 {
    get_json(api, &["get", "deployment", "-n", ns, name])["spec"]["replicas"]
        .as_i64()
        .unwrap_or(1)
}

/// What a provider's leader election writes: its Lease, renewed.
fn renew_lease(api: &ApiServer, n: u32) -> Result<(), String> {
    let yaml = format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: {}\n  namespace: {}\nspec:\n  holderIdentity: capd-controller-manager-7d9f-abcde_1\n  leaseDurationSeconds: 15\n  leaseTransitions: {n}\n",
        LEASE.1, LEASE.0
    );
    let out = api.kubectl_stdin(ADMIN, &["apply", "-f", "-"], Some(&yaml));
    match out.status.success() {
        true => Ok(()),
        false => Err(text(&out.stderr)),
    }
}
