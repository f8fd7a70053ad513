use super::directory::{ESCAPES, cel_username_key};
use super::*;
use crate::rules::identity::{Identities, NamespaceLocator};
use crate::rules::move_window::OwnDeployment;
use crate::rules::rollout::{Exemption, Mode, Rollout};

const LOCATOR: &str = r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}"#;

#[test]
fn username_keys_are_valid_configmap_keys_and_distinct() {
    let users = [
        "system:serviceaccount:edge:syncer",
        "system_serviceaccount_3aedge:syncer",
        "alice@example.com",
        "https://issuer.example.com#sub",
        "a b",
        "a_b",
        "a_5fb",
    ];
    let keys: Vec<String> = users.iter().map(|u| username_key(u).unwrap()).collect();
    for k in &keys {
        assert!(
            k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)),
            "{k}"
        );
    }
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), keys.len(), "{keys:?}");
    assert_eq!(
        username_key("system:serviceaccount:edge:syncer").unwrap(),
        "u.system_3aserviceaccount_3aedge_3asyncer"
    );
    let e = username_key("o'brien").unwrap_err().to_string();
    assert!(e.contains("o'brien") && e.contains("'\\''"), "{e}");
    assert!(username_key(&"x".repeat(300)).is_err());
}

#[test]
fn the_policy_computes_the_same_username_key() {
    // Replay the CEL chain as written in the policy: each `.replace('x', 'y')` in its order.
    let cel = cel_username_key();
    let unquote = |q: &str| q.trim().trim_matches('\'').to_string();
    let steps: Vec<(String, String)> = cel
        .split(".replace(")
        .skip(1)
        .map(|call| {
            let (from, to) = call.trim_end_matches(')').split_once(", ").unwrap();
            (unquote(from), unquote(to))
        })
        .collect();
    assert_eq!(steps.len(), ESCAPES.len(), "{cel}");
    for u in [
        "a_b:c@d",
        "x_3ay",
        "plain",
        "https://issuer#sub+1=2%~!",
        "a b",
    ] {
        let mut k = format!("u.{u}");
        for (from, to) in &steps {
            k = k.replace(from.as_str(), to);
        }
        assert_eq!(k, username_key(u).unwrap(), "{u}");
    }
}

#[test]
fn directory_publishes_config_and_located_syncers() {
    let mut ids = Identities::default();
    ids.add_key("system:serviceaccount:edge:syncer", "K1");
    ids.add_cluster_name("legacy-syncer", "root:org:ws", "us-west1");
    let loc: NamespaceLocator = serde_json::from_str(LOCATOR).unwrap();
    let located = ids.locate_shared(&loc);
    let dir = directory(&ids, &[("syncTargetUID".into(), located)]);
    assert_eq!(
        dir.data["u.system_3aserviceaccount_3aedge_3asyncer"],
        "- - - K1"
    );
    assert_eq!(
        dir.data["u.legacy-syncer"],
        "- us-west1 root:org:ws 6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g,2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5"
    );
    assert_eq!(
        dir.data["s.kcp-syncer-us-west1-1nuzj7pw"],
        "syncTargetUID us-west1 root:org:ws 6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g,2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5"
    );
    assert!(dir.skipped.is_empty());

    let mut bad = Identities::default();
    bad.add_key("o'brien", "K");
    bad.add_key("ok", "a key");
    let dir = directory(&bad, &[]);
    assert!(dir.data.is_empty());
    assert_eq!(dir.unpublishable.len(), 2, "{:?}", dir.unpublishable);
}

#[test]
fn cel_strings_escape_quotes_backslashes_and_controls() {
    assert_eq!(cel_str("o'b\\r\n"), r"'o\'b\\r\u000a'");
}

#[test]
fn guard_policy_matches_only_sync_target_candidates_and_never_denies_a_missing_parameter() {
    let mut ids = Identities::default();
    ids.add_key("legacy-syncer", "K");
    ids.add_key("system:serviceaccount:edge:kcp-syncer-x-abcdefgh", "K");
    let rollout = Rollout {
        exemptions: vec![
            Exemption::Username("alice".into()),
            Exemption::Group("breakglass".into()),
        ],
        ..Rollout::default()
    };
    let p = guard_policy(&ids, &rollout);
    let conds = p["spec"]["matchConditions"].as_array().unwrap();
    let candidates = conds[0]["expression"].as_str().unwrap();
    assert!(candidates.ends_with("|| request.userInfo.username in ['legacy-syncer']"));
    assert_eq!(conds.len(), 3);
    assert_eq!(p["spec"]["failurePolicy"], "Fail");
    assert_eq!(p["spec"]["paramKind"]["kind"], "ConfigMap");
    let b = guard_binding(&ParamsRef::default(), Mode::Warn);
    assert_eq!(b["spec"]["paramRef"]["parameterNotFoundAction"], "Allow");
    assert_eq!(b["spec"]["validationActions"], serde_json::json!(["Warn"]));
}

#[test]
fn pin_policies_never_match_outside_enforce_and_skip_handoff_itself() {
    let own = OwnDeployment {
        namespace: "handoff-system".into(),
        name: "handoff-pin".into(),
    };
    let enforce = pin_policy(&own, &Rollout::default());
    let conds = enforce["spec"]["matchConditions"].as_array().unwrap();
    assert_eq!(
        conds[0]["expression"],
        "!(request.namespace == 'handoff-system' && request.name == 'handoff-pin')"
    );
    let warn = pin_scale_policy(
        &own,
        &Rollout {
            move_window: Mode::Warn,
            ..Rollout::default()
        },
    );
    assert_eq!(warn["spec"]["matchConditions"][0]["expression"], "false");
    assert_eq!(warn["spec"]["failurePolicy"], "Ignore");
    let [d, s] = window_bindings(
        "move-1",
        Some("uid-1"),
        &crate::resources::move_window::default_deployment_selector(),
    );
    assert_eq!(d["metadata"]["name"], "handoff-pin-move-1");
    assert_eq!(s["metadata"]["name"], "handoff-pin-move-1-scale");
    assert!(d["spec"]["matchResources"]["objectSelector"]["matchExpressions"].is_array());
    assert!(s["spec"]["matchResources"].get("objectSelector").is_none());
}

#[test]
fn install_writes_only_what_the_cluster_serves_and_says_what_stays_on_the_webhook() {
    use apply::{Install, Served, gaps, objects};
    let inst = Install {
        ids: Identities::default(),
        rollout: Rollout::default(),
        params: ParamsRef::default(),
        own: OwnDeployment {
            namespace: "handoff-system".into(),
            name: "handoff-pin".into(),
        },
    };
    let kinds = |served| {
        objects(
            &inst,
            &Directory::default(),
            served,
            &[(
                "w".into(),
                None,
                crate::resources::move_window::default_deployment_selector(),
            )],
        )
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect::<Vec<_>>()
    };
    let all = Served {
        validating: true,
        mutating: true,
        move_windows: true,
    };
    assert_eq!(
        kinds(all),
        [
            "ConfigMap",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicyBinding"
        ],
        "the parameter before the binding that reads it; an open window's bindings too"
    );
    assert!(gaps(all).is_empty());
    let before_136 = Served {
        mutating: false,
        ..all
    };
    assert_eq!(kinds(before_136).len(), 5);
    assert!(gaps(before_136)[0].contains("the move-window pin stays on the webhook alone"));
    let none = Served {
        validating: false,
        mutating: false,
        move_windows: true,
    };
    assert!(kinds(none).is_empty());
    assert_eq!(gaps(none).len(), 2);
    let no_crd = Served {
        move_windows: false,
        ..all
    };
    assert_eq!(kinds(no_crd).len(), 5);
    assert!(gaps(no_crd)[0].contains("MoveWindow CRD is not installed"));
}

#[test]
fn selectors_render_as_kubernetes_evaluates_them() {
    let default = cel_selector(
        &crate::resources::move_window::default_deployment_selector(),
        "l",
    );
    assert_eq!(
        default,
        "(('clusterctl.cluster.x-k8s.io' in l) && ('cluster.x-k8s.io/provider' in l) && !('clusterctl.cluster.x-k8s.io/core' in l && l['clusterctl.cluster.x-k8s.io/core'] in ['cert-manager', 'inventory']))"
    );
    let sel =
        crate::rules::selector::parse_label_selector("app=web,tier notin (db),!legacy").unwrap();
    assert_eq!(
        cel_selector(&sel, "l"),
        "(('app' in l && l['app'] == 'web') && !('tier' in l && l['tier'] in ['db']) && !('legacy' in l))"
    );
    assert_eq!(cel_selector(&Default::default(), "l"), "true");
    let [d, _] = window_bindings("w", Some("u"), &sel);
    assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "u");
    assert_eq!(d["metadata"]["ownerReferences"][0]["kind"], "MoveWindow");
}
