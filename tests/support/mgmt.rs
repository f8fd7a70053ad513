//! A Cluster API management cluster for the move tests: a real kube-apiserver, `handoff serve`
//! registered with the project's local overlay and the manifests' RBAC, the Cluster API CRDs,
//! and providers from `../shared/provider-standin` (see `providers.rs`). Needs the test's own
//! network namespace (`netns.rs`) for the providers' Service ClusterIPs.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use super::apiserver::{ADMIN, ApiServer, HANDOFF_USER, Handoff, NOBODY, eventually, text};
use super::providers::{Provider, ProviderSpec, cluster, install_capi_crds, webhook_rule};

pub const WAIT: Duration = Duration::from_secs(90);
/// The window's operator: bound to exactly the roles docs/src/tasks/move-by-hand.md tells an admin to bind.
pub const OPERATOR: &str = NOBODY;
/// A cluster admin who is not the window's operator.
pub const BOB: &str = "bob";
/// What Cluster API core's replicas authenticate as.
pub const PROVIDER_SA: &str = "system:serviceaccount:capi-system:capi-manager";
/// Cluster API core's webhook for Clusters, served through its Service.
pub const CLUSTER_WEBHOOK: &str = "validation.cluster.cluster.x-k8s.io";

pub struct Mgmt {
    pub label: &'static str,
    pub api: ApiServer,
    pub handoff: Handoff,
    pub providers: Vec<Provider>,
}

impl Mgmt {
    /// Start the cluster and its providers (each spec's namespace gets the operator's Lease
    /// RoleBinding); the first provider serves a fail-closed webhook for Clusters through its
    /// Service, proven called before this returns.
    pub fn start(label: &'static str, specs: Vec<ProviderSpec>) -> Mgmt {
        let api = ApiServer::start();
        let namespaces: Vec<String> = specs.iter().map(|s| s.namespace.clone()).collect();
        grant(&api, &namespaces);
        let mut handoff = Handoff::start(&api, HANDOFF_USER, &[]);
        handoff.register(&api);
        handoff.wait_ready();
        install_capi_crds(&api);
        let providers: Vec<Provider> = specs
            .into_iter()
            .map(|s| Provider::start(&api, s))
            .collect();
        let core = &providers[0];
        core.register_webhook(
            &api,
            CLUSTER_WEBHOOK,
            &[webhook_rule(
                "cluster.x-k8s.io",
                "v1beta2",
                "clusters",
                &["CREATE", "UPDATE", "DELETE"],
            )],
        );
        api.ok(ADMIN, &["create", "namespace", "webhook-probes"]);
        core.until_webhook_called(&api, WAIT, |i| {
            let out = api.kubectl_stdin(
                ADMIN,
                &["create", "-f", "-"],
                Some(&cluster("webhook-probes", &format!("probe-{i}"), false)),
            );
            assert!(out.status.success(), "{label}: {}", text(&out.stderr));
        });
        for p in &providers {
            if p.spec.leader_election_id.is_some() {
                p.wait_leader(&api, WAIT);
            }
        }
        Mgmt {
            label,
            api,
            handoff,
            providers,
        }
    }

    /// The first provider: Cluster API core, serving the Clusters webhook.
    pub fn capi(&self) -> &Provider {
        &self.providers[0]
    }

    pub fn provider(&self, name: &str) -> &Provider {
        self.providers
            .iter()
            .find(|p| p.name() == name)
            .unwrap_or_else(|| panic!("{}: no provider {name}", self.label))
    }

    pub fn get(&self, args: &[&str]) -> Value {
        get(&self.api, args)
    }

    pub fn exists(&self, args: &[&str]) -> bool {
        self.api
            .kubectl(ADMIN, &[&["get"], args].concat())
            .status
            .success()
    }

    pub fn replicas(&self, ns: &str, name: &str) -> i64 {
        self.get(&["-n", ns, "deployment", name])["spec"]["replicas"]
            .as_i64()
            .unwrap_or(1)
    }

    /// The provider's reconcilers run: its counter rises.
    pub fn rising(&self, p: &Provider) {
        let first = p.reconciles(&self.api);
        eventually(
            &format!("{}: {} reconciling", self.label, p.name()),
            WAIT,
            || (p.reconciles(&self.api) > first).then_some(()),
        );
    }

    /// The operator's kubeconfig.
    pub fn operator_kubeconfig(&self) -> std::path::PathBuf {
        self.api.kubeconfig(OPERATOR)
    }
}

/// handoff's own RBAC from the base manifests; the operator gets `handoff-window-operator`
/// cluster-wide and `handoff-window-operator-leases` in each provider namespace (and cluster
/// admin rights over Cluster API objects, which `clusterctl move` needs); bob and the
/// provider's ServiceAccount are cluster admins, so that only admission can refuse them.
pub fn grant(api: &ApiServer, provider_namespaces: &[String]) {
    let rbac = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/base/rbac.yaml"),
    )
    .expect("rbac.yaml");
    api.ok(ADMIN, &["create", "namespace", "handoff-system"]);
    let out = api.kubectl_stdin(
        ADMIN,
        &["apply", "-n", "handoff-system", "-f", "-"],
        Some(&rbac),
    );
    assert!(out.status.success(), "rbac: {}", text(&out.stderr));
    let bind = |name: &str, role: &str, user: &str| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {name}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {role}\nsubjects:\n- kind: User\n  name: {user}\n"
        )
    };
    for role in ["handoff-guard", "handoff-pin"] {
        api.apply(&bind(&format!("test-{role}"), role, HANDOFF_USER));
    }
    api.apply(&bind("move-operator", "handoff-window-operator", OPERATOR));
    api.apply(&bind("bob", "cluster-admin", BOB));
    api.apply(&bind("capi-manager", "cluster-admin", PROVIDER_SA));
    // What clusterctl needs of the operator: every Cluster API object, namespaces, CRDs.
    api.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: clusterctl-mover\nrules:\n- apiGroups: [cluster.x-k8s.io, infrastructure.cluster.x-k8s.io]\n  resources: ['*']\n  verbs: ['*']\n- apiGroups: ['']\n  resources: [namespaces, configmaps]\n  verbs: [get, list, create]\n- apiGroups: [apiextensions.k8s.io]\n  resources: [customresourcedefinitions]\n  verbs: [get, list]\n",
    );
    api.apply(&bind(
        "move-operator-clusterctl",
        "clusterctl-mover",
        OPERATOR,
    ));
    for ns in provider_namespaces {
        api.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: move-operator-leases\n  namespace: {ns}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: handoff-window-operator-leases\nsubjects:\n- kind: User\n  name: {OPERATOR}\n"
        ));
    }
}

pub fn get(api: &ApiServer, args: &[&str]) -> Value {
    let out = api.ok(ADMIN, &[&["get"], args, &["-o", "json"]].concat());
    serde_json::from_str(&out).expect("json")
}

/// `handoff ARGS --kubeconfig K` (the real binary).
pub fn handoff(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .output()
        .expect("handoff")
}
