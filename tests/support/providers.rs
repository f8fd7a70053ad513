//! Cluster API provider managers against the real API server: `provider-standin` replicas
//! (client-go leader election on a Lease, reconcilers only on the leader, a fail-closed
//! admission webhook on every replica) kept running for a real Deployment by `podsim.py`, and
//! reached by kube-apiserver through a real Service's ClusterIP, as in a cluster.
//! See `../shared/provider-standin/README.md` for what the stand-in does and does not do.
//!
//! A ClusterIP exists only inside the test's own network namespace: a test that gives its
//! provider a Service runs under `support::netns::in_own_netns` (which `Provider::start`
//! checks). Every process here is spawned through `apiserver::spawn` and dies with the test
//! binary; the stand-ins themselves are started by podsim under `setpriv --pdeathsig KILL`, so
//! they die with podsim however it ends. `Drop` stops podsim (SIGTERM: it stops its replicas
//! and deletes their Pods) earlier.
//!
//! The Deployment, its Service, the webhook configurations and the Lease stay in the API
//! server after `Drop`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use handoff::certs::Ca;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use super::apiserver::{ADMIN, ApiServer, kubectl_watch, spawn, text};

/// The Lease name a stand-in uses without `--leader-election-id` (Cluster API core's).
pub const DEFAULT_LEASE: &str = "controller-leader-election-capi";
/// The `--block-move-resource` of the DockerCluster CRD `install_capi_crds` installs.
pub const DOCKERCLUSTERS: &str = "infrastructure.cluster.x-k8s.io/v1beta2/dockerclusters";
/// The annotation a provider keeps on its objects while their Cluster is not paused.
pub const BLOCK_MOVE: &str = "clusterctl.cluster.x-k8s.io/block-move";

/// How long `Provider::start` waits for the replicas to be up.
const START_WAIT: Duration = Duration::from_secs(120);

/// client-go leader-election timings (`--leader-elect-lease-duration`, `-renew-deadline`,
/// `-retry-period`).
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseTiming {
    /// controller-runtime's and Cluster API's defaults: 15 s / 10 s / 2 s.
    pub const DEFAULT: LeaseTiming = LeaseTiming {
        duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };
    /// Short enough for a test to watch leadership move: 4 s / 3 s / 1 s.
    pub const FAST: LeaseTiming = LeaseTiming {
        duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
    };
}

/// The provider's webhook Service: `<name>.<namespace>.svc` at `cluster_ip:443`, forwarded to
/// the live replicas (`target_port` is only written into the Service).
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    pub name: String,
    /// In envtest's service range, 10.0.0.0/24 (10.0.0.1 is the `kubernetes` Service's).
    pub cluster_ip: Ipv4Addr,
    pub target_port: u16,
}

/// One provider manager's Deployment, as clusterctl installs it.
#[derive(Debug, Clone)]
pub struct ProviderSpec {
    pub namespace: String,
    pub name: String,
    pub replicas: u32,
    /// The Deployment's labels (not the pod template's, which are `app: <name>`).
    pub labels: BTreeMap<String, String>,
    /// The Lease `<namespace>/<id>`; `None`: `--leader-elect=false` (every replica reconciles).
    pub leader_election_id: Option<String>,
    pub lease: LeaseTiming,
    /// `group/version/resource` (e.g. `DOCKERCLUSTERS`) to mark with `BLOCK_MOVE`.
    pub block_move_resource: Option<String>,
    pub service: Option<ServiceSpec>,
    /// More `provider-standin` flags, e.g. `--reconcile-every=200ms`.
    pub extra_args: Vec<String>,
    /// podsim's `--seconds`: it stops everything after that long. A safety net only (podsim
    /// and its replicas die with the test binary): an hour, since on a loaded machine the move
    /// test outlived 15 minutes and its providers stopped leading mid-move.
    pub seconds: u32,
}

impl ProviderSpec {
    /// `namespace/name` with Cluster API's labels (`cluster.x-k8s.io/provider: <provider>`,
    /// `clusterctl.cluster.x-k8s.io: ""`), one replica, the Lease `<name>-leader-election`,
    /// default timings, no Service.
    pub fn new(namespace: &str, name: &str, provider: &str) -> ProviderSpec {
        ProviderSpec {
            namespace: namespace.into(),
            name: name.into(),
            replicas: 1,
            labels: BTreeMap::from([
                ("cluster.x-k8s.io/provider".into(), provider.into()),
                ("clusterctl.cluster.x-k8s.io".into(), String::new()),
            ]),
            leader_election_id: Some(format!("{name}-leader-election")),
            lease: LeaseTiming::DEFAULT,
            block_move_resource: None,
            service: None,
            extra_args: Vec::new(),
            seconds: 3600,
        }
    }

    /// Cluster API core as clusterctl installs it: `capi-system/capi-controller-manager`,
    /// provider `cluster-api`, Lease `controller-leader-election-capi`, webhooks behind
    /// `capi-webhook-service` (here at 10.0.0.20:443).
    pub fn capi_core() -> ProviderSpec {
        ProviderSpec::new("capi-system", "capi-controller-manager", "cluster-api")
            .leader_election(Some(DEFAULT_LEASE))
            .webhook_service("capi-webhook-service", Ipv4Addr::new(10, 0, 0, 20))
    }

    pub fn replicas(mut self, n: u32) -> Self {
        self.replicas = n;
        self
    }

    pub fn leader_election(mut self, id: Option<&str>) -> Self {
        self.leader_election_id = id.map(Into::into);
        self
    }

    pub fn lease(mut self, timing: LeaseTiming) -> Self {
        self.lease = timing;
        self
    }

    pub fn block_move(mut self, gvr: &str) -> Self {
        self.block_move_resource = Some(gvr.into());
        self
    }

    pub fn webhook_service(mut self, name: &str, cluster_ip: Ipv4Addr) -> Self {
        self.service = Some(ServiceSpec {
            name: name.into(),
            cluster_ip,
            target_port: 9443,
        });
        self
    }

    pub fn arg(mut self, flag: &str) -> Self {
        self.extra_args.push(flag.into());
        self
    }

    /// The flags podsim passes to every replica (after its own `--kubeconfig`, `--namespace`,
    /// `--pod-name` and webhook flags).
    pub fn standin_flags(&self) -> Vec<String> {
        let mut flags = match &self.leader_election_id {
            Some(id) => vec![
                format!("--leader-election-id={id}"),
                format!("--leader-elect-lease-duration={}", go(self.lease.duration)),
                format!(
                    "--leader-elect-renew-deadline={}",
                    go(self.lease.renew_deadline)
                ),
                format!(
                    "--leader-elect-retry-period={}",
                    go(self.lease.retry_period)
                ),
            ],
            None => vec!["--leader-elect=false".into()],
        };
        if let Some(gvr) = &self.block_move_resource {
            flags.push(format!("--block-move-resource={gvr}"));
        }
        flags.extend(self.extra_args.iter().cloned());
        flags
    }

    fn deployment(&self) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels},
            "spec": {
                "replicas": self.replicas,
                "selector": {"matchLabels": {"app": self.name}},
                "template": {
                    "metadata": {"labels": {"app": self.name}},
                    "spec": {"containers": [{
                        "name": "manager", "image": "provider-standin",
                        "ports": [{"name": "webhook-server", "containerPort": 9443}]
                    }]}
                }
            }
        })
    }
}

/// A Go duration (`4s`, `1500ms`).
fn go(d: Duration) -> String {
    match d.subsec_millis() {
        0 => format!("{}s", d.as_secs()),
        _ => format!("{}ms", d.as_millis()),
    }
}

/// A running provider: its Deployment (and Service) in the API server, podsim keeping the
/// Deployment's replicas running as `provider-standin` processes.
pub struct Provider {
    pub spec: ProviderSpec,
    /// Certificates, `podsim.log`, and `pods/<pod>.log` per replica.
    pub dir: tempfile::TempDir,
    /// Signed the webhook's serving certificate (for `<service>.<namespace>.svc`).
    pub ca: Ca,
    podsim: Mutex<Child>,
}

impl Provider {
    /// Create the namespace (if missing), the Deployment and its Service, start podsim, and
    /// wait (up to 2 min) until `spec.replicas` replicas run and each one's webhook answers.
    pub fn start(api: &ApiServer, spec: ProviderSpec) -> Provider {
        let dir = tempfile::Builder::new()
            .prefix(&format!("handoff-provider-{}-", spec.name))
            .tempdir()
            .expect("temp dir");
        let d = dir.path();
        let ca = Ca::new(&format!("{} webhook CA", spec.name), 30).expect("CA");
        if let Some(svc) = &spec.service {
            // Binds the ClusterIP: only in the test's own network namespace.
            super::netns::add_loopback_ip(&svc.cluster_ip.to_string());
            let host = format!("{}.{}.svc", svc.name, spec.namespace);
            let dns = [host.clone(), format!("{host}.cluster.local")];
            let (cert, key) = ca
                .serving_cert(&dns, &[IpAddr::V4(svc.cluster_ip)], 30)
                .expect("serving cert");
            write(d, "tls.crt", &cert);
            write(d, "tls.key", &key);
            write(d, "ca.crt", &ca.cert_pem);
        }

        api.apply(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace}})
                .to_string(),
        );
        api.apply(&spec.deployment().to_string());
        if let Some(svc) = &spec.service {
            api.apply(
                &json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": svc.name, "namespace": spec.namespace, "labels": spec.labels},
                    "spec": {
                        "type": "ClusterIP",
                        "clusterIP": svc.cluster_ip.to_string(),
                        "selector": {"app": spec.name},
                        "ports": [{"name": "https", "protocol": "TCP", "port": 443,
                                   "targetPort": svc.target_port}]
                    }
                })
                .to_string(),
            );
        }

        let bin = standin_launcher(d);
        let podsim =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/provider-standin/podsim.py");
        let log = std::fs::File::create(d.join("podsim.log")).expect("podsim.log");
        let mut cmd = Command::new("python3");
        cmd.arg(&podsim)
            .arg("--kubeconfig")
            .arg(api.kubeconfig(ADMIN))
            .arg("--deployment")
            .arg(format!("{}/{}", spec.namespace, spec.name))
            .arg("--bin")
            .arg(&bin)
            .arg("--log")
            .arg(d.join("pods"))
            .arg("--seconds")
            .arg(spec.seconds.to_string());
        if let Some(svc) = &spec.service {
            cmd.arg("--service-addr")
                .arg(format!("{}:443", svc.cluster_ip))
                .arg("--cert")
                .arg(d.join("tls.crt"))
                .arg("--key")
                .arg(d.join("tls.key"));
        }
        cmd.arg("--")
            .args(spec.standin_flags())
            .env_remove("KUBECONFIG")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let child = spawn(cmd).unwrap_or_else(|e| panic!("python3 {}: {e}", podsim.display()));
        let provider = Provider {
            spec,
            dir,
            ca,
            podsim: Mutex::new(child),
        };
        provider.wait_replicas(api, provider.spec.replicas, START_WAIT);
        provider
    }

    pub fn namespace(&self) -> &str {
        &self.spec.namespace
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// `kubectl scale` the Deployment; podsim follows within a second or so (`wait_replicas`).
    pub fn scale(&self, api: &ApiServer, replicas: u32) {
        api.ok(
            ADMIN,
            &[
                "-n",
                self.namespace(),
                "scale",
                "deployment",
                self.name(),
                &format!("--replicas={replicas}"),
            ],
        );
    }

    /// The Pods podsim keeps for the Deployment (`<deployment>-<hash>-<5 chars>`), by name.
    pub fn pods(&self, api: &ApiServer) -> Vec<String> {
        let out = api.ok(
            ADMIN,
            &[
                "-n",
                self.namespace(),
                "get",
                "pods",
                "-l",
                &format!("app={}", self.name()),
                "-o",
                "json",
            ],
        );
        let list: Value = serde_json::from_str(&out).expect("pod list");
        let mut names: Vec<String> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["metadata"]["name"].as_str().map(Into::into))
            .collect();
        names.sort();
        names
    }

    /// Wait until exactly `n` Pods exist and, with a Service, each one's webhook answers
    /// `/healthz`; their names. Panics with the logs otherwise.
    pub fn wait_replicas(&self, api: &ApiServer, n: u32, within: Duration) -> Vec<String> {
        self.wait(&format!("{n} replicas up"), within, || {
            let pods = self.pods(api);
            if pods.len() != n as usize {
                return None;
            }
            if self.spec.service.is_some() {
                for pod in &pods {
                    let addr = self.webhook_addr(pod)?;
                    let (code, body) = self.get(addr, "/healthz")?;
                    if code != 200 || body != "ok" {
                        return None;
                    }
                }
            }
            Some(pods)
        })
    }

    /// `data.count` of the ConfigMap the leader bumps every reconcile (0 while there is none).
    pub fn reconciles(&self, api: &ApiServer) -> i64 {
        let name = self.reconciles_configmap();
        let out = api.kubectl(
            ADMIN,
            &[
                "-n",
                self.namespace(),
                "get",
                "configmap",
                &name,
                "-o",
                "json",
            ],
        );
        if !out.status.success() {
            let err = text(&out.stderr);
            assert!(err.contains("NotFound"), "get configmap {name}: {err}");
            return 0;
        }
        let cm: Value = serde_json::from_slice(&out.stdout).expect("configmap");
        cm["data"]["count"]
            .as_str()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }

    /// `<lease>-reconciles`: the Lease's name even with `--leader-elect=false`
    /// (`DEFAULT_LEASE` then, shared by every such provider of the namespace).
    pub fn reconciles_configmap(&self) -> String {
        format!("{}-reconciles", self.lease_name())
    }

    pub fn lease_name(&self) -> &str {
        self.spec
            .leader_election_id
            .as_deref()
            .unwrap_or(DEFAULT_LEASE)
    }

    /// The Lease's `spec.holderIdentity` (`<pod>_<uuid>`), if the Lease exists and names one.
    /// A replica stopped by SIGTERM does not release it: it names that replica until another
    /// takes it over, a lease duration later.
    pub fn lease_holder(&self, api: &ApiServer) -> Option<String> {
        let out = api.kubectl(
            ADMIN,
            &[
                "-n",
                self.namespace(),
                "get",
                "leases.coordination.k8s.io",
                self.lease_name(),
                "-o",
                "json",
            ],
        );
        if !out.status.success() {
            let err = text(&out.stderr);
            assert!(err.contains("NotFound"), "get lease: {err}");
            return None;
        }
        let lease: Value = serde_json::from_slice(&out.stdout).expect("lease");
        lease["spec"]["holderIdentity"]
            .as_str()
            .filter(|h| !h.is_empty())
            .map(Into::into)
    }

    /// Wait until the Lease names a replica whose Pod exists; that holder identity.
    pub fn wait_leader(&self, api: &ApiServer, within: Duration) -> String {
        self.wait("a live replica holding the Lease", within, || {
            let holder = self.lease_holder(api)?;
            let pod = holder_pod(&holder);
            self.pods(api).iter().any(|p| p == pod).then_some(holder)
        })
    }

    /// The identities of this provider's replicas once every one of them is a candidate that
    /// has read `leader` holding its Lease: its running process (the run after the last
    /// "waiting for lease" of its pod's log) logged "leader is `leader`" and has neither started
    /// its reconcilers nor lost an election since. `None` while any is not (a former leader
    /// that has not yet exited, or not yet been restarted, is not).
    pub fn candidates_seeing(&self, api: &ApiServer, leader: &str) -> Option<Vec<String>> {
        let pods = self.pods(api);
        if pods.len() != self.spec.replicas as usize {
            return None;
        }
        let mut identities = Vec::new();
        for pod in &pods {
            self.replica_pid(pod)?;
            let log = self.pod_log(pod);
            let (_, run) = log.rsplit_once(" waiting for lease ")?;
            let identity = run
                .lines()
                .next()?
                .rsplit_once(" as ")?
                .1
                .trim()
                .to_string();
            let seen = run
                .lines()
                .any(|l| l.ends_with(&format!(" leader is {leader}")));
            let ran = run.lines().any(|l| {
                l.contains(" reconcilers started as ")
                    || l.ends_with(" leader election lost")
                    || l.ends_with(" stopped (signal)")
            });
            if !seen || ran {
                return None;
            }
            identities.push(identity);
        }
        Some(identities)
    }

    /// Wait until `candidates_seeing` names every replica; their identities.
    pub fn wait_candidates(&self, api: &ApiServer, leader: &str, within: Duration) -> Vec<String> {
        self.wait(
            &format!("every replica a candidate that has read {leader} leading"),
            within,
            || self.candidates_seeing(api, leader),
        )
    }

    /// The `caBundle` for this provider's webhooks: base64 of the CA's PEM.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca.cert_pem.as_bytes())
    }

    /// Register a fail-closed validating webhook named `name` (a fully qualified name, e.g.
    /// `validation.cluster.cluster.x-k8s.io`; the configuration gets the same name) served by
    /// this provider's Service at `/validate` (the stand-in answers every path), for `rules`
    /// (see `webhook_rule`). The API server picks it up within a second or so: use
    /// `until_webhook_called` before relying on it.
    pub fn register_webhook(&self, api: &ApiServer, name: &str, rules: &[Value]) {
        let svc = self
            .spec
            .service
            .as_ref()
            .expect("register_webhook: the provider has no webhook Service");
        api.apply(
            &json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": name, "labels": self.spec.labels},
                "webhooks": [{
                    "name": name,
                    "clientConfig": {
                        "service": {"namespace": self.namespace(), "name": svc.name,
                                    "path": "/validate", "port": 443},
                        "caBundle": self.ca_bundle()
                    },
                    "rules": rules,
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10
                }]
            })
            .to_string(),
        );
    }

    /// The AdmissionReviews the live replicas answered (each one's `/metrics`, summed; a
    /// restarted replica starts again from 0).
    pub fn webhook_requests(&self, api: &ApiServer) -> u64 {
        self.pods(api)
            .iter()
            .filter_map(|pod| self.webhook_addr(pod))
            .filter_map(|addr| self.get(addr, "/metrics"))
            .filter_map(|(_, body)| {
                body.lines()
                    .find_map(|l| l.strip_prefix("standin_webhook_requests_total "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .sum()
    }

    /// Call `attempt` (with 0, 1, 2, …) until one of them reached this provider's webhook (its
    /// request count rose), for up to `within`; that attempt's result. For the moment after
    /// `register_webhook`, when the API server may not call the webhook yet.
    pub fn until_webhook_called<T>(
        &self,
        api: &ApiServer,
        within: Duration,
        mut attempt: impl FnMut(u32) -> T,
    ) -> T {
        let mut i = 0;
        self.wait("the API server calling the webhook", within, || {
            let before = self.webhook_requests(api);
            let result = attempt(i);
            i += 1;
            (self.webhook_requests(api) > before).then_some(result)
        })
    }

    /// GET `path` from the Service (a live replica chosen by podsim): `(status, body)`.
    pub fn service_get(&self, path: &str) -> Option<(u16, String)> {
        let svc = self.spec.service.as_ref()?;
        self.get(SocketAddr::from((svc.cluster_ip, 443)), path)
    }

    /// Where `pod`'s webhook listens (127.0.0.1 and a port podsim chose), from its log.
    pub fn webhook_addr(&self, pod: &str) -> Option<SocketAddr> {
        let log = std::fs::read_to_string(self.dir.path().join("pods").join(format!("{pod}.log")))
            .ok()?;
        log.lines()
            .rev()
            .find_map(|l| l.split_once("webhook serving on ").map(|x| x.1))?
            .trim()
            .parse()
            .ok()
    }

    /// The pid of `pod`'s running `provider-standin` (a child of podsim), if it runs.
    pub fn replica_pid(&self, pod: &str) -> Option<i32> {
        let podsim = self.podsim.lock().unwrap_or_else(|e| e.into_inner()).id();
        std::fs::read_dir("/proc")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .find(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // `pid (comm) state ppid …`; comm may hold spaces, never a `)` we cut at last.
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|x| x.1.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<u32>().ok());
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                ppid == Some(podsim)
                    && args
                        .windows(2)
                        .any(|w| w[0] == b"--pod-name" && w[1] == pod.as_bytes())
            })
    }

    /// Send `signal` to `pod`'s `provider-standin`: SIGKILL is a crash (the Lease is left to
    /// expire), SIGTERM a container stop (exit 0, the Lease not released either). podsim
    /// restarts it a second or so later, with the same pod name and a new identity.
    pub fn signal_replica(&self, pod: &str, signal: i32) {
        let pid = self
            .replica_pid(pod)
            .unwrap_or_else(|| panic!("no running replica {pod}:\n{}", self.logs()));
        // SAFETY: kill has no memory-safety preconditions; pid is podsim's child.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// `pod`'s own log (all its runs: podsim appends on a restart).
    pub fn pod_log(&self, pod: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("pods").join(format!("{pod}.log")))
            .unwrap_or_default()
    }

    /// podsim's log, then every replica's (including stopped ones'), for panic messages.
    pub fn logs(&self) -> String {
        let mut out = format!(
            "==> podsim ({}/{}) <==\n{}",
            self.namespace(),
            self.name(),
            std::fs::read_to_string(self.dir.path().join("podsim.log")).unwrap_or_default()
        );
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.path().join("pods"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        for f in files {
            let name = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            out.push_str(&format!(
                "==> {name} <==\n{}",
                std::fs::read_to_string(&f).unwrap_or_default()
            ));
        }
        out
    }

    /// Stop podsim now (SIGTERM: it stops its replicas and deletes their Pods); the
    /// Deployment stays.
    pub fn stop(&self) {
        let mut child = self.podsim.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(None) = child.try_wait() {
            // SAFETY: kill on our own child's pid, which we have not reaped yet.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            // Each replica: up to 10 s to stop, then a Pod delete.
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    /// `check` until `Some`, panicking with the logs on timeout or when podsim has exited.
    fn wait<T>(&self, what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = check() {
                return v;
            }
            if let Ok(Some(status)) = self
                .podsim
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_wait()
            {
                panic!(
                    "{}: podsim exited ({status}) while waiting for {what}:\n{}",
                    self.name(),
                    self.logs()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "{}: timed out after {within:?} waiting for {what}:\n{}",
                    self.name(),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn get(&self, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
        let svc = self.spec.service.as_ref()?;
        https_get(
            addr,
            &format!("{}.{}.svc", svc.name, self.namespace()),
            &self.ca.cert_pem,
            path,
        )
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One change to a Lease as a `LeaseWatch` received it: when (one clock for every watch of
/// the test), the event's type and the Lease as it was written.
#[derive(Debug, Clone)]
pub struct LeaseEvent {
    pub at: Instant,
    pub kind: String,
    pub lease: Lease,
}

impl LeaseEvent {
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.lease.metadata.namespace.as_deref().unwrap_or(""),
            self.lease.metadata.name.as_deref().unwrap_or("")
        )
    }

    pub fn holder(&self) -> &str {
        self.lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .unwrap_or("")
    }
}

/// A provider that leads a Lease again after a window held it: the first write of the Lease
/// naming one of its pods after the window's last, as the API server sent it.
#[derive(Debug, Clone)]
pub struct LedAgain {
    pub cluster: String,
    pub lease: String,
    pub holder: String,
    /// `spec.acquireTime` as the new leader wrote it: its clock, which is this machine's,
    /// as every provider's and handoff's is.
    pub acquired: Timestamp,
    /// When the watch received that write.
    pub seen: Instant,
}

/// Every write of every Lease of one API server, in the order the server made them: `kubectl
/// get leases -A -w`, which lists the Leases there are (`ADDED`) and then watches from that
/// list's resourceVersion, so that no write after the list is missed. If the watch ends
/// before the test asks (a watch the server closed, a kubectl that died), the test fails
/// rather than read a partial history.
pub struct LeaseWatch {
    pub cluster: String,
    events: Arc<Mutex<Vec<LeaseEvent>>>,
    ended: Arc<AtomicBool>,
    child: Mutex<Child>,
}

impl LeaseWatch {
    /// Start watching, and return once the list has come in with every Lease of `leases`
    /// (`namespace/name`) in it: from then on each of their writes is seen.
    pub fn start(api: &ApiServer, cluster: &str, leases: &[String]) -> LeaseWatch {
        let events = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(AtomicBool::new(false));
        let sink = events.clone();
        let child = kubectl_watch(
            &api.kubeconfig(ADMIN),
            &["leases.coordination.k8s.io", "-A"],
            ended.clone(),
            move |kind, object| {
                let at = Instant::now();
                let Ok(lease) = serde_json::from_value::<Lease>(object) else {
                    return false;
                };
                sink.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(LeaseEvent {
                        at,
                        kind: kind.to_string(),
                        lease,
                    });
                true
            },
        );
        let w = LeaseWatch {
            cluster: cluster.into(),
            events,
            ended,
            child: Mutex::new(child),
        };
        w.wait(&format!("the list of {leases:?}"), START_WAIT, |events| {
            leases
                .iter()
                .all(|l| events.iter().any(|e| &e.key() == l))
                .then_some(())
        });
        w
    }

    pub fn events(&self) -> Vec<LeaseEvent> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// For each of `leases` (`namespace/name`, the Deployment whose pods lead it): the first
    /// write naming a pod of that Deployment after the last write naming `window_holder`;
    /// waits up to `within` for every one. Panics when the watch never saw the window hold a
    /// Lease (nothing to lead *again*), or it ended.
    pub fn led_again(
        &self,
        window_holder: &str,
        leases: &[(String, String)],
        within: Duration,
    ) -> Vec<LedAgain> {
        self.wait(
            &format!("a provider leading {leases:?} again after {window_holder}"),
            within,
            |events| {
                let mut out = Vec::new();
                for (key, deployment) in leases {
                    let mine: Vec<&LeaseEvent> =
                        events.iter().filter(|e| &e.key() == key).collect();
                    let held = mine.iter().rposition(|e| e.holder() == window_holder);
                    let Some(held) = held else {
                        panic!(
                            "{}: the watch never saw {window_holder} hold Lease {key}: {:?}",
                            self.cluster,
                            history(&mine)
                        );
                    };
                    let led = mine[held..].iter().find(|e| {
                        e.kind != "DELETED"
                            && holder_pod(e.holder()).starts_with(&format!("{deployment}-"))
                    })?;
                    let acquired = led
                        .lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.acquire_time.as_ref())
                        .map(|t| t.0)
                        .unwrap_or_else(|| {
                            panic!(
                                "{}: Lease {key} led by {} without an acquireTime",
                                self.cluster,
                                led.holder()
                            )
                        });
                    out.push(LedAgain {
                        cluster: self.cluster.clone(),
                        lease: key.clone(),
                        holder: led.holder().to_string(),
                        acquired,
                        seen: led.at,
                    });
                }
                Some(out)
            },
        )
    }

    /// `check` over the events so far until `Some`; panics on timeout or when the watch ended.
    fn wait<T>(
        &self,
        what: &str,
        within: Duration,
        mut check: impl FnMut(&[LeaseEvent]) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            // Read before the events: a watch that ended after this still delivered them all.
            let ended = self.ended.load(Ordering::SeqCst);
            if let Some(v) = check(&self.events()) {
                return v;
            }
            assert!(
                !ended,
                "{}: the Lease watch ended while waiting for {what}: it may have missed writes",
                self.cluster
            );
            assert!(
                Instant::now() < deadline,
                "{}: timed out after {within:?} waiting for {what}: {:?}",
                self.cluster,
                history(&self.events().iter().collect::<Vec<_>>())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `(lease, holder, acquireTime)` of each event, for a failure message.
fn history(events: &[&LeaseEvent]) -> Vec<(String, String, String)> {
    events
        .iter()
        .map(|e| {
            let acquired = e
                .lease
                .spec
                .as_ref()
                .and_then(|s| s.acquire_time.as_ref())
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            (e.key(), e.holder().to_string(), acquired)
        })
        .collect()
}

/// Every Lease of `first` was led again before any of `then` was: each new leader's
/// `acquireTime` (one clock, the machine's) of `first` before each of `then`.
pub fn led_first(first: &[LedAgain], then: &[LedAgain], what: &str) {
    assert!(
        !first.is_empty() && !then.is_empty(),
        "{what}: nothing to order: {first:?} {then:?}"
    );
    for a in first {
        for b in then {
            assert!(
                a.acquired < b.acquired,
                "{what}: {}'s Lease {} was led again by {} at {}, not before {}'s {} by {} at {} (the watches received them {:?} apart, {} first)",
                a.cluster,
                a.lease,
                a.holder,
                a.acquired,
                b.cluster,
                b.lease,
                b.holder,
                b.acquired,
                if a.seen < b.seen {
                    b.seen - a.seen
                } else {
                    a.seen - b.seen
                },
                if a.seen < b.seen {
                    &a.cluster
                } else {
                    &b.cluster
                }
            );
        }
    }
}

/// The pod name in a holder identity `<pod>_<uuid>`.
pub fn holder_pod(holder: &str) -> &str {
    holder.rsplit_once('_').map_or(holder, |x| x.0)
}

/// One entry of a webhook's `rules`.
pub fn webhook_rule(group: &str, version: &str, resource: &str, operations: &[&str]) -> Value {
    json!({
        "apiGroups": [group], "apiVersions": [version], "resources": [resource],
        "operations": operations, "scope": "*"
    })
}

/// A `cluster.x-k8s.io/v1beta2` Cluster (kind of the CRD `install_capi_crds` installs).
pub fn cluster(ns: &str, name: &str, paused: bool) -> String {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"paused": paused}
    })
    .to_string()
}

/// An `infrastructure.cluster.x-k8s.io/v1beta2` DockerCluster (`DOCKERCLUSTERS`).
pub fn docker_cluster(ns: &str, name: &str) -> String {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {}
    })
    .to_string()
}

/// Minimal CRDs for `clusters.cluster.x-k8s.io` and `dockerclusters.infrastructure.cluster.x-k8s.io`
/// (v1beta2, namespaced, any fields, status subresource); returns once both are Established.
pub fn install_capi_crds(api: &ApiServer) {
    let crds = [
        ("cluster.x-k8s.io", "clusters", "Cluster", "cluster-api"),
        (
            "infrastructure.cluster.x-k8s.io",
            "dockerclusters",
            "DockerCluster",
            "infrastructure-docker",
        ),
    ];
    for (group, plural, kind, provider) in crds {
        api.apply(
            &json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {
                    "name": format!("{plural}.{group}"),
                    "labels": {"cluster.x-k8s.io/provider": provider,
                               "clusterctl.cluster.x-k8s.io": ""}
                },
                "spec": {
                    "group": group, "scope": "Namespaced",
                    "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind,
                              "listKind": format!("{kind}List")},
                    "versions": [{
                        "name": "v1beta2", "served": true, "storage": true,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {
                            "type": "object", "x-kubernetes-preserve-unknown-fields": true
                        }}
                    }]
                }
            })
            .to_string(),
        );
    }
    for (group, plural, ..) in crds {
        api.ok(
            ADMIN,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{plural}.{group}"),
            ],
        );
    }
}

/// A blocking HTTPS `GET path` to `addr`, verifying the server as `server_name` against
/// `ca_pem`: `(status, body)`, or `None` when it cannot connect or answer.
pub fn https_get(
    addr: SocketAddr,
    server_name: &str,
    ca_pem: &str,
    path: &str,
) -> Option<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.ok()?).ok()?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from(server_name.to_string()).ok()?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    sock.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    // A peer that closes without close_notify ends the read with an error: keep what came.
    let _ = tls.read_to_end(&mut raw);
    let reply = String::from_utf8_lossy(&raw);
    let status = reply.split(' ').nth(1)?.parse().ok()?;
    let body = reply.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Some((status, body.to_string()))
}

/// The unpacked `provider-standin` (once per test binary).
pub fn standin_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/provider-standin/unpack.sh");
        let out = Command::new(&script)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{}: {}",
            script.display(),
            text(&out.stderr)
        );
        PathBuf::from(text(&out.stdout).trim())
    })
}

/// What podsim runs as `--bin`: the stand-in under `setpriv --pdeathsig KILL`, so that a
/// replica dies with podsim even when podsim itself is killed (podsim's own Popen sets no
/// death signal). Without setpriv, the stand-in itself.
fn standin_launcher(dir: &Path) -> PathBuf {
    let bin = standin_bin();
    let have_setpriv = Command::new("setpriv")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_setpriv {
        return bin.to_path_buf();
    }
    let path = dir.join("provider-standin");
    write(
        dir,
        "provider-standin",
        &format!(
            "#!/bin/sh\nexec setpriv --pdeathsig KILL -- '{}' \"$@\"\n",
            bin.display()
        ),
    );
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
}
