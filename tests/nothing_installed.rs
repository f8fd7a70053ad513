//! `handoff window open` and `close` on an API server where nothing of handoff is installed (no
//! CRD, no webhook, no policy): each window brings its record's CRD and its own pin, two
//! windows share the CRD, and closing them takes everything away again, the CRD with the last.
//! The held-Lease guard it brings is driven on the real Cluster API (`tests/capi/moves.rs`).

mod support;

use std::time::Duration;

use support::apiserver::{ADMIN, ApiServer, capi_deployment, eventually, handoff_cmd, text};

const CRD: &str = "crd/movewindows.handoff.dev";

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_window_brings_what_it_needs_and_takes_it_away() {
    if support::apiserver::skip() {
        return;
    }
    let api = ApiServer::start();
    api.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: capi-system\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: capd-system\n");
    api.apply(&capi_deployment(
        "capi-system",
        "capi-controller-manager",
        Some(2),
    ));
    let capd = capi_deployment("capd-system", "capd-controller-manager", Some(1)).replace(
        "cluster.x-k8s.io/provider: cluster-api",
        "cluster.x-k8s.io/provider: infrastructure-docker",
    );
    api.apply(&capd);
    let run = |args: &[&str]| {
        let out = handoff_cmd(&api, args);
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "handoff {}: {said}", args.join(" "));
        said
    };
    let replicas = |ns: &str, name: &str| {
        let out = api.ok(
            ADMIN,
            &[
                "get",
                "deployment",
                "-n",
                ns,
                name,
                "-o",
                "jsonpath={.spec.replicas}",
            ],
        );
        out.trim().parse::<i64>().expect("replicas")
    };

    // Two windows, each selecting one provider.
    let said = run(&[
        "window",
        "open",
        "a",
        "-l",
        "cluster.x-k8s.io/provider=cluster-api",
        "--wait-timeout",
        "0s",
    ]);
    assert!(said.contains("brings its own"), "{said}");
    let said = run(&[
        "window",
        "open",
        "b",
        "-l",
        "cluster.x-k8s.io/provider=infrastructure-docker",
        "--wait-timeout",
        "0s",
    ]);
    assert!(said.contains("brings its own"), "{said}");
    let crd: serde_json::Value =
        serde_json::from_str(&api.ok(ADMIN, &["get", CRD, "-o", "json"])).expect("json");
    assert_eq!(
        crd["metadata"]["labels"]["handoff.dev/installed-by"],
        "handoff-window"
    );
    assert_eq!(crd["metadata"]["annotations"]["handoff.dev/windows"], "a,b");
    // Each window owns what it brought: deleting it takes them along.
    let uid = api.ok(
        ADMIN,
        &["get", "movewindow", "a", "-o", "jsonpath={.metadata.uid}"],
    );
    let owner = api.ok(
        ADMIN,
        &[
            "get",
            "mutatingadmissionpolicy",
            "handoff-window-a-pin",
            "-o",
            "jsonpath={.metadata.ownerReferences[0].uid}",
        ],
    );
    assert_eq!(owner.trim(), uid.trim());
    assert!(!uid.trim().is_empty());
    assert_eq!(replicas("capi-system", "capi-controller-manager"), 0);
    assert_eq!(replicas("capd-system", "capd-controller-manager"), 0);

    // The pin holds inside the API server, with no handoff running: a scale-up comes back 0,
    // an update's count is saved for the close, and nobody else's Deployment is touched.
    let (ns, name) = ("capi-system", "capi-controller-manager");
    api.ok(
        ADMIN,
        &["scale", "deployment", "-n", ns, name, "--replicas", "5"],
    );
    assert_eq!(replicas(ns, name), 0);
    api.ok(
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
    assert_eq!(replicas(ns, name), 0);
    let saved = api.ok(
        ADMIN,
        &[
            "get",
            "deployment",
            "-n",
            ns,
            name,
            "-o",
            "jsonpath={.metadata.annotations.handoff\\.dev/replicas-before-move}",
        ],
    );
    assert_eq!(saved.trim(), "3");
    api.apply(&support::apiserver::app_deployment("default", "web", 1));
    api.ok(
        ADMIN,
        &[
            "scale",
            "deployment",
            "-n",
            "default",
            "web",
            "--replicas",
            "4",
        ],
    );
    assert_eq!(replicas("default", "web"), 4);

    // Closing one takes its own pieces and leaves the other window's.
    run(&["window", "close", "a"]);
    assert_eq!(replicas("capi-system", "capi-controller-manager"), 3);
    let left = api.ok(ADMIN, &["get", "mutatingadmissionpolicies", "-o", "name"]);
    assert!(!left.contains("handoff-window-a-"), "{left}");
    assert!(left.contains("handoff-window-b-pin"), "{left}");
    let users = api.ok(
        ADMIN,
        &[
            "get",
            CRD,
            "-o",
            "jsonpath={.metadata.annotations.handoff\\.dev/windows}",
        ],
    );
    assert_eq!(users.trim(), "b");
    assert!(
        !api.kubectl(ADMIN, &["get", "movewindow", "a"])
            .status
            .success(),
        "window a outlived its close"
    );
    assert_eq!(
        replicas("capd-system", "capd-controller-manager"),
        0,
        "b still pins"
    );

    // The last one takes the CRD with it: nothing of handoff is left.
    run(&["window", "close", "b"]);
    assert_eq!(replicas("capd-system", "capd-controller-manager"), 1);
    eventually("the MoveWindow CRD gone", Duration::from_secs(60), || {
        (!api.kubectl(ADMIN, &["get", CRD]).status.success()).then_some(())
    });
    for kind in [
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicybindings",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
        "mutatingwebhookconfigurations",
    ] {
        let left = api.ok(ADMIN, &["get", kind, "-o", "name"]);
        assert!(!left.contains("handoff"), "{kind}: {left}");
    }
    // The same command again finds no such window, says so, and creates nothing.
    let out = handoff_cmd(&api, &["window", "close", "b"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("there is no MoveWindow b"),
        "{}",
        text(&out.stderr)
    );
    assert!(!api.kubectl(ADMIN, &["get", CRD]).status.success());
}
