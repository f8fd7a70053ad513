//! The `handoff` binary as an operator runs it: `review`, `certs`, and start-up errors.

mod support;

use std::process::{Command, Stdio};

use support::https::fixtures_dir;

fn handoff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_handoff"))
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.stdin(Stdio::null()).output().expect("run handoff");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn review_decides_a_file_against_state() {
    let state = fixtures_dir().join("state");
    let (ok, out, err) = run(handoff()
        .arg("review")
        .arg(fixtures_dir().join("delete-configmap-by-syncer.json"))
        .arg("--state")
        .arg(&state));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["response"]["uid"], "6e85bb16-2464-4ebb-a694-e67c44bacb81");
    assert_eq!(v["response"]["allowed"], false);

    let (ok, out, err) = run(handoff()
        .arg("review")
        .arg(fixtures_dir().join("delete-secret-by-admin.json"))
        .arg("--state")
        .arg(&state));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["response"]["allowed"], true);
}

#[test]
fn own_deployment_is_honoured_with_state_files() {
    // The embedded default state holds an open window selecting capi-controller-manager.
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let review = examples.join("reviews/scale-capi-controller.json");
    let (ok, out, err) = run(handoff()
        .arg("review")
        .arg(&review)
        .arg("--state")
        .arg(examples.join("state")));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    let (ok, out, err) = run(handoff()
        .arg("review")
        .arg(&review)
        .arg("--state")
        .arg(examples.join("state"))
        .args(["--own-deployment", "capi-system/capi-controller-manager"]));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    assert!(
        v["response"].get("patch").is_none(),
        "own Deployment pinned: {v}"
    );
}

#[test]
fn review_picks_the_held_lease_guard_for_a_held_lease() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let text = std::fs::read_to_string(examples.join("reviews/update-held-lease.json")).unwrap();
    let review = |body: &str| {
        use std::io::Write as _;
        let mut child = handoff()
            .args(["review", "--state"])
            .arg(examples.join("state"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let decided = |body: &str| {
        let out = review(body);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // The provider's own replica trying to take its Lease back: refused, told who may.
    let v = decided(&text);
    assert_eq!(v["response"]["allowed"], false, "{v}");
    let msg = v["response"]["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("held by MoveWindow \"capi-move\"")
            && msg.contains("only its operator \"alice\"")
            && msg.contains("handoff window close capi-move"),
        "{msg}"
    );
    assert_eq!(v["response"]["auditAnnotations"]["reason"], "lease-held");
    // The operator releasing it: allowed.
    let by_alice = text.replace(
        "\"username\":\"system:serviceaccount:capi-system:capi-manager\"",
        "\"username\":\"alice\"",
    );
    assert_ne!(by_alice, text);
    assert_eq!(decided(&by_alice)["response"]["allowed"], true);
    // A Lease nobody holds is never sent to handoff (the registration's objectSelector).
    let free = text.replace(
        "\"handoff.dev/held-by-window\":\"capi-move\"",
        "\"app\":\"x\"",
    );
    assert_ne!(free, text);
    let out = review(&free);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no handoff webhook is registered for UPDATE of leases.coordination.k8s.io"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn review_reads_stdin() {
    let body = std::fs::read(fixtures_dir().join("delete-namespace-by-syncer-1.json")).unwrap();
    let mut child = handoff()
        .args(["review", "--state"])
        .arg(fixtures_dir().join("state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(&body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(
        v["response"]["auditAnnotations"]["reason"],
        "namespace-itself"
    );
}

#[test]
fn review_rejects_garbage_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.json");
    std::fs::write(&f, "{\"kind\":\"AdmissionReview\"}").unwrap();
    let (ok, _, err) = run(handoff()
        .arg("review")
        .arg(&f)
        .arg("--state")
        .arg(fixtures_dir().join("state")));
    assert!(!ok);
    assert!(err.contains("apiVersion"), "{err}");
}

#[test]
fn certs_writes_a_usable_pair_and_prints_the_ca_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("certs");
    let (ok, out, err) = run(handoff()
        .args([
            "certs",
            "--dns",
            "handoff.example.svc",
            "--ip",
            "10.0.0.1",
            "--out",
        ])
        .arg(&out_dir));
    assert!(ok, "{err}");
    use base64::Engine as _;
    let bundle = base64::engine::general_purpose::STANDARD
        .decode(out.trim())
        .expect("caBundle is base64");
    let ca = std::fs::read(out_dir.join("ca.crt")).unwrap();
    assert_eq!(bundle, ca, "caBundle is the CA's PEM");
    use std::os::unix::fs::PermissionsExt as _;
    for key in ["tls.key", "ca.key"] {
        let mode = std::fs::metadata(out_dir.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{key} must not be readable by others");
    }
    let cert = std::fs::read(out_dir.join("tls.crt")).unwrap();
    let key = std::fs::read(out_dir.join("tls.key")).unwrap();
    handoff::server::tls::certified_key(&cert, &key, "tls.crt", "tls.key").expect("pair loads");
}

/// The whole error line: each cause said once (the library's errors name their cause and keep
/// it as `source()` too), and a bad certificate named before anything about the state.
#[test]
fn a_start_up_error_is_one_line_that_says_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = fixtures_dir().join("state");
    let missing = dir.path().join("missing.yaml");
    let empty_exemption = dir.path().join("config.yaml");
    std::fs::write(&empty_exemption, "exemptions:\n- username: ''\n").unwrap();
    let no_such_file = std::io::Error::from_raw_os_error(2).to_string();
    let cases: Vec<(Vec<std::ffi::OsString>, String)> = vec![
        (
            vec![
                "serve".into(),
                "--state".into(),
                state.clone().into(),
                "--config".into(),
                missing.clone().into(),
            ],
            format!("error: config file {}: {no_such_file}", missing.display()),
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                state.clone().into(),
                "--config".into(),
                empty_exemption.clone().into(),
            ],
            format!(
                "error: config file {}: exemptions[0].username: must not be empty",
                empty_exemption.display()
            ),
        ),
        (
            // No --state and no cluster either: the certificate is checked first.
            vec![
                "serve".into(),
                "--tls-cert".into(),
                missing.clone().into(),
                "--tls-key".into(),
                missing.clone().into(),
            ],
            format!("error: cannot read {}: {no_such_file}", missing.display()),
        ),
    ];
    for (args, want) in cases {
        let (ok, _, err) = run(handoff()
            .args(&args)
            .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
            .env("HOME", dir.path()));
        assert!(!ok, "{args:?} should fail");
        let line = err.lines().find(|l| l.starts_with("error:"));
        assert_eq!(line, Some(want.as_str()), "{args:?}: {err}");
    }
}

#[test]
fn bad_flags_and_files_stop_start_up_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let bad_cfg = dir.path().join("config.yaml");
    std::fs::write(&bad_cfg, "syncTargets:\n- username: a\n  kye: x\n").unwrap();
    let bad_state = dir.path().join("state");
    std::fs::create_dir(&bad_state).unwrap();
    std::fs::write(
        bad_state.join("x.yaml"),
        "apiVersion: v1\nkind: Namepsace\nmetadata: {name: a}\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.pem");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let good_state = fixtures_dir().join("state");
    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (
            vec!["serve".into(), "--listen".into(), "nope".into()],
            "--listen",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--config".into(),
                bad_cfg.clone().into(),
            ],
            "unknown field \"kye\"",
        ),
        (
            vec!["serve".into(), "--state".into(), bad_state.clone().into()],
            "kind \"Namepsace\"",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--tls-cert".into(),
                missing.clone().into(),
                "--tls-key".into(),
                missing.clone().into(),
            ],
            "missing.pem",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--tls-cert".into(),
                empty.clone().into(),
                "--tls-key".into(),
                empty.clone().into(),
            ],
            "holds no PEM certificate",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--tls-cert".into(),
                empty.clone().into(),
            ],
            "--tls-key",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--queue-timeout".into(),
                "soon".into(),
            ],
            "--queue-timeout",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--client-ca".into(),
                empty.clone().into(),
            ],
            "client CA",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--kubeconfig".into(),
                missing.clone().into(),
            ],
            "cannot be used with",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--kcp-kubeconfig".into(),
                missing.clone().into(),
            ],
            "--kcp-kubeconfig",
        ),
        (
            vec![
                "serve".into(),
                "--state".into(),
                good_state.clone().into(),
                "--kcp-kubeconfig".into(),
                bad_cfg.clone().into(),
            ],
            "--kcp-kubeconfig",
        ),
        // A backup or a restore names a folder that exists, and is one cluster's.
        (
            vec![
                "move".into(),
                "--to-directory".into(),
                missing.clone().into(),
            ],
            "--to-directory",
        ),
        (
            vec![
                "move".into(),
                "--to-kubeconfig".into(),
                bad_cfg.clone().into(),
                "--from-directory".into(),
                missing.clone().into(),
            ],
            "no such folder",
        ),
        (
            vec![
                "move".into(),
                "--to-directory".into(),
                dir.path().into(),
                "--to-kubeconfig".into(),
                bad_cfg.clone().into(),
            ],
            "cannot be used with",
        ),
        (
            vec!["move".into(), "--from-directory".into(), dir.path().into()],
            "--to-kubeconfig",
        ),
        (vec!["move".into()], "--to-kubeconfig"),
    ];
    for (args, want) in cases {
        let (ok, _, err) = run(handoff().args(&args));
        assert!(!ok, "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {want:?} not in {err}");
    }
}

#[test]
fn a_configured_username_the_match_condition_never_sends_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        "syncTargets:\n- username: legacy-syncer\n  cluster: root:org:ws\n  name: us-west1\n- username: system:serviceaccount:edge:kcp-syncer-edge-1\n  key: 6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g\n",
    )
    .unwrap();
    let (ok, _, err) = run(handoff()
        .arg("review")
        .arg(fixtures_dir().join("delete-secret-by-admin.json"))
        .arg("--state")
        .arg(fixtures_dir().join("state"))
        .arg("--config")
        .arg(&cfg));
    assert!(ok, "{err}");
    assert!(
        err.contains("matchCondition") && err.contains("legacy-syncer"),
        "{err}"
    );
    assert!(
        err.contains("|| request.userInfo.username in ['legacy-syncer']"),
        "{err}"
    );
    assert!(!err.contains("kcp-syncer-edge-1"), "{err}");
}

/// `handoff review --config F` shows what each enforcement mode, and an exemption, sends back.
#[test]
fn review_shows_each_enforcement_mode_and_an_exemption() {
    let dir = tempfile::tempdir().unwrap();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let review = |cfg: &str, file: &std::path::Path, state: &std::path::Path| {
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, cfg).unwrap();
        let (ok, out, err) = run(handoff()
            .arg("review")
            .arg(file)
            .arg("--state")
            .arg(state)
            .arg("--config")
            .arg(&path));
        assert!(ok, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["response"].clone()
    };
    let delete = fixtures_dir().join("delete-configmap-by-syncer.json");
    let scale = examples.join("reviews/scale-capi-controller.json");
    let (guard_state, pin_state) = (fixtures_dir().join("state"), examples.join("state"));
    // (case, config, review, state, allowed, patched, warning starts with, decision)
    type Row<'a> = (
        &'a str,
        &'a str,
        &'a std::path::Path,
        &'a std::path::Path,
        bool,
        bool,
        Option<&'a str>,
        &'a str,
    );
    let rows: &[Row] = &[
        (
            "guard enforce",
            "",
            &delete,
            &guard_state,
            false,
            false,
            None,
            "deny",
        ),
        (
            "guard warn",
            "enforcement:\n  syncFinalizer: warn\n",
            &delete,
            &guard_state,
            true,
            false,
            Some(
                "handoff would deny this request (sync-finalizer is in warn mode): namespace \"kcp-33jbiactwhg0\" carries the sync finalizer",
            ),
            "would-deny",
        ),
        (
            "guard audit",
            "enforcement:\n  syncFinalizer: audit\n",
            &delete,
            &guard_state,
            true,
            false,
            None,
            "would-deny",
        ),
        (
            "guard exempt group",
            "exemptions:\n- group: system:serviceaccounts\n",
            &delete,
            &guard_state,
            true,
            false,
            Some(
                "exempt from the sync-finalizer rule as a member of group \"system:serviceaccounts\"; handoff would otherwise deny this request",
            ),
            "exempt",
        ),
        (
            "pin enforce",
            "",
            &scale,
            &pin_state,
            true,
            true,
            Some("MoveWindow \"capi-move\" pins"),
            "pin",
        ),
        (
            "pin warn",
            "enforcement:\n  moveWindow: warn\n",
            &scale,
            &pin_state,
            true,
            false,
            Some(
                "handoff would pin this (move-window is in warn mode): MoveWindow \"capi-move\" pins",
            ),
            "would-pin",
        ),
        (
            "pin audit",
            "enforcement:\n  moveWindow: audit\n",
            &scale,
            &pin_state,
            true,
            false,
            None,
            "would-pin",
        ),
        (
            "pin exempt user",
            "exemptions:\n- username: admin\n",
            &scale,
            &pin_state,
            true,
            false,
            Some("exempt from the move-window rule as user \"admin\""),
            "exempt",
        ),
        (
            "the other rule's mode changes nothing",
            "enforcement:\n  moveWindow: audit\n",
            &delete,
            &guard_state,
            false,
            false,
            None,
            "deny",
        ),
    ];
    for (case, cfg, file, state, allowed, patched, warning, decision) in rows {
        let r = review(cfg, file, state);
        assert_eq!(r["allowed"], *allowed, "{case}: {r}");
        assert_eq!(r.get("patch").is_some(), *patched, "{case}: {r}");
        let warnings = r["warnings"].as_array().cloned().unwrap_or_default();
        match warning {
            None => assert!(warnings.is_empty(), "{case}: {r}"),
            Some(w) => assert!(
                warnings.len() == 1 && warnings[0].as_str().unwrap().starts_with(w),
                "{case}: {r}"
            ),
        }
        assert_eq!(r["auditAnnotations"]["decision"], *decision, "{case}: {r}");
    }
    // A bad mode or an empty exemption stops with a message naming the field.
    for (cfg, field) in [
        ("enforcement:\n  syncFinalizer: block\n", "block"),
        ("exemptions:\n- group: \"\"\n", "exemptions[0].group"),
        ("exemptions:\n- team: x\n", "team"),
    ] {
        std::fs::write(dir.path().join("config.yaml"), cfg).unwrap();
        let (ok, _, err) = run(handoff()
            .arg("review")
            .arg(&delete)
            .arg("--state")
            .arg(&guard_state)
            .arg("--config")
            .arg(dir.path().join("config.yaml")));
        assert!(!ok && err.contains(field), "{cfg}: {err}");
    }
}

#[test]
fn version_names_the_crate_version_and_the_commit() {
    let (ok, out, err) = run(handoff().arg("--version"));
    assert!(ok, "{err}");
    let want = format!("handoff {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(
        out.starts_with(&want) && out.trim_end().ends_with(')'),
        "{out}"
    );
}

/// kubectl runs `kubectl handoff ...` as `kubectl-handoff ...` found on PATH.
fn kubectl_plugin(dir: &std::path::Path) -> Command {
    let link = dir.join("kubectl-handoff");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_handoff"), &link).unwrap();
    }
    let mut cmd = Command::new(link);
    cmd.env_remove("KUBECONFIG").env("HOME", dir);
    cmd
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn kubeconfig(current: Option<&str>, context: &str, port: u16) -> String {
    let current = current
        .map(|c| format!("current-context: {c}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\n{current}contexts:\n- name: {context}\n  context: {{cluster: {context}, user: {context}}}\nclusters:\n- name: {context}\n  cluster: {{server: \"https://127.0.0.1:{port}\"}}\nusers:\n- name: {context}\n  user: {{token: t-{context}}}\n"
    )
}

#[test]
fn as_a_kubectl_plugin_it_is_named_kubectl_handoff() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = run(kubectl_plugin(dir.path()).arg("--help"));
    assert!(ok, "{err}");
    assert!(out.contains("Usage: kubectl handoff "), "{out}");
    let (ok, out, err) = run(kubectl_plugin(dir.path()).args(["window", "status", "--help"]));
    assert!(ok, "{err}");
    assert!(
        out.contains("Usage: kubectl handoff window status "),
        "{out}"
    );
    // Run as itself, it is still `handoff`.
    let (_, out, _) = run(handoff().arg("--help"));
    assert!(out.contains("Usage: handoff "), "{out}");
}

#[test]
fn kubeconfig_lists_several_files_and_the_first_to_set_an_entry_wins() {
    let dir = tempfile::tempdir().unwrap();
    let (near, far) = (closed_port(), closed_port());
    // a sets current-context to a context that only b defines; b's own current-context
    // loses, as in kubectl.
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    std::fs::write(&a, kubeconfig(Some("far"), "near", near)).unwrap();
    std::fs::write(&b, kubeconfig(Some("near"), "far", far)).unwrap();
    let list = std::env::join_paths([&a, &b]).unwrap();

    let (ok, _, err) = run(kubectl_plugin(dir.path())
        .env("KUBECONFIG", &list)
        .args(["window", "status"]));
    assert!(!ok);
    assert!(
        err.contains(&format!("API server https://127.0.0.1:{far}/")),
        "{err}"
    );
    let (ok, _, err) = run(kubectl_plugin(dir.path()).env("KUBECONFIG", &list).args([
        "window",
        "status",
        "--context",
        "near",
    ]));
    assert!(!ok);
    assert!(
        err.contains(&format!("API server https://127.0.0.1:{near}/")),
        "{err}"
    );
    // --kubeconfig reads that file alone, as kubectl does.
    let (ok, _, err) = run(kubectl_plugin(dir.path())
        .env("KUBECONFIG", &list)
        .args(["window", "status", "--context", "far", "--kubeconfig"])
        .arg(&b));
    assert!(!ok);
    assert!(
        err.contains(&format!("API server https://127.0.0.1:{far}/")),
        "{err}"
    );
}

/// With `--kcp-kubeconfig` and kcp unreachable, `review` decides as the server would: a sync
/// target's delete in a located namespace is denied with the reason, a delete by anyone else or
/// in a namespace no locator names is decided without asking kcp.
#[test]
fn review_with_kcp_unreachable_denies_only_a_sync_targets_delete_in_a_located_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(
        state.join("namespaces.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kcp-33jbiactwhg0\n  annotations:\n    kcp.io/namespace-locator: '{\"syncTarget\":{\"cluster\":\"root:org:ws\",\"name\":\"us-west1\",\"uid\":\"syncTargetUID\"},\"cluster\":\"root:org:ws\",\"namespace\":\"test\"}'\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: unlocated\n",
    )
    .unwrap();
    let kcp = dir.path().join("kcp.kubeconfig");
    std::fs::write(
        &kcp,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: kcp\ncontexts:\n- name: kcp\n  context: {{cluster: kcp, user: kcp}}\nclusters:\n- name: kcp\n  cluster: {{server: \"http://127.0.0.1:{}/clusters/root:org:ws\"}}\nusers:\n- name: kcp\n  user: {{token: t}}\n",
            closed_port()
        ),
    )
    .unwrap();
    let review = |fixture: &str, namespace: Option<&str>| {
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixtures_dir().join(fixture)).unwrap()).unwrap();
        if let Some(ns) = namespace {
            v["request"]["namespace"] = ns.into();
            v["request"]["oldObject"]["metadata"]["namespace"] = ns.into();
        }
        let file = dir.path().join(format!("{fixture}-{namespace:?}.json"));
        std::fs::write(&file, v.to_string()).unwrap();
        let (ok, out, err) = run(handoff()
            .arg("review")
            .arg(&file)
            .arg("--state")
            .arg(&state)
            .arg("--kcp-kubeconfig")
            .arg(&kcp));
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["response"].clone()
    };
    let r = review("delete-configmap-by-syncer.json", None);
    assert_eq!(r["allowed"], false, "{r}");
    let message = r["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("cannot read kcp namespace \"test\" (workspace root:org:ws)"),
        "{message}"
    );
    assert_eq!(r["auditAnnotations"]["reason"], "kcp-unavailable");
    let r = review("delete-secret-by-admin.json", None);
    assert_eq!(r["allowed"], true, "{r}");
    let r = review("delete-configmap-by-syncer.json", Some("unlocated"));
    assert_eq!(r["allowed"], true, "{r}");
}

/// `handoff certs` with no `--dns` makes a certificate for the Services the manifests create
/// (the API server verifies `<service>.handoff-system.svc`): a certificate for any other name
/// fails every call, closed.
#[test]
fn certs_default_names_are_the_manifests_services() {
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/base");
    let services = std::fs::read_to_string(base.join("service.yaml")).unwrap();
    let names: Vec<String> = services
        .split("\n---")
        .filter(|d| d.contains("kind: Service"))
        .filter_map(|d| {
            d.lines()
                .skip_while(|l| !l.starts_with("metadata:"))
                .find_map(|l| l.trim().strip_prefix("name: ").map(str::to_string))
        })
        .collect();
    assert_eq!(names, ["handoff-guard", "handoff-pin"]);
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = run(handoff().arg("certs").arg("--out").arg(dir.path()));
    assert!(ok, "{err}");
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(dir.path().join("tls.crt"))
        .output();
    let Ok(out) = out else {
        eprintln!("skipped the SAN check: no openssl");
        return;
    };
    let sans = String::from_utf8_lossy(&out.stdout);
    for n in names {
        assert!(
            sans.contains(&format!("DNS:{n}.handoff-system.svc")),
            "{n}: {sans}"
        );
    }
}

/// `-A --from-directory` restores the folders of a whole backup: a folder holding none is
/// refused before any cluster is reached, and nothing is written to it; `-A` names no namespace.
#[test]
fn a_whole_restore_needs_the_folders_of_a_whole_backup() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    // A cluster nobody serves: the refusal must come before any request.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    let backup = dir.path().join("backup");
    std::fs::create_dir(&backup).unwrap();
    std::fs::write(backup.join("Cluster_team-a_a1.yaml"), "kind: Cluster\n").unwrap();
    let (ok, _, err) = run(handoff()
        .args(["move", "-A", "--to-kubeconfig"])
        .arg(&kubeconfig)
        .arg("--from-directory")
        .arg(&backup));
    assert!(!ok);
    assert!(
        err.contains("holds no folder of a namespace")
            && err.contains("without -A it restores the folder itself"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&backup).unwrap().count(), 1);
    let (ok, _, err) = run(handoff()
        .args(["move", "-A", "-n", "team-a", "--to-kubeconfig"])
        .arg(&kubeconfig));
    assert!(!ok && err.contains("cannot be used with"), "{err}");
}
