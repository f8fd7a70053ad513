//! The Helm chart (`charts/handoff`) through the real Helm engine, against a real API server.
//!
//! The engine is helm-sdkpy: Helm v4's Go code (the `helm` CLI's) built as a shared library and
//! driven from Python by `tests/helm/engine.py`, one action per run. Its python comes from
//! `HANDOFF_HELM_PYTHON`, else `~/.cache/handoff-helm-venv/bin/python` (`hack/helm-venv.sh`
//! makes that venv); without one these tests print a line and pass, and with
//! `HANDOFF_REQUIRE_HELM=1` (CI) that is a failure. The API server is envtest's
//! (`KUBEBUILDER_ASSETS`, as for tests/apiserver.rs).
//!
//! One source of truth: the chart with its default values renders exactly the objects of
//! `kubectl kustomize manifests/base` (but the Namespace, which `helm install
//! --create-namespace` makes, and the CRD, which the chart carries in `crds/` byte for byte),
//! with certificate.mode certManager the cert-manager overlay, with kcp.enabled the kcp
//! overlay, with the monitoring objects the base and the monitoring overlay. Helm's own labels
//! (helm.sh/chart, app.kubernetes.io/managed-by, instance, version) are the only difference
//! allowed. Helm's render is the manifest the engine installs: the binding has no `template`,
//! and an install or upgrade (never waiting: there is no kubelet) returns it.

mod support;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use handoff::rules::rollout::Mode;
use serde_json::{Value, json};
use support::apiserver::{self, ADMIN, ApiServer};

const CHART: &str = "charts/handoff";
const NAMESPACE: &str = "handoff-system";
const RELEASE: &str = "handoff";
/// What Helm's chart adds to every object's labels beside the manifests' own.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];
const CRD: &str = "movewindows.handoff.dev";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---- the engine ----

/// The python that imports helm_sdkpy, or `None` (one line on stderr) when the Helm tests are
/// skipped.
fn helm_python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let required = std::env::var("HANDOFF_REQUIRE_HELM").is_ok_and(|v| v == "1");
            let python = match std::env::var_os("HANDOFF_HELM_PYTHON") {
                Some(p) => PathBuf::from(p),
                None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                    .join(".cache/handoff-helm-venv/bin/python"),
            };
            let missing = match Command::new(&python)
                .args(["-c", "import helm_sdkpy"])
                .output()
            {
                Ok(out) if out.status.success() => return Some(python),
                Ok(out) => format!(
                    "{} cannot import helm_sdkpy: {}",
                    python.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => format!("{}: {e}", python.display()),
            };
            let how = "run `export HANDOFF_HELM_PYTHON=$(hack/helm-venv.sh)` (a venv with helm-sdkpy from PyPI)";
            if required {
                panic!("HANDOFF_REQUIRE_HELM=1 but {missing}: {how}");
            }
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the Helm chart tests need the Helm engine ({missing}); {how}"
            );
            None
        })
        .clone()
}

/// The engine, reaching `kubeconfig`'s cluster in the release namespace.
struct Helm {
    python: PathBuf,
    kubeconfig: PathBuf,
    namespace: &'static str,
}

/// A release as the engine reports it.
#[derive(Debug, Clone, serde::Deserialize)]
struct Release {
    version: u64,
    status: String,
    description: String,
    manifest: String,
}

impl Helm {
    /// One action of tests/helm/engine.py: its answer, or Helm's error message.
    fn call(&self, mut request: Value) -> Result<Value, String> {
        let fields = request.as_object_mut().expect("a request is an object");
        fields.insert("kubeconfig".into(), json!(self.kubeconfig));
        fields.insert("namespace".into(), json!(self.namespace));
        fields.insert("release".into(), json!(RELEASE));
        fields
            .entry("chart")
            .or_insert_with(|| json!(root().join(CHART)));
        let action = fields["action"].as_str().unwrap_or_default().to_owned();
        let mut child = Command::new(&self.python)
            .arg(root().join("tests/helm/engine.py"))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.python.display()));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(request.to_string().as_bytes())
            .expect("write the request");
        let out = child.wait_with_output().expect("the engine's output");
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        match out.status.code() {
            Some(0) => Ok(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!("helm {action}: the engine answered no JSON ({e}): {stderr}")
            })),
            Some(1) => Err(stderr),
            _ => panic!(
                "helm {action}: the engine failed ({}): {stderr}",
                out.status
            ),
        }
    }

    fn release(&self, action: &str, extra: Value) -> Result<Release, String> {
        let mut request = json!({ "action": action });
        request
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap_or_default());
        self.call(request).map(|answer| {
            serde_json::from_value(answer.clone())
                .unwrap_or_else(|e| panic!("helm {action}: not a release ({e}): {answer}"))
        })
    }

    fn install(&self, values: Value) -> Result<Release, String> {
        self.release("install", json!({ "values": values }))
    }

    /// `helm upgrade` with these values over the chart's defaults (`--reset-values`).
    fn upgrade(&self, values: Value) -> Release {
        let release = self
            .release("upgrade", json!({ "values": values.clone() }))
            .unwrap_or_else(|e| panic!("helm upgrade with {values} failed: {e}"));
        assert_eq!(release.status, "deployed", "upgrade with {values}");
        release
    }

    fn rollback(&self, revision: u64) -> Release {
        self.release("rollback", json!({ "revision": revision }))
            .unwrap_or_else(|e| panic!("helm rollback to {revision} failed: {e}"))
    }

    fn history(&self) -> Vec<Release> {
        let answer = self
            .call(json!({"action": "history"}))
            .expect("helm history");
        serde_json::from_value(answer).expect("history is a list of releases")
    }

    fn list(&self) -> Vec<String> {
        let answer = self.call(json!({"action": "list"})).expect("helm list");
        answer
            .as_array()
            .expect("list is a list")
            .iter()
            .map(|r| r["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

// ---- objects ----

/// Objects by `Kind namespace/name` (cluster-scoped: `Kind /name`).
type Objects = BTreeMap<String, Value>;

fn key(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or_default(),
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default()
    )
}

/// Every object of a multi-document YAML stream, Helm's labels removed.
fn parse(text: &str, what: &str) -> Objects {
    let mut objects = Objects::new();
    for (i, doc) in handoff::yaml::documents(text) {
        if handoff::yaml::is_empty(doc) {
            continue;
        }
        let mut object: Value = handoff::yaml::from_str(doc)
            .unwrap_or_else(|e| panic!("{what}: document {i}: {e}\n{doc}"));
        if let Some(labels) = object
            .pointer_mut("/metadata/labels")
            .and_then(Value::as_object_mut)
        {
            for label in HELM_LABELS {
                labels.remove(label);
            }
        }
        let k = key(&object);
        assert!(
            objects.insert(k.clone(), object).is_none(),
            "{what}: {k} twice"
        );
    }
    objects
}

/// `kubectl kustomize manifests/<dir>`, less the Namespace and the CRD (the chart's crds/).
fn kustomize(dir: &str) -> Objects {
    kustomize_in(dir, NAMESPACE)
}

/// The same with every `handoff-system` read as `namespace`.
fn kustomize_in(dir: &str, namespace: &str) -> Objects {
    let path = root().join("manifests").join(dir);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("kubectl (on PATH, v1.27 or later): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize manifests/{dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).replace(NAMESPACE, namespace);
    let mut objects = parse(&text, dir);
    objects.retain(|_, o| !matches!(o["kind"].as_str(), Some("Namespace")));
    let crd = format!("CustomResourceDefinition /{CRD}");
    objects.remove(&crd);
    objects
}

/// Every difference between two values, as `path: what`.
fn differences(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                match g.get(k) {
                    Some(o) => differences(&format!("{path}.{k}"), v, o, out),
                    None => out.push(format!("{path}.{k}: missing from the chart (want {v})")),
                }
            }
            for (k, v) in g {
                if !w.contains_key(k) {
                    out.push(format!("{path}.{k}: only the chart has it ({v})"));
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (a, b)) in w.iter().zip(g).enumerate() {
                differences(&format!("{path}[{i}]"), a, b, out);
            }
        }
        (w, g) if w == g => {}
        (w, g) => out.push(format!("{path}: want {w}, the chart has {g}")),
    }
}

/// The chart's render holds exactly the objects of the kustomization, field for field.
fn assert_same(want: &Objects, got: &Objects, what: &str) {
    let mut problems = Vec::new();
    for k in want.keys().filter(|k| !got.contains_key(*k)) {
        problems.push(format!("{k}: not rendered by the chart"));
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        problems.push(format!("{k}: rendered by the chart only"));
    }
    for (k, w) in want {
        if let Some(g) = got.get(k) {
            differences(k, w, g, &mut problems);
        }
    }
    assert!(
        problems.is_empty(),
        "the chart ({what}) and the kustomization drifted apart:\n  {}",
        problems.join("\n  ")
    );
}

// ---- the cluster ----

/// `kubectl get -f -` of these objects: the ones the API server has, by key.
fn present(api: &ApiServer, manifest: &str) -> BTreeMap<String, Value> {
    let out = api.kubectl_stdin(
        ADMIN,
        &["get", "-f", "-", "-o", "json", "--ignore-not-found"],
        Some(manifest),
    );
    assert!(
        out.status.success(),
        "kubectl get -f -: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim().is_empty() {
        return BTreeMap::new();
    }
    let found: Value = serde_json::from_str(&text).expect("kubectl's JSON");
    let items = match found["kind"].as_str() {
        Some("List") => found["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![found],
    };
    items.into_iter().map(|o| (key(&o), o)).collect()
}

fn get(api: &ApiServer, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&api.ok(ADMIN, &all)).expect("kubectl's JSON")
}

fn exists(api: &ApiServer, args: &[&str]) -> bool {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "name", "--ignore-not-found"]);
    !api.ok(ADMIN, &all).trim().is_empty()
}

/// Every object of the release's manifest is in the cluster, owned by the release.
fn assert_installed(api: &ApiServer, release: &Release) {
    let want = parse(&release.manifest, "the release's manifest");
    let found = present(api, &release.manifest);
    let missing: Vec<&String> = want.keys().filter(|k| !found.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "revision {}: not in the API server: {missing:?}",
        release.version
    );
    for (k, object) in &found {
        assert_eq!(
            object["metadata"]["annotations"]["meta.helm.sh/release-name"], RELEASE,
            "{k}: not owned by the release"
        );
        assert_eq!(
            object["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm",
            "{k}"
        );
    }
}

/// The webhooks of both configurations as the API server stored them (defaults filled in).
fn stored_webhooks(api: &ApiServer) -> (Value, Value) {
    let webhooks = |kind: &str| {
        if exists(api, &[kind, "handoff"]) {
            get(api, &[kind, "handoff"])["webhooks"].clone()
        } else {
            Value::Null
        }
    };
    (
        webhooks("validatingwebhookconfiguration"),
        webhooks("mutatingwebhookconfiguration"),
    )
}

/// What the cert-manager and monitoring objects need: their CRDs (any content accepted).
fn install_foreign_crds(api: &ApiServer) {
    let mut yaml = String::new();
    for (group, plural, kind) in [
        ("cert-manager.io", "issuers", "Issuer"),
        ("cert-manager.io", "certificates", "Certificate"),
        ("monitoring.coreos.com", "servicemonitors", "ServiceMonitor"),
        ("monitoring.coreos.com", "prometheusrules", "PrometheusRule"),
    ] {
        yaml.push_str(&format!(
            "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: {plural}.{group}\nspec:\n  group: {group}\n  scope: Namespaced\n  names: {{plural: {plural}, kind: {kind}}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}\n"
        ));
    }
    api.apply(&yaml);
    api.ok(
        ADMIN,
        &[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd/issuers.cert-manager.io",
            "crd/certificates.cert-manager.io",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
    );
}

// ---- the tests ----

/// The chart's copies of the manifests' files are the files, and its version is the crate's.
/// Needs neither the engine nor an API server.
#[test]
fn the_chart_carries_the_manifests_files_and_the_crate_version() {
    for (copy, source) in [
        (
            "charts/handoff/crds/movewindow-crd.yaml",
            "manifests/base/movewindow-crd.yaml",
        ),
        (
            "charts/handoff/files/rules.yaml",
            "manifests/monitoring/rules.yaml",
        ),
        (
            "charts/handoff/files/dashboard.json",
            "manifests/monitoring/dashboard.json",
        ),
    ] {
        assert!(
            read(copy) == read(source),
            "{copy} is not a copy of {source}: cp {source} {copy}"
        );
    }
    let chart: Value = handoff::yaml::from_str(&read("charts/handoff/Chart.yaml")).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version, "Chart.yaml version");
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
    let values: Value = handoff::yaml::from_str(&read("charts/handoff/values.yaml")).unwrap();
    let base = kustomize("base");
    let image = base["Deployment handoff-system/handoff-guard"]
        .pointer("/spec/template/spec/containers/0/image")
        .and_then(Value::as_str)
        .unwrap()
        .to_owned();
    assert_eq!(
        format!(
            "{}:{version}",
            values["image"]["repository"].as_str().unwrap()
        ),
        image
    );
}

/// Every object in values.schema.json that lists properties refuses any other: a misspelt key
/// fails the install.
#[test]
fn the_values_schema_refuses_unknown_keys_at_every_level() {
    let schema: Value = serde_json::from_str(&read("charts/handoff/values.schema.json"))
        .expect("values.schema.json is JSON");
    fn walk(path: &str, node: &Value, open: &mut Vec<String>) {
        match node {
            Value::Object(map) => {
                if map.contains_key("properties")
                    && map.get("additionalProperties") != Some(&json!(false))
                {
                    open.push(path.to_owned());
                }
                for (k, v) in map {
                    walk(&format!("{path}/{k}"), v, open);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(&format!("{path}/{i}"), v, open);
                }
            }
            _ => {}
        }
    }
    let mut open = Vec::new();
    walk("", &schema, &mut open);
    assert!(
        open.is_empty(),
        "objects without additionalProperties: false: {open:?}"
    );
}

/// `helm lint` finds nothing to warn about, and does find a misspelt default.
#[test]
fn helm_lint_is_clean() {
    let Some(python) = helm_python() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temporary folder");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "").unwrap();
    let helm = Helm {
        python,
        kubeconfig,
        namespace: NAMESPACE,
    };
    let lint = |chart: &Path| {
        helm.call(json!({"action": "lint", "chart": chart}))
            .unwrap_or_else(|e| panic!("helm lint {}: {e}", chart.display()))
    };
    // Severity: 1 info, 2 warning, 3 error. The binding serializes a message's error as {}, so
    // only the file it is about can be reported. The one info: Chart.yaml names no icon.
    let serious = |answer: &Value| -> Vec<String> {
        answer["Messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["Severity"].as_u64().unwrap_or(3) >= 2)
            .map(|m| format!("{} (severity {})", m["Path"], m["Severity"]))
            .collect()
    };
    let answer = lint(&root().join(CHART));
    assert_eq!(answer["TotalChartsLinted"], 1, "{answer}");
    assert!(
        serious(&answer).is_empty(),
        "helm lint {CHART}: {:?} (install the chart to see Helm's message)",
        serious(&answer)
    );

    // The same chart with a typo in values.yaml: the schema makes lint fail on it.
    let copy = dir.path().join("handoff");
    copy_dir(&root().join(CHART), &copy);
    let values = std::fs::read_to_string(copy.join("values.yaml")).unwrap();
    std::fs::write(
        copy.join("values.yaml"),
        values.replacen("  replicas: 3", "  replcas: 3", 1),
    )
    .unwrap();
    let answer = lint(&copy);
    assert!(
        serious(&answer).iter().any(|m| m.contains("values.yaml")),
        "helm lint missed replcas in values.yaml: {answer}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Install, upgrades through every overlay's settings and changed values, the way back, and
/// uninstall, by the Helm engine against a real API server.
#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn install_upgrade_roll_back_and_uninstall_on_a_real_api_server() {
    let Some(python) = helm_python() else {
        return;
    };
    if apiserver::skip() {
        return;
    }
    let started = Instant::now();
    let api = ApiServer::start();
    install_foreign_crds(&api);
    let helm = Helm {
        python: python.clone(),
        kubeconfig: api.kubeconfig(ADMIN),
        namespace: NAMESPACE,
    };

    // Bad values are refused before any object of the release is written, each with a message
    // naming it.
    for (values, says) in [
        (
            json!({"guard": {"replcas": 2}}),
            "at '/guard': additional properties 'replcas' not allowed",
        ),
        (
            json!({"certificate": {"mode": "cert-manager"}}),
            "at '/certificate/mode': value must be one of 'secret', 'certManager'",
        ),
        (
            json!({"pin": {"replicas": "three"}}),
            "at '/pin/replicas': got string, want integer",
        ),
        (
            json!({"config": {"enforcement": {"syncFinalizer": "enforcing"}}}),
            "at '/config/enforcement/syncFinalizer': value must be one of 'enforce', 'warn', 'audit'",
        ),
        (
            json!({"guard": {"replicas": 2}}),
            "guard.podDisruptionBudget.minAvailable (2) must be below guard.replicas (2)",
        ),
        (
            json!({"certificate": {"caBundle": "-----BEGIN CERTIFICATE-----"}}),
            "certificate.caBundle is a PEM; it takes the base64 of the PEM",
        ),
        (
            json!({"guard": {"enabled": false}, "pin": {"enabled": false}}),
            "guard.enabled and pin.enabled are both false",
        ),
    ] {
        let error = helm
            .install(values.clone())
            .err()
            .unwrap_or_else(|| panic!("helm install accepted {values}"));
        assert!(error.contains(says), "install with {values}: {error}");
    }
    assert!(helm.list().is_empty(), "a refused install left a release");
    // Helm puts crds/ in before it checks the values (the helm CLI does the same): only the CRD.
    assert!(exists(&api, &["crd", CRD]));
    assert!(!exists(
        &api,
        &["deployments", "-n", NAMESPACE, "handoff-guard"]
    ));

    // 1. Install with the defaults: exactly manifests/base, all of it in the API server.
    let first = helm.install(json!({})).expect("helm install");
    assert_eq!(
        (
            first.version,
            first.status.as_str(),
            first.description.as_str()
        ),
        (1, "deployed", "Install complete")
    );
    let base = kustomize("base");
    assert_same(
        &base,
        &parse(&first.manifest, "default values"),
        "default values",
    );
    assert_installed(&api, &first);
    let crd = get(&api, &["crd", CRD]);
    assert!(
        crd["metadata"]["labels"]["app.kubernetes.io/managed-by"].is_null(),
        "Helm installs crds/ unmanaged: {}",
        crd["metadata"]
    );
    let installed_webhooks = stored_webhooks(&api);
    // The CRD upgrade of docs/src/tasks/upgrade.md (Helm never upgrades crds/) applies over Helm's install.
    api.ok(
        ADMIN,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            root()
                .join("charts/handoff/crds/movewindow-crd.yaml")
                .to_str()
                .unwrap(),
        ],
    );

    // 2. cert-manager issues the certificate: the cert-manager overlay.
    let cert_manager = helm.upgrade(json!({"certificate": {"mode": "certManager"}}));
    assert_same(
        &kustomize("overlays/cert-manager"),
        &parse(&cert_manager.manifest, "certManager"),
        "certificate.mode: certManager",
    );
    assert_installed(&api, &cert_manager);
    let injected = get(&api, &["mutatingwebhookconfiguration", "handoff"]);
    assert_eq!(
        injected["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "handoff-system/handoff"
    );

    // 3. The kcp settings: the kcp overlay; the cert-manager objects go again.
    let kcp = helm.upgrade(json!({"kcp": {"enabled": true}}));
    assert_same(
        &kustomize("overlays/kcp"),
        &parse(&kcp.manifest, "kcp"),
        "kcp.enabled",
    );
    assert_installed(&api, &kcp);
    let left = present(&api, &cert_manager.manifest);
    assert!(
        !left
            .keys()
            .any(|k| k.starts_with("Issuer ") || k.starts_with("Certificate ")),
        "the cert-manager objects stayed: {:?}",
        left.keys()
    );

    // 4. The monitoring objects: the base and the monitoring overlay.
    let monitoring = helm.upgrade(json!({"monitoring": {
        "serviceMonitor": {"enabled": true},
        "prometheusRule": {"enabled": true},
        "dashboard": {"enabled": true},
    }}));
    let mut want = base.clone();
    want.extend(kustomize("overlays/monitoring"));
    assert_same(
        &want,
        &parse(&monitoring.manifest, "monitoring"),
        "monitoring.*.enabled",
    );
    assert_installed(&api, &monitoring);
    assert!(!exists(&api, &["clusterrole", "handoff-guard-kcp-mirror"]));

    // 5. Changed values: only the guard, four replicas, another image and certificate, the
    // config file, scheduling.
    let ca = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&api.ca_pem)
    };
    let changed = helm.upgrade(json!({
        "image": {"repository": "registry.example.com/platform/handoff", "tag": "0.1.0-patched", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "guard": {
            "replicas": 4,
            "podDisruptionBudget": {"minAvailable": 3},
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "extraArgs": ["--max-staleness", "5s"],
        },
        "pin": {"enabled": false},
        "certificate": {"secretName": "my-tls", "caBundle": ca},
        "config": {
            "enforcement": {"syncFinalizer": "warn", "moveWindow": "audit"},
            "exemptions": [{"group": "move-breakglass"}],
            "syncTargets": [
                {"username": "legacy-syncer", "cluster": "root:org:ws", "name": "us-west1"},
                {"username": "system:serviceaccount:kcp-syncer-a-1:kcp-syncer-a-1", "key": "k"},
            ],
        },
        "podAnnotations": {"example.com/team": "platform"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]}
        ]}}},
        "priorityClassName": "platform-critical",
        "monitoring": {"prometheusRule": {"enabled": true, "runbookURL": RUNBOOKS}},
    }));
    assert_installed(&api, &changed);
    check_changed_values(&api, &ca);
    // The runbooks where the organisation serves the book: every alert's link, its anchor kept.
    let rule = get(&api, &["prometheusrule", "-n", NAMESPACE, "handoff"]);
    let mut links = 0;
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for alert in group["rules"].as_array().expect("rules") {
            let name = alert["alert"].as_str().expect("an alert");
            assert_eq!(
                alert["annotations"]["runbook_url"].as_str(),
                Some(format!("{RUNBOOKS}#{}", name.to_lowercase()).as_str()),
                "{name}: runbook_url with monitoring.prometheusRule.runbookURL"
            );
            links += 1;
        }
    }
    assert!(links > 0, "the PrometheusRule has no alerts");

    // 6. Back to the first revision: its manifest, its objects, its webhooks.
    let back = helm.rollback(1);
    assert_eq!((back.version, back.status.as_str()), (6, "deployed"));
    assert_eq!(
        back.manifest, first.manifest,
        "the way back renders the first revision again"
    );
    assert_installed(&api, &back);
    let now = present(&api, &changed.manifest);
    assert!(
        !now.contains_key("ConfigMap handoff-system/handoff-config"),
        "the config file stayed after the way back"
    );
    assert_eq!(
        get(&api, &["deployment", "-n", NAMESPACE, "handoff-guard"])["spec"]["replicas"],
        3
    );
    assert_eq!(stored_webhooks(&api), installed_webhooks);
    let history = helm.history();
    let states: Vec<(u64, &str)> = history
        .iter()
        .map(|r| (r.version, r.status.as_str()))
        .collect();
    assert_eq!(
        states,
        [
            (1, "superseded"),
            (2, "superseded"),
            (3, "superseded"),
            (4, "superseded"),
            (5, "superseded"),
            (6, "deployed")
        ]
    );

    // 7. Uninstall: nothing of any revision is left but the CRD (crds/ is never deleted).
    helm.call(json!({"action": "uninstall"}))
        .expect("helm uninstall");
    let every_revision: String = history
        .iter()
        .map(|r| format!("{}\n---\n", r.manifest))
        .collect();
    let left = present(&api, &every_revision);
    assert!(left.is_empty(), "left after uninstall: {:?}", left.keys());
    let release_records = api.ok(
        ADMIN,
        &[
            "get",
            "secrets",
            "-n",
            NAMESPACE,
            "-l",
            "owner=helm",
            "-o",
            "name",
        ],
    );
    assert!(release_records.trim().is_empty(), "{release_records}");
    assert!(helm.list().is_empty());
    assert!(exists(&api, &["crd", CRD]), "uninstall deleted the CRD");
    let labelled = api.ok(
        ADMIN,
        &[
            "get",
            "deployments,services,serviceaccounts,poddisruptionbudgets,configmaps,roles,rolebindings,clusterroles,clusterrolebindings,validatingwebhookconfigurations,mutatingwebhookconfigurations,issuers,certificates,servicemonitors,prometheusrules",
            "-A",
            "-l",
            "app.kubernetes.io/name=handoff",
            "-o",
            "name",
        ],
    );
    assert!(
        labelled.trim().is_empty(),
        "left after uninstall: {labelled}"
    );

    // 8. Another namespace: every reference follows it, and the guard is told where the policy
    // parameter ConfigMap its Role covers lives.
    let elsewhere = Helm {
        python,
        kubeconfig: api.kubeconfig(ADMIN),
        namespace: "platform-webhooks",
    };
    let moved = elsewhere
        .install(json!({"certificate": {"mode": "certManager"}}))
        .expect("helm install -n platform-webhooks");
    let mut want = kustomize_in("overlays/cert-manager", elsewhere.namespace);
    let args = want
        .get_mut("Deployment platform-webhooks/handoff-guard")
        .and_then(|guard| guard.pointer_mut("/spec/template/spec/containers/0/args"))
        .and_then(Value::as_array_mut)
        .expect("the guard's args");
    let at = args.iter().position(|a| a == "sync-finalizer").unwrap() + 1;
    args.splice(
        at..at,
        [
            json!("--policy-params"),
            json!("$(POD_NAMESPACE)/handoff-sync-targets"),
        ],
    );
    assert_same(
        &want,
        &parse(&moved.manifest, "platform-webhooks"),
        "-n platform-webhooks, certManager",
    );
    assert_installed(&api, &moved);
    elsewhere
        .call(json!({"action": "uninstall"}))
        .expect("helm uninstall -n platform-webhooks");
    assert!(present(&api, &moved.manifest).is_empty());

    // The manifests register the webhooks exactly as the chart did: apply the base's two
    // configurations to the same API server and compare what it stored.
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("manifests/base"))
        .output()
        .expect("kubectl kustomize");
    let configurations: String = handoff::yaml::documents(&String::from_utf8_lossy(&out.stdout))
        .map(|(_, doc)| doc)
        .filter(|doc| {
            doc.contains("kind: ValidatingWebhookConfiguration")
                || doc.contains("kind: MutatingWebhookConfiguration")
        })
        .map(|doc| format!("---\n{}\n", doc.trim_start_matches("---\n")))
        .collect();
    api.apply(&configurations);
    assert_eq!(
        stored_webhooks(&api),
        installed_webhooks,
        "the API server stored other webhooks from manifests/base than from the chart"
    );
    eprintln!(
        "helm: install, 5 upgrades, the way back, uninstall, another namespace in {:.1?}",
        started.elapsed()
    );
}

/// What revision 5's values changed, as the API server has it.
/// `monitoring.prometheusRule.runbookURL` in the changed values.
const RUNBOOKS: &str = "https://docs.example.com/platform/handoff/operations/runbooks.html";

fn check_changed_values(api: &ApiServer, ca: &str) {
    let guard = get(api, &["deployment", "-n", NAMESPACE, "handoff-guard"]);
    let spec = &guard["spec"];
    assert_eq!(spec["replicas"], 4);
    let pod = &spec["template"];
    assert_eq!(
        pod["metadata"]["annotations"]["example.com/team"], "platform",
        "podAnnotations"
    );
    assert!(
        pod["metadata"]["annotations"]["handoff.dev/startup-config"].is_string(),
        "a change to the start-up part of the config restarts the pods"
    );
    let pod = &pod["spec"];
    assert_eq!(pod["priorityClassName"], "platform-critical");
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(pod["affinity"]["podAntiAffinity"].is_null());
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "node-role.kubernetes.io/control-plane"
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example.com/platform/handoff:0.1.0-patched"
    );
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for pair in [
        ["--config", "/etc/handoff/config/config.yaml"],
        ["--max-staleness", "5s"],
        ["--webhooks", "sync-finalizer"],
    ] {
        assert!(args.windows(2).any(|w| w == pair), "{pair:?} in {args:?}");
    }
    assert_eq!(pod["volumes"][0]["secret"]["secretName"], "my-tls");
    assert_eq!(
        get(api, &["pdb", "-n", NAMESPACE, "handoff-guard"])["spec"]["minAvailable"],
        3
    );

    // The config file, as handoff reads it.
    let config = get(api, &["configmap", "-n", NAMESPACE, "handoff-config"]);
    let text = config["data"]["config.yaml"].as_str().expect("config.yaml");
    let file = handoff::config::ConfigFile::parse(text)
        .unwrap_or_else(|e| panic!("handoff refuses the chart's config file: {e}\n{text}"));
    assert_eq!(file.sync_targets.len(), 2);
    assert_eq!(file.exemptions.len(), 1);
    let rollout = file.rollout();
    assert_eq!(
        (rollout.sync_finalizer, rollout.move_window),
        (Mode::Warn, Mode::Audit)
    );

    // Only the guard runs: the pin's objects are gone, one webhook entry is left.
    for (kind, name) in [
        ("deployment", "handoff-pin"),
        ("service", "handoff-pin"),
        ("serviceaccount", "handoff-pin"),
        ("pdb", "handoff-pin"),
    ] {
        assert!(
            !exists(api, &[kind, "-n", NAMESPACE, name]),
            "{kind} {name} with pin.enabled: false"
        );
    }
    assert!(!exists(api, &["mutatingwebhookconfiguration", "handoff"]));
    assert!(!exists(api, &["clusterrole", "handoff-window-operator"]));
    let (validating, mutating) = stored_webhooks(api);
    assert!(mutating.is_null());
    let entries = validating.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{validating}");
    assert_eq!(entries[0]["name"], "sync-finalizer.handoff.dev");
    assert_eq!(entries[0]["clientConfig"]["caBundle"], ca);
    let expression = entries[0]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        expression.ends_with(r#"|| request.userInfo.username in ["legacy-syncer"]"#),
        "a syncTargets username that is no kcp syncer is sent to the guard: {expression}"
    );
    for kind in ["servicemonitor", "issuer"] {
        let left = api.ok(ADMIN, &["get", kind, "-n", NAMESPACE, "-o", "name"]);
        assert!(left.trim().is_empty(), "{kind}: {left}");
    }
}
