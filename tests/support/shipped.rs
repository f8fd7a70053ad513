//! handoff deployed as the manifests ship it: `kubectl kustomize manifests/overlays/cert-manager`
//! applied to a real API server, with nothing in it rewritten, and what cert-manager does in a
//! cluster done here by the harness from the overlay's own objects:
//! - the `Certificate` whose `secretName` the Deployments mount is issued by a CA of its own
//!   (the overlay's `handoff-ca`), with that Certificate's `dnsNames`, into a
//!   `kubernetes.io/tls` Secret holding `tls.crt`, `tls.key` and `ca.crt`, as cert-manager
//!   writes it;
//! - cainjector: every webhook configuration annotated `cert-manager.io/inject-ca-from: ns/name`
//!   gets that Certificate's `ca.crt` as the `caBundle` of each of its webhooks.
//!
//! The Issuer and Certificate objects themselves are not applied (envtest has no cert-manager
//! CRDs). The pods are run by `support::kubelet` behind `support::kube_proxy`: the API server
//! calls `clientConfig.service` at the Service's ClusterIP, verifies `<service>.<ns>.svc`
//! against the injected caBundle, and reaches whichever pod the proxy picks.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use handoff::certs::Ca;
use serde_json::{Value, json};

use super::apiserver::{ADMIN, ApiServer, text};
use super::kube_proxy::services;
use super::kubelet::Kubelet;

pub const NAMESPACE: &str = "handoff-system";
const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";

/// The rendered overlay, split by who applies what.
pub struct Rendered {
    /// Applied as they are.
    pub objects: Vec<Value>,
    /// Applied once cainjector's work is done on them.
    pub webhook_configurations: Vec<Value>,
    /// cert-manager's Issuers and Certificates, carried out by the harness.
    pub cert_manager: Vec<Value>,
}

pub fn render(overlay: &str) -> Rendered {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("manifests/overlays")
        .join(overlay);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl kustomize");
    assert!(out.status.success(), "kustomize: {}", text(&out.stderr));
    let yaml = text(&out.stdout);
    let mut r = Rendered {
        objects: Vec::new(),
        webhook_configurations: Vec::new(),
        cert_manager: Vec::new(),
    };
    for (_, doc) in handoff::yaml::documents(&yaml) {
        if handoff::yaml::is_empty(doc) {
            continue;
        }
        let v: Value = handoff::yaml::from_str(doc).expect("rendered YAML");
        let api_version = v["apiVersion"].as_str().unwrap_or_default();
        let kind = v["kind"].as_str().unwrap_or_default();
        if api_version.starts_with("cert-manager.io/") {
            r.cert_manager.push(v);
        } else if kind.ends_with("WebhookConfiguration") {
            r.webhook_configurations.push(v);
        } else {
            r.objects.push(v);
        }
    }
    r
}

/// handoff running in `api` as shipped, and the node that runs it.
pub struct Shipped {
    pub kubelet: Kubelet,
    pub ca: Ca,
    /// The serving Certificate's `dnsNames`.
    pub dns_names: Vec<String>,
    pub rendered: Rendered,
    dir: PathBuf,
    /// The serving certificate last written into the Secret (PEM).
    serving_pem: std::sync::Mutex<String>,
}

impl Shipped {
    /// Apply the cert-manager overlay, issue its certificate, inject its CA, and run every
    /// Deployment's replicas until ready. Inside `support::netns::in_own_netns` only.
    pub fn deploy(api: &ApiServer, dir: &Path) -> Shipped {
        let rendered = render("cert-manager");
        apply(api, &rendered.objects);

        let serving = certificate_for_secret(&rendered.cert_manager, "handoff-tls");
        let dns_names: Vec<String> = serving["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames")
            .iter()
            .map(|d| d.as_str().unwrap().to_string())
            .collect();
        let ca = Ca::new("handoff-ca", 3650).expect("CA");
        let serving_pem = write_tls_secret(api, &ca, &dns_names);

        let ca_bundle = {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem)
        };
        let mut configs = rendered.webhook_configurations.clone();
        for c in &mut configs {
            let from = c["metadata"]["annotations"][INJECT_CA_FROM]
                .as_str()
                .unwrap_or_else(|| panic!("{} has no {INJECT_CA_FROM}", c["metadata"]["name"]));
            // The Certificate it names must be the one whose CA signs the serving certificate.
            let (ns, name) = from.split_once('/').expect("ns/name");
            let cert = rendered
                .cert_manager
                .iter()
                .find(|o| {
                    o["kind"] == "Certificate"
                        && o["metadata"]["namespace"] == ns
                        && o["metadata"]["name"] == name
                })
                .unwrap_or_else(|| {
                    panic!("{INJECT_CA_FROM} names {from}, which the overlay lacks")
                });
            assert_eq!(
                cert["spec"]["secretName"], serving["spec"]["secretName"],
                "{INJECT_CA_FROM} must name the serving Certificate"
            );
            for w in c["webhooks"].as_array_mut().expect("webhooks") {
                w["clientConfig"]["caBundle"] = json!(ca_bundle);
            }
        }
        apply(api, &configs);

        let mut kubelet = Kubelet::new(
            api,
            &dir.join("node"),
            Path::new(env!("CARGO_BIN_EXE_handoff")),
        );
        let svc_list = get_json(api, &["get", "services", "-n", NAMESPACE]);
        for (name, svc) in services(&svc_list) {
            kubelet.serve_service(&name, &svc);
        }
        for d in rendered
            .objects
            .iter()
            .filter(|o| o["kind"] == "Deployment")
        {
            let name = d["metadata"]["name"].as_str().unwrap();
            kubelet.run_deployment(NAMESPACE, name, Duration::from_secs(60));
        }
        Shipped {
            kubelet,
            ca,
            dns_names,
            rendered,
            dir: dir.to_path_buf(),
            serving_pem: std::sync::Mutex::new(serving_pem),
        }
    }

    /// What cert-manager does at a renewal with `rotationPolicy: Always`: a new key and
    /// certificate from the same CA, written into the Secret; then the kubelet's volume update.
    pub fn rotate_serving_certificate(&self, api: &ApiServer) {
        *self.serving_pem.lock().unwrap() = write_tls_secret(api, &self.ca, &self.dns_names);
        self.kubelet.refresh_secrets();
    }

    /// The DER of the serving certificate now in the Secret.
    pub fn current_serving_cert(&self) -> Vec<u8> {
        use rustls::pki_types::pem::PemObject as _;
        let pem = self.serving_pem.lock().unwrap().clone();
        rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
            .next()
            .expect("a certificate")
            .expect("PEM")
            .to_vec()
    }

    /// The pods both Deployments ask for.
    pub fn replicas(&self) -> usize {
        self.rendered
            .objects
            .iter()
            .filter(|o| o["kind"] == "Deployment")
            .map(|d| d["spec"]["replicas"].as_u64().unwrap_or(1) as usize)
            .sum()
    }

    pub fn deployments(&self) -> Vec<String> {
        self.rendered
            .objects
            .iter()
            .filter(|o| o["kind"] == "Deployment")
            .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }
}

fn certificate_for_secret<'a>(objects: &'a [Value], secret: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == "Certificate" && o["spec"]["secretName"] == secret)
        .unwrap_or_else(|| panic!("no Certificate in the overlay writes the Secret {secret}"))
}

/// Write the Secret as cert-manager does; returns the certificate's PEM.
fn write_tls_secret(api: &ApiServer, ca: &Ca, dns_names: &[String]) -> String {
    let (cert, key) = ca
        .serving_cert(dns_names, &[], 90)
        .expect("serving certificate");
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "handoff-tls", "namespace": NAMESPACE},
        "stringData": {"tls.crt": cert, "tls.key": key, "ca.crt": ca.cert_pem},
    });
    apply(api, &[secret]);
    cert
}

/// `kubectl apply --server-side` of `objects`, in order.
pub fn apply(api: &ApiServer, objects: &[Value]) {
    // As YAML documents, the form a user applies: kubectl's client-side validation refuses a
    // `null` in a CRD's `enum` when it comes as JSON, but not from YAML.
    let yaml: Vec<String> = objects
        .iter()
        .map(|o| handoff::yaml::to_string(o).expect("YAML"))
        .collect();
    let out = api.kubectl_stdin(
        ADMIN,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&yaml.join("\n---\n")),
    );
    assert!(
        out.status.success(),
        "kubectl apply: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

pub fn get_json(api: &ApiServer, args: &[&str]) -> Value {
    let out = api.kubectl(ADMIN, &[args, &["-o", "json"]].concat());
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("kubectl's JSON")
}

/// Labels → value, for readable assertions.
pub fn labels(v: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default()
}
