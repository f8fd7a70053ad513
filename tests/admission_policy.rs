//! One rule, two engines (issue 11): every row below runs through a real kube-apiserver twice,
//! once where handoff's webhooks decide (registered with the `local` overlay, `handoff serve`
//! running) and once where only the admission policies of `handoff policy install` decide
//! (no `handoff serve` at all), and the two must give the same verdicts and leave the same
//! objects behind. The policy cluster also checks what the policies say and that `handoff
//! policy uninstall` leaves nothing.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::apiserver::{
    ADMIN, ApiServer, HANDOFF_USER, Handoff, LOCATOR, SYNC_TARGET_KEY, SYNCER, app_deployment,
    capi_deployment, eventually, handoff_cmd, skip, text,
};

const SAVED: &str = "handoff.dev/replicas-before-move";
/// `eu-central1` in `root:org:ws`.
const OTHER_KEY: &str = "7XC4490ppLf1aQRWnp9UqVybxCnQjtBwRpBHQ9";
/// us-west1's key under kcp v0.7–v0.10's scheme.
const LEGACY_KEY: &str = "2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5";
/// A syncer whose sync target no namespace's locator names.
const UNKNOWN_SYNCER: &str = "system:serviceaccount:kcp-syncer-eu-abcdefgh:kcp-syncer-eu-abcdefgh";
/// Named in the config file; not a `kcp-syncer-<name>-<id>` name, so only the file resolves it.
const EXPLICIT: &str = "system:serviceaccount:edge:kcp-syncer-edge";
const EU_LOCATOR: &str = r#"{"syncTarget":{"cluster":"root:org:ws","name":"eu-central1","uid":"euUID"},"cluster":"root:org:ws","namespace":"eu"}"#;
const WAIT: Duration = Duration::from_secs(30);

fn config_file(dir: &Path) -> String {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!("syncTargets:\n- username: {EXPLICIT}\n  key: {SYNC_TARGET_KEY}\n"),
    )
    .expect("config");
    path.to_str().expect("utf-8").to_string()
}

/// Syncers delete what they synced: give the impersonated users those rights.
fn grant_syncers(api: &ApiServer) {
    for (i, user) in [SYNCER, UNKNOWN_SYNCER, EXPLICIT].iter().enumerate() {
        api.apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-syncer-{i}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\nsubjects:\n- kind: User\n  name: {user}\n"
        ));
    }
}

fn namespace(api: &ApiServer, name: &str, annotations: &[(&str, &str)]) {
    let mut y = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n");
    if !annotations.is_empty() {
        y.push_str("  annotations:\n");
        for (k, v) in annotations {
            y.push_str(&format!("    {k}: '{v}'\n"));
        }
    }
    api.apply(&y);
}

fn configmap(api: &ApiServer, ns: &str, name: &str, annotations: &[(&str, &str)]) {
    let mut y =
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n");
    if !annotations.is_empty() {
        y.push_str("  annotations:\n");
        for (k, v) in annotations {
            y.push_str(&format!("    {k}: '{v}'\n"));
        }
    }
    api.apply(&y);
}

#[derive(Clone, Copy, Debug)]
enum Act {
    Delete,
    DryRun,
    Collection,
    DeleteNamespace,
}

struct GuardRow {
    name: &'static str,
    user: &'static str,
    ns: Vec<(&'static str, &'static str)>,
    object: Vec<(&'static str, &'static str)>,
    act: Act,
    allowed: bool,
}

fn hold(key: &str) -> (&'static str, &'static str) {
    let k: &'static str = Box::leak(format!("finalizers.workload.kcp.io/{key}").into_boxed_str());
    (k, "glbc-migration")
}

fn guard_rows() -> Vec<GuardRow> {
    let loc = ("kcp.io/namespace-locator", LOCATOR);
    let row = |name, user, ns: Vec<_>, object: Vec<_>, act, allowed| GuardRow {
        name,
        user,
        ns,
        object,
        act,
        allowed,
    };
    use Act::*;
    vec![
        row(
            "held",
            SYNCER,
            vec![loc, hold(SYNC_TARGET_KEY)],
            vec![],
            Delete,
            false,
        ),
        row(
            "held-dry-run",
            SYNCER,
            vec![loc, hold(SYNC_TARGET_KEY)],
            vec![],
            DryRun,
            false,
        ),
        row(
            "held-collection",
            SYNCER,
            vec![loc, hold(SYNC_TARGET_KEY)],
            vec![],
            Collection,
            false,
        ),
        row(
            "held-namespace",
            SYNCER,
            vec![loc, hold(SYNC_TARGET_KEY)],
            vec![],
            DeleteNamespace,
            false,
        ),
        row(
            "legacy-domain-and-key",
            SYNCER,
            vec![
                ("kcp.dev/namespace-locator", LOCATOR),
                (
                    "finalizers.workload.kcp.dev/2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5",
                    "x",
                ),
            ],
            vec![],
            Delete,
            false,
        ),
        row(
            "admin",
            ADMIN,
            vec![loc, hold(SYNC_TARGET_KEY)],
            vec![],
            Delete,
            true,
        ),
        row(
            "other-target-held",
            SYNCER,
            vec![loc, hold(OTHER_KEY)],
            vec![],
            Delete,
            true,
        ),
        row("no-hold", SYNCER, vec![loc], vec![], Delete, true),
        row(
            "empty-value",
            SYNCER,
            vec![
                loc,
                (
                    "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g",
                    "",
                ),
            ],
            vec![],
            Delete,
            true,
        ),
        row(
            "object-hold",
            SYNCER,
            vec![loc],
            vec![hold(SYNC_TARGET_KEY)],
            Delete,
            false,
        ),
        row(
            "object-hold-other",
            SYNCER,
            vec![loc],
            vec![hold(OTHER_KEY)],
            Delete,
            true,
        ),
        row(
            "no-locator-held",
            SYNCER,
            vec![hold(SYNC_TARGET_KEY)],
            vec![],
            Delete,
            false,
        ),
        row("no-locator-no-hold", SYNCER, vec![], vec![], Delete, true),
        row(
            "unknown-syncer-held",
            UNKNOWN_SYNCER,
            vec![loc, hold(SYNC_TARGET_KEY)],
            vec![],
            Delete,
            false,
        ),
        row(
            "unknown-syncer-other-hold",
            UNKNOWN_SYNCER,
            vec![loc, hold(OTHER_KEY)],
            vec![],
            Delete,
            false,
        ),
        row(
            "unknown-syncer-free",
            UNKNOWN_SYNCER,
            vec![loc],
            vec![],
            Delete,
            true,
        ),
        row(
            "locator-without-cluster",
            SYNCER,
            vec![
                (
                    "kcp.io/namespace-locator",
                    r#"{"syncTarget":{"name":"us-west1","uid":"syncTargetUID"},"namespace":"test"}"#,
                ),
                hold(OTHER_KEY),
            ],
            vec![],
            Delete,
            false,
        ),
        row(
            "foreign-locator-held",
            SYNCER,
            vec![("kcp.io/namespace-locator", EU_LOCATOR), hold(OTHER_KEY)],
            vec![],
            Delete,
            false,
        ),
        row(
            "explicit-held",
            EXPLICIT,
            vec![hold(SYNC_TARGET_KEY)],
            vec![],
            Delete,
            false,
        ),
        row(
            "explicit-other",
            EXPLICIT,
            vec![hold(OTHER_KEY)],
            vec![],
            Delete,
            true,
        ),
        row(
            "explicit-legacy-key",
            EXPLICIT,
            vec![hold(LEGACY_KEY)],
            vec![],
            Delete,
            true,
        ),
    ]
}

fn guard_setup(api: &ApiServer, rows: &[GuardRow]) {
    for (i, r) in rows.iter().enumerate() {
        let ns = format!("g{i}");
        namespace(api, &ns, &r.ns);
        configmap(api, &ns, "cm", &r.object);
        configmap(api, &ns, "cm2", &r.object);
    }
}

/// `(allowed, stderr)` of one row's request.
fn guard_run(api: &ApiServer, i: usize, r: &GuardRow) -> (bool, String) {
    guard_run_in(api, format!("g{i}"), r)
}

fn guard_run_in(api: &ApiServer, ns: String, r: &GuardRow) -> (bool, String) {
    let args: Vec<String> = match r.act {
        Act::Delete => vec![
            "-n".into(),
            ns,
            "delete".into(),
            "configmap".into(),
            "cm".into(),
        ],
        Act::DryRun => vec![
            "-n".into(),
            ns,
            "delete".into(),
            "configmap".into(),
            "cm".into(),
            "--dry-run=server".into(),
        ],
        Act::Collection => vec![
            "delete".into(),
            "--raw".into(),
            format!("/api/v1/namespaces/{ns}/configmaps"),
        ],
        Act::DeleteNamespace => vec![
            "delete".into(),
            "namespace".into(),
            ns,
            "--wait=false".into(),
        ],
    };
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    if r.user != ADMIN {
        args.extend(["--as", r.user]);
    }
    let out = api.kubectl(ADMIN, &args);
    (out.status.success(), text(&out.stderr))
}

/// `(spec.replicas, the saved-count annotation)` of a Deployment, or of a JSON object.
fn counts(d: &Value) -> (i64, Option<String>) {
    (
        d["spec"]["replicas"].as_i64().unwrap_or(-1),
        d["metadata"]["annotations"][SAVED]
            .as_str()
            .map(str::to_string),
    )
}

fn deployment(api: &ApiServer, ns: &str, name: &str) -> (i64, Option<String>) {
    counts(
        &serde_json::from_str(&api.ok(ADMIN, &["-n", ns, "get", "deployment", name, "-o", "json"]))
            .expect("json"),
    )
}

fn kubectl_ok(api: &ApiServer, args: &[&str], stdin: Option<&str>) -> String {
    let out = api.kubectl_stdin(ADMIN, args, stdin);
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The pin's rows, in order (each may build on the one before): what each did to the objects.
fn pin_run(api: &ApiServer) -> Vec<(&'static str, (i64, Option<String>))> {
    let mut seen = Vec::new();
    let apply = |y: &str| kubectl_ok(api, &["apply", "-f", "-"], Some(y));
    apply(&capi_deployment("pin-capi", "a", Some(3)));
    seen.push(("create", deployment(api, "pin-capi", "a")));
    apply(&capi_deployment("pin-capi", "a", Some(4)));
    seen.push(("client-side apply", deployment(api, "pin-capi", "a")));
    kubectl_ok(
        api,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gitops",
            "-f",
            "-",
        ],
        Some(&capi_deployment("pin-capi", "a", Some(5))),
    );
    seen.push(("server-side apply", deployment(api, "pin-capi", "a")));
    kubectl_ok(
        api,
        &[
            "-n",
            "pin-capi",
            "scale",
            "deployment",
            "pre",
            "--replicas=7",
        ],
        None,
    );
    seen.push((
        "scale of a pinned Deployment",
        deployment(api, "pin-capi", "pre"),
    ));
    apply(&capi_deployment("pin-capi", "no-count", None));
    seen.push((
        "create without replicas",
        deployment(api, "pin-capi", "no-count"),
    ));
    apply(&capi_deployment("pin-capi", "u", Some(2)));
    kubectl_ok(
        api,
        &[
            "-n",
            "pin-capi",
            "annotate",
            "deployment",
            "u",
            &format!("{SAVED}=abc"),
            "--overwrite",
        ],
        None,
    );
    seen.push((
        "saved count overwritten with garbage",
        deployment(api, "pin-capi", "u"),
    ));
    let dry = kubectl_ok(
        api,
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(&capi_deployment("pin-capi", "dry", Some(3))),
    );
    seen.push((
        "dry-run create",
        counts(&serde_json::from_str(&dry).expect("json")),
    ));
    apply(&app_deployment("pin-app", "web", 2));
    seen.push(("an app's create", deployment(api, "pin-app", "web")));
    kubectl_ok(
        api,
        &[
            "-n",
            "pin-app",
            "scale",
            "deployment",
            "web",
            "--replicas=3",
        ],
        None,
    );
    seen.push(("an app's scale", deployment(api, "pin-app", "web")));
    apply(&capi_deployment("handoff-system", "handoff-pin", Some(2)));
    seen.push((
        "handoff's own Deployment",
        deployment(api, "handoff-system", "handoff-pin"),
    ));
    // Taken out of the window's selector by the update itself: the webhook reads the new
    // labels; a binding's objectSelector also matches the old ones (the policy checks again).
    apply(&capi_deployment("pin-capi", "out", Some(3)));
    kubectl_ok(
        api,
        &[
            "-n",
            "pin-capi",
            "patch",
            "deployment",
            "out",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"cluster.x-k8s.io/provider":null}},"spec":{"replicas":2}}"#,
        ],
        None,
    );
    seen.push((
        "relabelled out of the window",
        deployment(api, "pin-capi", "out"),
    ));
    // Created at 0 with a count nobody can read: left for `window close` to report.
    apply(&capi_deployment("pin-capi", "garbled", Some(0)).replacen(
        "  labels:\n",
        &format!("  annotations:\n    {SAVED}: \"-0x\"\n  labels:\n"),
        1,
    ));
    seen.push((
        "created with an unreadable count",
        deployment(api, "pin-capi", "garbled"),
    ));
    // A signed, zero-padded count is still a count.
    apply(&capi_deployment("pin-capi", "padded", Some(0)).replacen(
        "  labels:\n",
        &format!("  annotations:\n    {SAVED}: \"+0007\"\n  labels:\n"),
        1,
    ));
    seen.push((
        "created with a padded count",
        deployment(api, "pin-capi", "padded"),
    ));
    seen
}

fn expected_pins() -> Vec<(&'static str, (i64, Option<String>))> {
    let s = |n: &str| Some(n.to_string());
    vec![
        ("create", (0, s("3"))),
        ("client-side apply", (0, s("4"))),
        ("server-side apply", (0, s("5"))),
        ("scale of a pinned Deployment", (0, s("2"))),
        ("create without replicas", (0, s("1"))),
        ("saved count overwritten with garbage", (0, s("2"))),
        ("dry-run create", (0, s("3"))),
        ("an app's create", (2, None)),
        ("an app's scale", (3, None)),
        ("handoff's own Deployment", (2, None)),
        ("relabelled out of the window", (2, s("3"))),
        ("created with an unreadable count", (0, s("-0x"))),
        ("created with a padded count", (0, s("7"))),
    ]
}

fn pin_setup(api: &ApiServer) {
    for ns in ["pin-capi", "pin-app"] {
        api.ok(ADMIN, &["create", "namespace", ns]);
    }
    api.apply(&capi_deployment("pin-capi", "pre", Some(2)));
}

/// Until a dry-run scale of the pinned `pre` comes back at 0: whichever engine pins, it has
/// seen the window.
fn wait_pinning(api: &ApiServer) {
    wait_pinning_of(api, "pre");
}

/// Until a server-side dry run of scaling `deployment` comes back pinned at 0: the API server's
/// policy informers have seen the binding and its parameters.
fn wait_pinning_of(api: &ApiServer, deployment: &str) {
    eventually(&format!("the window pins {deployment}"), WAIT, || {
        let out = api.kubectl(
            ADMIN,
            &[
                "-n",
                "pin-capi",
                "scale",
                "deployment",
                deployment,
                "--replicas=1",
                "--dry-run=server",
                "-o",
                "json",
            ],
        );
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["spec"]["replicas"] == 0).then_some(())
    });
}

fn rbac_for_handoff(api: &ApiServer) {
    let rbac = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/base/rbac.yaml"),
    )
    .expect("rbac.yaml");
    // The Role and RoleBinding live in handoff-system, as kustomize would place them.
    api.ok(ADMIN, &["create", "namespace", "handoff-system"]);
    kubectl_ok(
        api,
        &["apply", "-n", "handoff-system", "-f", "-"],
        Some(&rbac),
    );
    for role in ["handoff-guard", "handoff-pin"] {
        api.apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-both-{role}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {role}\nsubjects:\n- kind: User\n  name: {HANDOFF_USER}\n"
        ));
    }
    api.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: test-params\n  namespace: handoff-system\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: handoff-guard-policy-params\nsubjects:\n- kind: User\n  name: {HANDOFF_USER}\n"
    ));
}

struct Outcome {
    guard: Vec<(bool, String)>,
    pins: Vec<(&'static str, (i64, Option<String>))>,
    late_scale: (i64, Option<String>),
}

/// The webhook engine: handoff serve registered with the local overlay.
fn through_webhook(rows: &[GuardRow]) -> Outcome {
    let api = ApiServer::start();
    rbac_for_handoff(&api);
    grant_syncers(&api);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config_file(dir.path());
    let mut handoff = Handoff::start(&api, HANDOFF_USER, &["--config", &config]);
    api.apply(&handoff.rendered_local_overlay());
    handoff.wait_ready();
    guard_setup(&api, rows);
    pin_setup(&api);
    // The guard's cache sees the namespaces (a miss is read once anyway).
    let guard = rows
        .iter()
        .enumerate()
        .map(|(i, r)| guard_run(&api, i, r))
        .collect();
    let out = handoff_cmd(&api, &["window", "open", "eq", "--wait-timeout", "0s"]);
    assert!(out.status.success(), "window open: {}", text(&out.stderr));
    wait_pinning(&api);
    let pins = pin_run(&api);
    let late_scale = late_scale(&api);
    let out = handoff_cmd(&api, &["window", "close", "eq"]);
    assert!(out.status.success(), "window close: {}", text(&out.stderr));
    Outcome {
        guard,
        pins,
        late_scale,
    }
}

/// A Deployment that came to match after `window open` ran ("a", created above) and is then
/// scaled: the webhook reads its labels; the scale policy knows only what the window lists.
fn late_scale(api: &ApiServer) -> (i64, Option<String>) {
    kubectl_ok(
        api,
        &["-n", "pin-capi", "scale", "deployment", "a", "--replicas=8"],
        None,
    );
    deployment(api, "pin-capi", "a")
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn the_webhook_and_the_admission_policies_give_the_same_answers() {
    if skip() {
        return;
    }
    let rows = guard_rows();
    // The webhook's cluster runs on a thread of its own, beside the policies' cluster.
    let webhook = std::thread::scope(|s| {
        let w = s.spawn(|| through_webhook(&rows));
        let policy = through_policies(&rows);
        let webhook = w.join().expect("webhook engine");
        for (i, r) in rows.iter().enumerate() {
            let (w, p) = (&webhook.guard[i], &policy.guard[i]);
            assert_eq!(
                w.0, r.allowed,
                "webhook, row {}: allowed={} ({})",
                r.name, w.0, w.1
            );
            assert_eq!(
                p.0, r.allowed,
                "policy, row {}: allowed={} ({})",
                r.name, p.0, p.1
            );
        }
        assert_eq!(webhook.pins, expected_pins(), "webhook pins");
        assert_eq!(policy.pins, expected_pins(), "policy pins");
        webhook
    });
    // The one difference, documented in the book (tasks/admission-policies.md): a scale of a Deployment that the window's
    // selector picks but `window open` did not record. The webhook pins it from its cache of
    // Deployment labels; a Scale carries no labels, so the policy pins it only once `handoff
    // window open` runs again and records it.
    assert_eq!(webhook.late_scale.0, 0, "{:?}", webhook.late_scale);
}

/// The policy engine: `handoff policy install`, and no `handoff serve` at all.
fn through_policies(rows: &[GuardRow]) -> Outcome {
    let api = ApiServer::start();
    api.ok(ADMIN, &["create", "namespace", "handoff-system"]);
    let crd = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"))
        .arg("crd")
        .output()
        .expect("handoff crd");
    api.apply(&text(&crd.stdout));
    grant_syncers(&api);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config_file(dir.path());
    guard_setup(&api, rows);
    pin_setup(&api);

    // Shown first: the YAML it would apply, with the syncer the namespaces name.
    let out = handoff_cmd(&api, &["policy", "show", "--config", &config]);
    assert!(out.status.success(), "policy show: {}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("kind: ValidatingAdmissionPolicy\n")
            && shown.contains("kind: MutatingAdmissionPolicy\n")
            && shown.contains("s.kcp-syncer-us-west1-1nuzj7pw:")
            && shown.contains("u.system_3aserviceaccount_3aedge_3akcp-syncer-edge:"),
        "{shown}"
    );
    assert!(
        api.kubectl(
            ADMIN,
            &["get", "validatingadmissionpolicy", "handoff-sync-finalizer"]
        )
        .status
        .code()
            != Some(0),
        "show wrote nothing"
    );
    for _ in 0..2 {
        // Twice: install is idempotent.
        let out = handoff_cmd(&api, &["policy", "install", "--config", &config]);
        assert!(
            out.status.success(),
            "policy install: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("published 3 sync-target identities"),
            "{}",
            text(&out.stderr)
        );
    }
    // The API server takes a moment to load a new policy: wait until the first row holds.
    let probe = rows
        .iter()
        .position(|r| r.name == "held")
        .expect("probe row");
    namespace(&api, "probe", &rows[probe].ns);
    eventually("the guard's policy is in force", WAIT, || {
        configmap(&api, "probe", "cm", &[]);
        let (allowed, err) = guard_run_in(&api, "probe".into(), &rows[probe]);
        (!allowed && err.contains("handoff-sync-finalizer")).then_some(())
    });
    let guard: Vec<(bool, String)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| guard_run(&api, i, r))
        .collect();
    // What a denial says, as kubectl shows it: forbidden, not invalid, and why.
    let held = &guard[probe].1;
    assert!(
        held.contains("is forbidden: ValidatingAdmissionPolicy 'handoff-sync-finalizer'")
            && held.contains(&format!(
                "finalizers.workload.kcp.io/{SYNC_TARGET_KEY}=\"glbc-migration\""
            ))
            && held.contains("sync target \"us-west1\" (cluster root:org:ws)")
            && held.contains("kubectl annotate namespace g0"),
        "{held}"
    );
    let unknown = &guard[rows
        .iter()
        .position(|r| r.name == "unknown-syncer-held")
        .unwrap()]
    .1;
    assert!(
        unknown.contains("looks like a kcp syncer but the admission policy cannot tell"),
        "{unknown}"
    );

    // With -o json: every event one JSON object a line on standard output, the binding and
    // the proof of the pin as details (text shows them only with -v).
    let out = handoff_cmd(
        &api,
        &["window", "open", "eq", "--wait-timeout", "0s", "-o", "json"],
    );
    assert!(out.status.success(), "window open: {}", text(&out.stderr));
    let events: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let said = |level: &str, what: &str| {
        events.iter().any(|e| {
            e["event"] == "say"
                && e["level"] == level
                && e["text"].as_str().is_some_and(|t| t.contains(what))
        })
    };
    assert!(
        said(
            "detail",
            "bound the pin's MutatingAdmissionPolicies to MoveWindow eq"
        ) && said(
            "detail",
            "pinned in the API server: a dry run asking pin-capi/pre"
        ) && said("info", "MoveWindow eq is open"),
        "{events:#?}"
    );
    // The driver's steps, as `window_next::next_open` orders them for one cluster.
    let steps: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "step" && e["of"] == "window open")
        .filter_map(|e| e["step"].as_str())
        .collect();
    assert_eq!(steps, ["Check", "Record", "Stop", "Prove", "Done"]);
    assert_eq!(
        text(&out.stderr),
        "",
        "nothing but JSON, on standard output"
    );
    wait_pinning(&api);
    let pins = pin_run(&api);
    let late_scale = late_scale(&api);
    assert_eq!(
        late_scale.0, 8,
        "see docs/src/tasks/admission-policies.md: {late_scale:?}"
    );
    // Running open again records it, and from then on its scale is pinned too.
    let out = handoff_cmd(&api, &["window", "open", "eq", "--wait-timeout", "0s"]);
    assert!(
        out.status.success(),
        "window open again: {}",
        text(&out.stderr)
    );
    wait_pinning_of(&api, "a");
    kubectl_ok(
        &api,
        &["-n", "pin-capi", "scale", "deployment", "a", "--replicas=9"],
        None,
    );
    assert_eq!(deployment(&api, "pin-capi", "a").0, 0);

    let out = handoff_cmd(&api, &["window", "close", "eq", "-v"]);
    assert!(out.status.success(), "window close: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("removed the pin's MutatingAdmissionPolicyBindings"),
        "{}",
        text(&out.stderr)
    );
    // -v names each step, as `window_next::next_close` orders them.
    let stderr = text(&out.stderr);
    let steps: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("window close step: "))
        .collect();
    assert_eq!(
        steps,
        [
            "MarkClosed",
            "RestoreScaled",
            "ReleaseLeases",
            "RecordClosed",
            "Done"
        ]
    );
    assert_eq!(deployment(&api, "pin-capi", "pre"), (2, None));
    assert_eq!(deployment(&api, "pin-capi", "no-count"), (1, None));

    let out = handoff_cmd(&api, &["policy", "uninstall"]);
    assert!(
        out.status.success(),
        "policy uninstall: {}",
        text(&out.stderr)
    );
    let left = api.ok(
        ADMIN,
        &[
            "get",
            "validatingadmissionpolicies,validatingadmissionpolicybindings,mutatingadmissionpolicies,mutatingadmissionpolicybindings",
            "-o",
            "name",
        ],
    );
    assert_eq!(left.trim(), "", "uninstall left {left}");
    assert!(
        !api.kubectl(
            ADMIN,
            &[
                "-n",
                "handoff-system",
                "get",
                "configmap",
                "handoff-sync-targets"
            ]
        )
        .status
        .success()
    );
    Outcome {
        guard,
        pins,
        late_scale,
    }
}

/// `handoff serve` keeps the parameter current: a sync target that appears after `policy
/// install` is published, and stays held by the policy once no replica runs.
#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn serve_publishes_new_sync_targets_and_the_policy_holds_them_without_it() {
    if skip() {
        return;
    }
    use handoff::rules::identity::{KeyScheme, sync_target_key, syncer_id};
    let api = ApiServer::start();
    rbac_for_handoff(&api);
    let out = handoff_cmd(&api, &["policy", "install"]);
    assert!(
        out.status.success(),
        "policy install: {}",
        text(&out.stderr)
    );

    let id = syncer_id("apUID");
    let sa = format!("kcp-syncer-ap-south1-{id}");
    let user = format!("system:serviceaccount:{sa}:{sa}");
    let key = sync_target_key("root:org:ws", "ap-south1", KeyScheme::Current).0;
    api.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: test-ap\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\nsubjects:\n- kind: User\n  name: {user}\n"
    ));

    let mut handoff = Handoff::start(
        &api,
        HANDOFF_USER,
        &[
            "--webhooks",
            "sync-finalizer",
            "--policy-publish-interval",
            "500ms",
        ],
    );
    handoff.wait_ready();
    let locator = r#"{"syncTarget":{"cluster":"root:org:ws","name":"ap-south1","uid":"apUID"},"cluster":"root:org:ws","namespace":"shop"}"#;
    let hold = format!("finalizers.workload.kcp.io/{key}");
    namespace(
        &api,
        "kcp-ap",
        &[("kcp.io/namespace-locator", locator), (&hold, "migration")],
    );
    configmap(&api, "kcp-ap", "db", &[]);
    eventually("serve publishes the new sync target", WAIT, || {
        let cm = api.ok(
            ADMIN,
            &[
                "-n",
                "handoff-system",
                "get",
                "configmap",
                "handoff-sync-targets",
                "-o",
                "json",
            ],
        );
        let v: Value = serde_json::from_str(&cm).ok()?;
        v["data"][format!("s.{sa}")]
            .as_str()
            .filter(|e| e.starts_with("apUID ap-south1 root:org:ws ") && e.contains(&key))
            .map(|_| ())
    });
    assert!(
        handoff.log().contains("published sync-target identities"),
        "{}",
        handoff.log()
    );
    handoff.stop();

    // No replica runs: the policy holds the new sync target by its published key.
    // (Probed with dry runs: the API server loads a new policy's parameter asynchronously.)
    eventually("the policy reads the new identity", WAIT, || {
        let out = api.kubectl(
            ADMIN,
            &[
                "-n",
                "kcp-ap",
                "delete",
                "configmap",
                "db",
                "--dry-run=server",
                "--as",
                &user,
            ],
        );
        text(&out.stderr)
            .contains("sync target \"ap-south1\" (cluster root:org:ws)")
            .then_some(())
    });
    let out = api.kubectl(
        ADMIN,
        &["-n", "kcp-ap", "delete", "configmap", "db", "--as", &user],
    );
    let held = text(&out.stderr);
    assert!(
        !out.status.success() && held.contains("is forbidden"),
        "{held}"
    );
    // Lifting the hold lets it through.
    api.ok(
        ADMIN,
        &["annotate", "namespace", "kcp-ap", &format!("{hold}-")],
    );
    eventually("the lifted hold lets the delete through", WAIT, || {
        api.kubectl(
            ADMIN,
            &["-n", "kcp-ap", "delete", "configmap", "db", "--as", &user],
        )
        .status
        .success()
        .then_some(())
    });
}
