//! handoff reading holds where kcp users set them (`--kcp-kubeconfig`), against a real
//! kube-apiserver as the physical cluster and a second one behind a stand-in for kcp's
//! `/clusters/<name>/` and `/clusters/*/` URLs (`tests/support/kcp.rs`; not a kcp build).

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::apiserver::{
    ADMIN, ApiServer, HANDOFF_USER, Handoff, LOCATOR, SYNCER, eventually, handoff_cmd, skip, text,
};
use support::kcp::KcpStandIn;

const WAIT: Duration = Duration::from_secs(30);
const HOLD: &str = "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g";

/// handoff's RBAC as the base manifests and the kcp overlay grant it, to the one user that
/// serves both webhooks here, and the syncer's own rights.
fn grant(api: &ApiServer) {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    for file in ["base/rbac.yaml", "overlays/kcp/rbac-mirror.yaml"] {
        api.apply(&std::fs::read_to_string(manifests.join(file)).expect(file));
    }
    for role in ["handoff-guard", "handoff-pin", "handoff-guard-kcp-mirror"] {
        api.apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-{role}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {role}\nsubjects:\n- kind: User\n  name: {HANDOFF_USER}\n"
        ));
    }
    api.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-syncers\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\nsubjects:\n- kind: User\n  name: {SYNCER}\n"
    ));
}

/// `kubectl … --as <syncer>`: `(succeeded, stderr)`.
fn as_syncer(api: &ApiServer, args: &[&str]) -> (bool, String) {
    let out = api.kubectl(ADMIN, &[args, &["--as", SYNCER]].concat());
    (out.status.success(), text(&out.stderr))
}

/// The namespace's annotations.
fn annotations(api: &ApiServer, ns: &str) -> Value {
    let v: Value = serde_json::from_str(&api.ok(ADMIN, &["get", "namespace", ns, "-o", "json"]))
        .expect("json");
    v["metadata"]["annotations"].clone()
}

/// The field managers that own something of the namespace.
fn managers(api: &ApiServer, ns: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(&api.ok(
        ADMIN,
        &[
            "get",
            "namespace",
            ns,
            "-o",
            "json",
            "--show-managed-fields",
        ],
    ))
    .expect("json");
    v["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["manager"].as_str().map(str::to_string))
        .collect()
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_hold_set_in_kcp_holds_the_sync_target_is_mirrored_lifts_there_and_kcp_down_denies_only_it() {
    if skip() {
        return;
    }
    let api = ApiServer::start();
    let kcp_api = ApiServer::start();
    let mut kcp = KcpStandIn::start(&kcp_api, "root:org:ws");
    grant(&api);
    // A kubeconfig for the workspace, as kcp hands them out: handoff cuts it back to the base.
    let kcp_kubeconfig = kcp.kubeconfig(api.dir.path(), Some("root:org:ws"));
    let mut handoff = Handoff::start(
        &api,
        HANDOFF_USER,
        &[
            "--kcp-kubeconfig",
            kcp_kubeconfig.to_str().expect("utf-8"),
            "--max-staleness",
            "2s",
        ],
    );
    api.apply(&handoff.rendered_local_overlay());
    handoff.wait_ready();

    // In kcp: namespace `test` of workspace root:org:ws. Here: the namespace the syncer made
    // for it, with nothing but the locator (and an annotation of someone else's).
    kcp_api.ok(ADMIN, &["create", "namespace", "test"]);
    let ns = "kcp-2f3mx0a9bq1c";
    api.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  annotations:\n    kcp.io/namespace-locator: '{LOCATOR}'\n    example.com/owner: team-a\n"
    ));
    for cm in ["a", "b", "c", "admin-owned"] {
        api.ok(ADMIN, &["-n", ns, "create", "configmap", cm]);
    }
    // A namespace no locator names: nothing of kcp is read for it.
    api.ok(ADMIN, &["create", "namespace", "unlocated"]);
    api.ok(ADMIN, &["-n", "unlocated", "create", "configmap", "x"]);
    api.ok(ADMIN, &["-n", "unlocated", "create", "configmap", "y"]);

    let (ok, err) = as_syncer(&api, &["-n", ns, "delete", "configmap", "a"]);
    assert!(ok, "nothing holds yet: {err}\n{}", handoff.log());

    // (a) A hold set in kcp holds the sync target's delete here...
    kcp_api.ok(
        ADMIN,
        &[
            "annotate",
            "namespace",
            "test",
            &format!("{HOLD}=glbc-migration"),
        ],
    );
    let delete_b = ["-n", ns, "delete", "configmap", "b"];
    let err = eventually("the hold set in kcp holds the syncer", WAIT, || {
        let (ok, err) = as_syncer(&api, &[&delete_b[..], &["--dry-run=server"]].concat());
        (!ok).then_some(err)
    });
    let (ok, err2) = as_syncer(&api, &delete_b);
    assert!(!ok, "deleted under a hold set in kcp");
    for e in [&err, &err2] {
        for part in [
            "admission webhook \"sync-finalizer.handoff.dev\" denied the request",
            "kcp namespace \"test\" (workspace root:org:ws)",
            &format!("{HOLD}=\"glbc-migration\""),
            "sync target \"us-west1\"",
            &format!("configmaps \"b\" in namespace \"{ns}\""),
            "The hold is set in kcp",
            &format!(
                "kubectl --server {}/clusters/root:org:ws annotate namespace test {HOLD}-",
                kcp.url()
            ),
        ] {
            assert!(e.contains(part), "missing {part:?} in {e}");
        }
    }
    // ...and the admin is never held.
    api.ok(ADMIN, &["-n", ns, "delete", "configmap", "admin-owned"]);
    // It is mirrored onto the physical namespace, by handoff's own field manager, and nothing
    // else there changes.
    eventually(
        "the hold is mirrored onto the physical namespace",
        WAIT,
        || (annotations(&api, ns)[HOLD] == "glbc-migration").then_some(()),
    );
    let a = annotations(&api, ns);
    assert_eq!(a["example.com/owner"], "team-a");
    assert_eq!(a["kcp.io/namespace-locator"], LOCATOR);
    assert!(
        managers(&api, ns).iter().any(|m| m == "handoff-kcp-mirror"),
        "{:?}",
        managers(&api, ns)
    );
    // The mirrored hold is what the in-API-server policy reads (it cannot call kcp): with the
    // policy installed, the syncer's delete is refused by it, before any webhook is asked.
    api.ok(ADMIN, &["create", "namespace", "handoff-system"]);
    let out = handoff_cmd(&api, &["policy", "install"]);
    assert!(
        out.status.success(),
        "policy install: {}",
        text(&out.stderr)
    );
    eventually("the admission policy holds the mirrored hold", WAIT, || {
        let (ok, err) = as_syncer(&api, &[&delete_b[..], &["--dry-run=server"]].concat());
        (!ok && err.contains("ValidatingAdmissionPolicy 'handoff-sync-finalizer'")
            && err.contains(&format!("{HOLD}=\"glbc-migration\"")))
        .then_some(())
    });
    // The mirror's rights cannot bring a namespace back: an apply that would create one is
    // refused (patch, no create).
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(api.kubeconfig(HANDOFF_USER))
        .args([
            "apply",
            "--server-side",
            "--field-manager",
            "handoff-kcp-mirror",
            "-f",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().expect("stdin").write_all(
                b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: never-created\n",
            )?;
            c.wait_with_output()
        })
        .expect("kubectl");
    assert!(
        !out.status.success() && text(&out.stderr).contains("forbidden"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !api.kubectl(ADMIN, &["get", "namespace", "never-created"])
            .status
            .success()
    );

    // The wildcard watch across logical clusters was listed (items keyed by kcp.io/cluster).
    assert!(
        handoff
            .log()
            .lines()
            .any(|l| l.contains("cache synced") && l.contains("kcp namespaces")),
        "{}",
        handoff.log()
    );

    // (b) Lifting it in kcp releases the delete and the mirrored annotation.
    kcp_api.ok(
        ADMIN,
        &["annotate", "namespace", "test", &format!("{HOLD}-")],
    );
    eventually("the mirrored hold is removed", WAIT, || {
        annotations(&api, ns).get(HOLD).is_none().then_some(())
    });
    eventually("the lifted hold lets the syncer delete", WAIT, || {
        as_syncer(&api, &[&delete_b[..], &["--dry-run=server"]].concat())
            .0
            .then_some(())
    });
    let (ok, err) = as_syncer(&api, &delete_b);
    assert!(ok, "the hold was lifted in kcp: {err}");
    assert_eq!(annotations(&api, ns)["example.com/owner"], "team-a");

    // A hold an operator copied down by hand, with another value, is neither taken over nor
    // removed by the mirror: its apply conflicts and says so, and the hold stays when kcp lifts
    // its own.
    kcp_api.ok(ADMIN, &["create", "namespace", "manual"]);
    let manual_locator = LOCATOR.replace("\"namespace\":\"test\"", "\"namespace\":\"manual\"");
    assert_ne!(manual_locator, LOCATOR);
    api.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kcp-manual\n  annotations:\n    kcp.io/namespace-locator: '{manual_locator}'\n    {HOLD}: operator-copy\n"
    ));
    api.ok(ADMIN, &["-n", "kcp-manual", "create", "configmap", "m"]);
    kcp_api.ok(
        ADMIN,
        &[
            "annotate",
            "namespace",
            "manual",
            &format!("{HOLD}=glbc-migration"),
        ],
    );
    eventually("the mirror reports the conflict", WAIT, || {
        handoff
            .log()
            .lines()
            .any(|l| l.contains("mirror: cannot copy") && l.contains("kcp-manual"))
            .then_some(())
    });
    assert_eq!(annotations(&api, "kcp-manual")[HOLD], "operator-copy");
    kcp_api.ok(
        ADMIN,
        &["annotate", "namespace", "manual", &format!("{HOLD}-")],
    );
    // A whole mirror round after the lift, proven by a witness and not waited for by the clock:
    // kcp namespace `test` is given a hold, then another value, each waited for in `ns`. Each
    // round reads every namespace once, so the round that copied the second value began after
    // the first was copied, which came after the lift: that round read `manual` lifted.
    for witness in ["witness-1", "witness-2"] {
        kcp_api.ok(
            ADMIN,
            &[
                "annotate",
                "--overwrite",
                "namespace",
                "test",
                &format!("{HOLD}={witness}"),
            ],
        );
        eventually(&format!("the mirror copies {witness}"), WAIT, || {
            (annotations(&api, ns).get(HOLD).and_then(Value::as_str) == Some(witness)).then_some(())
        });
    }
    kcp_api.ok(
        ADMIN,
        &["annotate", "namespace", "test", &format!("{HOLD}-")],
    );
    eventually("the witness hold is removed", WAIT, || {
        annotations(&api, ns).get(HOLD).is_none().then_some(())
    });
    // The physical hold is still there and still holds, and the denial now names the physical
    // namespace.
    assert_eq!(annotations(&api, "kcp-manual")[HOLD], "operator-copy");
    let (ok, err) = as_syncer(&api, &["-n", "kcp-manual", "delete", "configmap", "m"]);
    assert!(
        !ok && err.contains("namespace \"kcp-manual\" carries the sync finalizer")
            && err.contains("operator-copy"),
        "{err}"
    );

    // A kcp namespace that is gone holds nothing (kcp's 404 names it); a logical cluster kcp
    // does not know is no "no hold" (its 404 names no namespace): the delete is refused.
    for (ns, locator) in [
        (
            "kcp-gone",
            LOCATOR.replace("\"namespace\":\"test\"", "\"namespace\":\"gone\""),
        ),
        (
            "kcp-elsewhere",
            LOCATOR.replace(
                "\"cluster\":\"root:org:ws\",\"namespace\"",
                "\"cluster\":\"root:other\",\"namespace\"",
            ),
        ),
    ] {
        assert_ne!(locator, LOCATOR);
        api.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  annotations:\n    kcp.io/namespace-locator: '{locator}'\n"
        ));
        api.ok(ADMIN, &["-n", ns, "create", "configmap", "z"]);
    }
    let (ok, err) = as_syncer(&api, &["-n", "kcp-gone", "delete", "configmap", "z"]);
    assert!(ok, "a kcp namespace that is gone held the syncer: {err}");
    let (ok, err) = as_syncer(&api, &["-n", "kcp-elsewhere", "delete", "configmap", "z"]);
    assert!(
        !ok && err.contains("kcp answered 404 for /clusters/root:other/api/v1/namespaces/test without naming the namespace"),
        "{err}"
    );

    // (c) kcp stopped: the sync target's delete in the located namespace is denied with the
    // reason; an admin's passes, and so does the sync target's where no locator names kcp.
    kcp.stop();
    let delete_c = ["-n", ns, "delete", "configmap", "c"];
    let err = eventually("kcp down denies the sync target", WAIT, || {
        let (ok, err) = as_syncer(&api, &[&delete_c[..], &["--dry-run=server"]].concat());
        (!ok).then_some(err)
    });
    assert!(
        err.contains("cannot read kcp namespace \"test\" (workspace root:org:ws)")
            && err.contains("fail closed"),
        "{err}"
    );
    let (ok, _) = as_syncer(&api, &delete_c);
    assert!(!ok, "deleted while kcp could not be read");
    let (ok, err) = as_syncer(&api, &["-n", "unlocated", "delete", "configmap", "x"]);
    assert!(ok, "a namespace no locator names waited for kcp: {err}");
    api.ok(ADMIN, &["-n", ns, "delete", "configmap", "c"]);
    assert!(handoff.readyz().is_some_and(|(code, _)| code == 200));
    handoff.stop();
}
