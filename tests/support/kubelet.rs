//! A kubelet and a Deployment controller for the test's network namespace: each pod of a real
//! Deployment runs as a process with the container's own `args` and `env`, in a network
//! namespace of its own with its own IP (a veth pair to the test's namespace), its volumes
//! mounted at their `mountPath`s in a mount namespace of its own, as the pod's `runAsUser`,
//! with the ServiceAccount's identity from a TokenRequest bound to the Pod object; its probes
//! run as the manifest says and decide whether it is an endpoint of its Services
//! (`support::kube_proxy`). A rollout follows the Deployment's `RollingUpdate` strategy.
//!
//! What is the same as in a cluster:
//! - the process: `args` with `$(VAR)` expanded from the container's `env` as the kubelet does,
//!   `env` from values and the downward API (`metadata.name`, `metadata.namespace`,
//!   `status.podIP`, `spec.serviceAccountName`), `KUBERNETES_SERVICE_HOST`/`PORT` for the
//!   `kubernetes` Service (10.0.0.1:443, proxied to the API server), `HOSTNAME` = the pod's
//!   name, `HOME=/`; `runAsUser`/`runAsGroup`, `fsGroup` as a supplementary group;
//! - the network: `0.0.0.0` in the pod is the pod's own address only; connections from the
//!   "node" (probes, kube-proxy) come from 10.255.0.1;
//! - Secret volumes in the kubelet's atomic-writer layout (`..<timestamp>/`, `..data` symlink,
//!   one symlink per key) with `defaultMode` and the group `fsGroup`, updated by the `..data`
//!   swap; the ServiceAccount token, `ca.crt` and `namespace` at
//!   `/var/run/secrets/kubernetes.io/serviceaccount` (the `kube-api-access` projected volume
//!   that the ServiceAccount admission plugin adds; envtest's API server runs without it, so
//!   it is added here);
//! - probes: HTTP(S) GET without certificate verification, the first right at container start,
//!   then every `periodSeconds`, `timeoutSeconds`, `failureThreshold`, `successThreshold`; a
//!   container that exits is restarted (restartPolicy Always), unready until its probe passes;
//! - termination: the Pod is deleted (deletionTimestamp set), it leaves the endpoints at once,
//!   SIGTERM, SIGKILL after `terminationGracePeriodSeconds`, then the Pod object is removed.
//!
//! What differs, stated: a container that exits is out of the endpoints at once (a kubelet
//! notices within about a second and the EndpointSlice follows, so in a cluster a crash also
//! refuses new connections for that long); the container's root filesystem is the machine's (overlaid where a
//! volume needs a mount point, so nothing is written outside the test's folder), and the image
//! is the `handoff` binary cargo built; ReplicaSets are not made (Pods carry the
//! `pod-template-hash` label directly) and the Deployment's status is not written; a Secret
//! volume is refreshed when the test asks (`refresh_secrets`), where a kubelet does so on its
//! sync period.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::apiserver::{ApiServer, spawn, text};
use super::kube_proxy::{Endpoint, Resolver, ServicePort, ServiceView};

/// The node's own address: where probes and proxied connections come from.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 255, 0, 1);
/// The `kubernetes` Service's ClusterIP in envtest's service range.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// One pod, as the kubelet and the endpoints controller know it.
#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub deployment: String,
    pub template_hash: String,
    pub labels: BTreeMap<String, String>,
    pub ip: Ipv4Addr,
    pub container_ports: BTreeMap<String, u16>,
    pub ready: bool,
    pub terminating: bool,
    pub pid: Option<i32>,
    pub restarts: u32,
    uid: String,
}

struct Inner {
    kubeconfig: PathBuf,
    api_url_port: u16,
    api_ca_pem: String,
    dir: PathBuf,
    image_bin: PathBuf,
    pods: Mutex<Vec<Pod>>,
    next_ip: AtomicU32,
    next_veth: AtomicU32,
    /// (when, what): pod lifecycle events, for the test's report.
    events: Mutex<Vec<(Instant, String)>>,
    started: Instant,
}

/// The node: every pod started here, and the kube-proxy ports in front of them.
pub struct Kubelet {
    inner: Arc<Inner>,
    proxies: Vec<ServicePort>,
}

impl Kubelet {
    /// A node for `api`, running `image_bin` as the container image's entrypoint; the
    /// `kubernetes` Service at 10.0.0.1:443 proxied to the API server. Only inside
    /// `support::netns::in_own_netns`.
    pub fn new(api: &ApiServer, dir: &Path, image_bin: &Path) -> Kubelet {
        super::netns::add_loopback_ip(&NODE_IP.to_string());
        super::netns::add_loopback_ip(&KUBERNETES_SERVICE_IP.to_string());
        std::fs::create_dir_all(dir.join("pods")).expect("pods dir");
        let inner = Arc::new(Inner {
            kubeconfig: api.kubeconfig(super::apiserver::ADMIN),
            api_url_port: api.port,
            api_ca_pem: api.ca_pem.clone(),
            dir: dir.to_path_buf(),
            image_bin: image_bin.to_path_buf(),
            pods: Mutex::new(Vec::new()),
            next_ip: AtomicU32::new(10),
            next_veth: AtomicU32::new(0),
            events: Mutex::new(Vec::new()),
            started: Instant::now(),
        });
        let api_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, api.port));
        let kubernetes: Resolver = Arc::new(move || {
            vec![Endpoint {
                pod: "kube-apiserver".into(),
                addr: api_addr,
            }]
        });
        let proxies = vec![ServicePort::start(
            "kubernetes",
            KUBERNETES_SERVICE_IP,
            443,
            kubernetes,
        )];
        Kubelet { inner, proxies }
    }

    /// Proxy every port of `svc` (ClusterIP put on `lo`) to the ready, non-terminating pods its
    /// selector matches.
    pub fn serve_service(&mut self, name: &str, svc: &ServiceView) {
        super::netns::add_loopback_ip(&svc.cluster_ip.to_string());
        for p in &svc.ports {
            let inner = self.inner.clone();
            let selector = svc.selector.clone();
            let target = p.target_port.clone();
            let resolve: Resolver = Arc::new(move || {
                let pods = inner.pods.lock().unwrap();
                pods.iter()
                    .filter(|pod| pod.ready && !pod.terminating)
                    .filter(|pod| selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v)))
                    .filter_map(|pod| {
                        let port = match &target {
                            Value::Number(n) => n.as_u64().map(|n| n as u16),
                            Value::String(s) => pod.container_ports.get(s).copied(),
                            _ => None,
                        }?;
                        Some(Endpoint {
                            pod: pod.name.clone(),
                            addr: SocketAddr::from((pod.ip, port)),
                        })
                    })
                    .collect()
            });
            self.proxies.push(ServicePort::start(
                &format!("{name}:{}", p.name),
                svc.cluster_ip,
                p.port,
                resolve,
            ));
        }
    }

    /// The proxy of a Service port, by `<service>:<port name>`.
    pub fn proxy(&self, name: &str) -> &ServicePort {
        self.proxies
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no Service port {name}"))
    }

    /// Every Service port's connection counts.
    pub fn traffic(&self) -> Vec<String> {
        self.proxies.iter().map(|p| p.summary()).collect()
    }

    pub fn pods(&self) -> Vec<Pod> {
        self.inner.pods.lock().unwrap().clone()
    }

    pub fn pods_of(&self, deployment: &str) -> Vec<Pod> {
        self.pods()
            .into_iter()
            .filter(|p| p.deployment == deployment)
            .collect()
    }

    /// Lifecycle events so far, as `(seconds since the node started, what)`.
    pub fn events(&self) -> Vec<(f64, String)> {
        let start = self.inner.started;
        self.inner
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|(t, e)| (t.duration_since(start).as_secs_f64(), e.clone()))
            .collect()
    }

    /// When each pod was stopping, in wall-clock time (to set beside the kube-proxy's
    /// connection log): from being told to stop (deleted, or sent a signal) until its container
    /// started again (a pod killed and restarted runs again; a deleted one never does).
    pub fn stopping(&self) -> BTreeMap<String, Vec<std::ops::Range<std::time::SystemTime>>> {
        let (now, wall) = (Instant::now(), std::time::SystemTime::now());
        let at = |t: &Instant| wall - now.duration_since(*t);
        let mut stopping: BTreeMap<String, Vec<std::ops::Range<std::time::SystemTime>>> =
            BTreeMap::new();
        let far = wall + Duration::from_secs(24 * 3600);
        for (t, e) in self.inner.events.lock().unwrap().iter() {
            if let Some(pod) = e
                .strip_suffix(" terminating")
                .or_else(|| e.split_once(" sent signal ").map(|(p, _)| p))
            {
                let windows = stopping.entry(pod.to_string()).or_default();
                if windows.last().is_none_or(|w| w.end != far) {
                    windows.push(at(t)..far);
                }
            } else if let Some((pod, _)) = e.split_once(" container started")
                && let Some(w) = stopping.get_mut(pod).and_then(|w| w.last_mut())
                && w.end == far
            {
                w.end = at(t);
            }
        }
        stopping
    }

    /// The log of one pod's container (every run of it, appended).
    pub fn pod_log(&self, pod: &str) -> String {
        std::fs::read_to_string(self.inner.dir.join("pods").join(format!("{pod}.log")))
            .unwrap_or_default()
    }

    /// Start `spec.replicas` pods of the Deployment's current template and wait until all are
    /// ready.
    pub fn run_deployment(&self, namespace: &str, name: &str, within: Duration) {
        let d = self
            .inner
            .get_json(&["get", "deployment", "-n", namespace, name]);
        let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
        let mut started = Vec::new();
        for _ in 0..replicas {
            started.push(self.inner.clone().start_pod(&d));
        }
        for pod in started {
            self.wait_ready(&pod, within);
        }
    }

    /// `kubectl rollout restart` and the rollout the Deployment's `RollingUpdate` strategy
    /// asks for: `maxSurge` new pods at a time beyond `replicas`, an old pod terminated only
    /// when that leaves at least `replicas - maxUnavailable` ready. Returns when every old pod
    /// is terminating and the new ones are ready (old ones may still be draining).
    pub fn rollout(&self, namespace: &str, name: &str, within: Duration) {
        let deadline = Instant::now() + within;
        let out = self
            .inner
            .kubectl(&["rollout", "restart", "deployment", "-n", namespace, name]);
        assert!(
            out.status.success(),
            "rollout restart: {}",
            text(&out.stderr)
        );
        let d = self
            .inner
            .get_json(&["get", "deployment", "-n", namespace, name]);
        let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
        let strategy = &d["spec"]["strategy"]["rollingUpdate"];
        let surge = int_or_string(&strategy["maxSurge"], 1);
        let unavailable = int_or_string(&strategy["maxUnavailable"], 0);
        let hash = template_hash(&d["spec"]["template"]);
        self.inner
            .event(format!("rollout of {name} to {hash} begins"));
        loop {
            assert!(
                Instant::now() < deadline,
                "rollout of {name} not done within {within:?}: {:?}",
                self.pods_of(name)
            );
            let pods: Vec<Pod> = self
                .pods_of(name)
                .into_iter()
                .filter(|p| !p.terminating)
                .collect();
            let (new, old): (Vec<_>, Vec<_>) = pods.iter().partition(|p| p.template_hash == hash);
            let ready_new = new.iter().filter(|p| p.ready).count();
            let ready_all = pods.iter().filter(|p| p.ready).count();
            if old.is_empty() && ready_new >= replicas {
                break;
            }
            // An unready old pod goes at once (it counts for no availability), a ready one only
            // where enough stay ready, as the Deployment controller scales the old ReplicaSet.
            if let Some(victim) = old.iter().find(|p| !p.ready) {
                self.terminate(&victim.name);
                continue;
            }
            if let Some(victim) = old.first()
                && ready_all > replicas.saturating_sub(unavailable)
            {
                self.terminate(&victim.name);
                continue;
            }
            if pods.len() < replicas + surge && new.len() < replicas {
                self.inner.clone().start_pod(&d);
                continue;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.inner
            .event(format!("rollout of {name} to {hash} done"));
    }

    /// Delete the pod as the API server and kubelet do: out of the endpoints at once, SIGTERM,
    /// SIGKILL after the grace period; the Pod object goes when the process has exited.
    pub fn terminate(&self, pod: &str) {
        // The grace period first: it takes a kubectl call, and the lock blocks every resolver.
        let record = self.inner.pod(pod).expect("no such pod");
        let grace = self.inner.grace(&record);
        let pid = {
            let mut pods = self.inner.pods.lock().unwrap();
            let p = pods
                .iter_mut()
                .find(|p| p.name == pod)
                .expect("no such pod");
            p.terminating = true;
            p.pid
        };
        self.inner.event(format!("{pod} terminating"));
        let inner = self.inner.clone();
        let (name, ns) = (pod.to_string(), record.namespace.clone());
        std::thread::spawn(move || {
            let _ = inner.kubectl(&["delete", "pod", "-n", &ns, &name, "--wait=false"]);
        });
        // No pid yet: the supervisor sees `terminating` once it has one, and signals it then.
        if let Some(pid) = pid {
            self.inner.clone().stop_container(pod, pid, grace);
        }
    }

    /// Send `sig` to the pod's container process (e.g. SIGKILL for a crash).
    pub fn signal_pod(&self, pod: &str, sig: i32) {
        let pid = self
            .inner
            .pods
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.name == pod)
            .and_then(|p| p.pid)
            .expect("pod not running");
        self.inner.event(format!("{pod} sent signal {sig}"));
        signal(pid, sig);
    }

    /// Update every running pod's Secret volumes from the API, by the `..data` swap.
    pub fn refresh_secrets(&self) {
        for pod in self.pods() {
            if pod.terminating {
                continue;
            }
            let spec = self
                .inner
                .get_json(&["get", "pod", "-n", &pod.namespace, &pod.name]);
            for (vol, secret, mode) in secret_volumes(&spec["spec"]) {
                let dir = self.inner.volume_dir(&pod.uid, &vol);
                let data = self.inner.secret_data(&pod.namespace, &secret);
                if current_payload(&dir) != data {
                    write_atomic(&dir, &data, mode, fs_group(&spec["spec"]));
                    self.inner
                        .event(format!("{}: volume {vol} updated", pod.name));
                }
            }
        }
    }

    /// Wait until `pod` is ready.
    pub fn wait_ready(&self, pod: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let p = self.pods().into_iter().find(|p| p.name == pod);
            match p {
                Some(p) if p.ready => return,
                Some(_) => {}
                None => panic!("{pod} is gone; its log:\n{}", self.pod_log(pod)),
            }
            assert!(
                Instant::now() < deadline,
                "{pod} not ready within {within:?}; its log:\n{}",
                self.pod_log(pod)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until no pod of the Deployment is terminating (the old ones have exited).
    pub fn wait_terminated(&self, deployment: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while self.pods_of(deployment).iter().any(|p| p.terminating) {
            assert!(
                Instant::now() < deadline,
                "old pods of {deployment} still running after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stop every pod at once (SIGKILL) at the end of a test.
    pub fn shutdown(&self) {
        let pods = self.pods();
        for p in &pods {
            if let Some(pid) = p.pid {
                self.inner
                    .pods
                    .lock()
                    .unwrap()
                    .iter_mut()
                    .for_each(|q| q.terminating = true);
                signal(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output()
            .expect("kubectl")
    }

    fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> std::process::Output {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("kubectl stdin");
        child.wait_with_output().expect("kubectl")
    }

    fn get_json(&self, args: &[&str]) -> Value {
        let out = self.kubectl(&[args, &["-o", "json"]].concat());
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            text(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("kubectl's JSON")
    }

    fn event(&self, what: String) {
        self.events.lock().unwrap().push((Instant::now(), what));
    }

    fn grace(&self, pod: &Pod) -> Duration {
        let spec = self.get_json(&["get", "deployment", "-n", &pod.namespace, &pod.deployment]);
        Duration::from_secs(
            spec["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30),
        )
    }

    fn volume_dir(&self, uid: &str, volume: &str) -> PathBuf {
        self.dir.join("pods").join(uid).join("volumes").join(volume)
    }

    fn secret_data(&self, namespace: &str, name: &str) -> BTreeMap<String, Vec<u8>> {
        use base64::Engine as _;
        let s = self.get_json(&["get", "secret", "-n", namespace, name]);
        s["data"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap_or_default())
                    .expect("secret data is base64");
                (k.clone(), bytes)
            })
            .collect()
    }

    /// Create the Pod object of a new pod of Deployment `d` and start its supervisor; returns
    /// the pod's name.
    fn start_pod(self: Arc<Self>, d: &Value) -> String {
        let namespace = d["metadata"]["namespace"].as_str().unwrap().to_string();
        let deployment = d["metadata"]["name"].as_str().unwrap().to_string();
        let template = &d["spec"]["template"];
        let hash = template_hash(template);
        let name = format!("{deployment}-{hash}-{}", random_suffix());
        let mut labels: BTreeMap<String, String> =
            serde_json::from_value(template["metadata"]["labels"].clone()).unwrap_or_default();
        labels.insert("pod-template-hash".into(), hash.clone());
        let mut spec = template["spec"].clone();
        spec["nodeName"] = json!("handoff-test-node");
        let pod_obj = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace, "labels": labels,
                "annotations": template["metadata"]["annotations"].clone(),
            },
            "spec": spec,
        });
        let out = self.kubectl_stdin(&["create", "-o", "json", "-f", "-"], &pod_obj.to_string());
        assert!(
            out.status.success(),
            "create pod {name}: {}",
            text(&out.stderr)
        );
        let created: Value = serde_json::from_slice(&out.stdout).expect("pod JSON");
        let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
        let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
        let ip = Ipv4Addr::new(10, 244, (n / 250) as u8, (n % 250 + 2) as u8);
        let containers = spec["containers"].as_array().expect("containers");
        assert_eq!(
            containers.len(),
            1,
            "the stand-in kubelet runs pods of one container"
        );
        let container_ports = containers[0]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some((
                    p["name"].as_str()?.to_string(),
                    p["containerPort"].as_u64()? as u16,
                ))
            })
            .collect();
        self.pods.lock().unwrap().push(Pod {
            name: name.clone(),
            namespace: namespace.clone(),
            deployment,
            template_hash: hash,
            labels,
            ip,
            container_ports,
            ready: false,
            terminating: false,
            pid: None,
            restarts: 0,
            uid: uid.clone(),
        });
        self.event(format!("{name} created at {ip}"));
        let inner = self.clone();
        let pod_name = name.clone();
        std::thread::spawn(move || inner.supervise(&pod_name, &created));
        name
    }

    /// Run the pod's container until the pod is terminating, restarting it when it exits.
    fn supervise(self: Arc<Self>, pod: &str, obj: &Value) {
        let spec = &obj["spec"];
        let namespace = obj["metadata"]["namespace"].as_str().unwrap().to_string();
        let uid = obj["metadata"]["uid"].as_str().unwrap().to_string();
        let ip = self.pod(pod).map(|p| p.ip).expect("pod record");
        self.write_volumes(pod, &namespace, &uid, spec);
        let mut backoff = Duration::ZERO;
        loop {
            if self.pod(pod).is_none_or(|p| p.terminating) {
                break;
            }
            let mut child = self.start_container(pod, &namespace, &uid, ip, spec);
            let pid = child.id() as i32;
            self.update(pod, |p| p.pid = Some(pid));
            // Terminated while it was starting: `terminate` had no pid to signal.
            if let Some(p) = self.pod(pod).filter(|p| p.terminating) {
                let grace = self.grace(&p);
                self.clone().stop_container(pod, pid, grace);
            }
            let stop = Arc::new(AtomicBool::new(false));
            let prober = {
                let (inner, pod, stop, c) = (
                    self.clone(),
                    pod.to_string(),
                    stop.clone(),
                    spec["containers"][0].clone(),
                );
                std::thread::spawn(move || inner.probe(&pod, ip, &c, &stop))
            };
            let status = child.wait().expect("wait for the container");
            stop.store(true, Ordering::Relaxed);
            let _ = prober.join();
            self.update(pod, |p| {
                p.ready = false;
                p.pid = None;
            });
            self.event(format!("{pod} container exited ({status})"));
            if self.pod(pod).is_none_or(|p| p.terminating) {
                break;
            }
            self.update(pod, |p| p.restarts += 1);
            self.set_status(pod, &namespace, ip, false);
            // CrashLoopBackOff: the first restart at once, then 10 s, doubling.
            std::thread::sleep(backoff);
            backoff = (backoff * 2).max(Duration::from_secs(10));
        }
        let _ = self.kubectl(&[
            "delete",
            "pod",
            "-n",
            &namespace,
            pod,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]);
        self.pods.lock().unwrap().retain(|p| p.name != pod);
        self.event(format!("{pod} removed"));
    }

    /// SIGTERM, then SIGKILL after `grace` unless the container has exited by then (its pid is
    /// cleared when it does, so a pid reused meanwhile is never signalled).
    fn stop_container(self: Arc<Self>, pod: &str, pid: i32, grace: Duration) {
        signal(pid, libc::SIGTERM);
        let pod = pod.to_string();
        std::thread::spawn(move || {
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if self.pod(&pod).and_then(|p| p.pid) != Some(pid) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if self.pod(&pod).and_then(|p| p.pid) == Some(pid) {
                signal(pid, libc::SIGKILL);
            }
        });
    }

    fn pod(&self, name: &str) -> Option<Pod> {
        self.pods
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.name == name)
            .cloned()
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut Pod)) {
        if let Some(p) = self
            .pods
            .lock()
            .unwrap()
            .iter_mut()
            .find(|p| p.name == name)
        {
            f(p);
        }
    }

    /// The Secret volumes and the ServiceAccount token volume, written before the first start.
    fn write_volumes(&self, pod: &str, namespace: &str, uid: &str, spec: &Value) {
        let group = fs_group(spec);
        for (vol, secret, mode) in secret_volumes(spec) {
            let data = self.secret_data(namespace, &secret);
            write_atomic(&self.volume_dir(uid, &vol), &data, mode, group);
        }
        if spec["automountServiceAccountToken"] != json!(false) {
            let sa = spec["serviceAccountName"].as_str().unwrap_or("default");
            let request = json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 3607,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid},
                },
            });
            let out = self.kubectl_stdin(
                &[
                    "create",
                    "--raw",
                    &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token"),
                    "-f",
                    "-",
                ],
                &request.to_string(),
            );
            assert!(
                out.status.success(),
                "TokenRequest for {namespace}/{sa}: {}",
                text(&out.stderr)
            );
            let token: Value = serde_json::from_slice(&out.stdout).expect("TokenRequest JSON");
            let data = BTreeMap::from([
                (
                    "token".to_string(),
                    token["status"]["token"]
                        .as_str()
                        .expect("token")
                        .as_bytes()
                        .to_vec(),
                ),
                ("ca.crt".to_string(), self.api_ca_pem.as_bytes().to_vec()),
                ("namespace".to_string(), namespace.as_bytes().to_vec()),
            ]);
            write_atomic(
                &self.volume_dir(uid, "kube-api-access"),
                &data,
                0o644,
                group,
            );
        }
    }

    /// Start the container: a process in new network and mount namespaces, whose `eth0` (the
    /// pod's side of a veth pair) carries the pod's IP.
    fn start_container(
        &self,
        pod: &str,
        namespace: &str,
        uid: &str,
        ip: Ipv4Addr,
        spec: &Value,
    ) -> std::process::Child {
        let c = &spec["containers"][0];
        let sa = spec["serviceAccountName"].as_str().unwrap_or("default");
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOSTNAME".into(), pod.into()),
            ("HOME".into(), "/".into()),
            (
                "KUBERNETES_SERVICE_HOST".into(),
                KUBERNETES_SERVICE_IP.to_string(),
            ),
            ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), "443".into()),
        ];
        for e in c["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().expect("env name").to_string();
            let value = if let Some(v) = e["value"].as_str() {
                expand(v, &env)
            } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match path {
                    "metadata.name" => pod.to_string(),
                    "metadata.namespace" => namespace.to_string(),
                    "metadata.uid" => uid.to_string(),
                    "status.podIP" => ip.to_string(),
                    "spec.serviceAccountName" => sa.to_string(),
                    "spec.nodeName" => "handoff-test-node".to_string(),
                    other => panic!("the stand-in kubelet has no downward API field {other}"),
                }
            } else {
                panic!("env {name}: only value and valueFrom.fieldRef are supported here")
            };
            env.push((name, value));
        }
        let args: Vec<String> = c["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| expand(a.as_str().expect("arg"), &env))
            .collect();
        assert!(
            c["command"].is_null(),
            "the stand-in runs the image's entrypoint; this container overrides `command`"
        );

        // Mounts: each volume at its mountPath, on an overlay of the top directory it lies
        // in, so that the mount point can be made without touching the machine's own tree.
        let mut mounts: Vec<(PathBuf, String, bool)> = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                (
                    self.volume_dir(uid, m["name"].as_str().unwrap()),
                    m["mountPath"].as_str().unwrap().to_string(),
                    m["readOnly"] == json!(true),
                )
            })
            .collect();
        if spec["automountServiceAccountToken"] != json!(false) {
            mounts.push((
                self.volume_dir(uid, "kube-api-access"),
                SERVICE_ACCOUNT_MOUNT.to_string(),
                true,
            ));
        }
        let run_dir = self.dir.join("pods").join(uid).join("run");
        let _ = std::fs::remove_dir_all(&run_dir);
        std::fs::create_dir_all(&run_dir).expect("run dir");
        let mut script = String::from(
            "set -e\n\
             while ! ip link show eth0 >/dev/null 2>&1; do sleep 0.01; done\n\
             ip link set lo up\n",
        );
        // The overlays' upper and work folders on a tmpfs of the pod's own: an overlay cannot
        // take them from a filesystem that is itself an overlay (a container's /tmp).
        script.push_str(&format!("mount -t tmpfs tmpfs {}\n", run_dir.display()));
        script.push_str(&format!(
            "ip addr add {ip}/32 dev eth0\nip link set eth0 up\nip route add default dev eth0\n"
        ));
        let mut overlaid = Vec::new();
        for (src, target, ro) in &mounts {
            let real = real_mount_path(target);
            let top = top_dir(&real);
            if !overlaid.contains(&top) {
                let n = overlaid.len();
                let (upper, work) = (
                    run_dir.join(format!("upper{n}")),
                    run_dir.join(format!("work{n}")),
                );
                script.push_str(&format!(
                    "mkdir -p {} {}\n",
                    upper.display(),
                    work.display()
                ));
                script.push_str(&format!(
                    "mount -t overlay overlay -o lowerdir={top},upperdir={},workdir={} {top}\n",
                    upper.display(),
                    work.display()
                ));
                overlaid.push(top);
            }
            script.push_str(&format!(
                "mkdir -p {real}\nmount --bind {} {real}\n",
                src.display()
            ));
            if *ro {
                script.push_str(&format!("mount -o remount,bind,ro {real}\n"));
            }
        }
        let sc = &spec["securityContext"];
        let csc = &c["securityContext"];
        let uid_n = csc["runAsUser"].as_u64().or(sc["runAsUser"].as_u64());
        let gid_n = csc["runAsGroup"].as_u64().or(sc["runAsGroup"].as_u64());
        let mut setpriv = String::from("exec setpriv --pdeathsig KILL");
        if let Some(u) = uid_n {
            setpriv.push_str(&format!(" --reuid {u}"));
        }
        if let Some(g) = gid_n.or(uid_n) {
            setpriv.push_str(&format!(" --regid {g}"));
        }
        match fs_group(spec) {
            Some(g) => setpriv.push_str(&format!(" --groups {g}")),
            None => setpriv.push_str(" --clear-groups"),
        }
        script.push_str(&format!("{setpriv} -- \"$@\"\n"));

        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("pods").join(format!("{pod}.log")))
            .expect("pod log");
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--net",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .arg("sh")
        .arg(&self.image_bin)
        .args(&args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
        let child = spawn(cmd).expect("unshare (the pod)");
        let pid = child.id() as i32;
        self.attach_veth(pid, ip);
        self.event(format!("{pod} container started (pid {pid})"));
        child
    }

    /// Give the process's new network namespace its `eth0`, the node its route to the pod.
    fn attach_veth(&self, pid: i32, ip: Ipv4Addr) {
        let own = std::fs::read_link("/proc/self/ns/net").expect("own netns");
        let deadline = Instant::now() + Duration::from_secs(10);
        // `unshare` makes the namespace before it execs sh: wait for it, or the veth's far end
        // would land in the test's own namespace.
        while std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|n| n == own) {
            assert!(Instant::now() < deadline, "pid {pid} never left the netns");
            std::thread::sleep(Duration::from_millis(5));
        }
        let veth = format!("vh{}", self.next_veth.fetch_add(1, Ordering::Relaxed));
        let pid_s = pid.to_string();
        let ip_s = format!("{ip}/32");
        let node = NODE_IP.to_string();
        for args in [
            vec![
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &pid_s,
            ],
            vec!["link", "set", &veth, "up"],
            vec!["route", "replace", &ip_s, "dev", &veth, "src", &node],
        ] {
            let out = Command::new("ip").args(&args).output().expect("ip");
            assert!(out.status.success(), "ip {args:?}: {}", text(&out.stderr));
        }
        let _ = std::fs::write(format!("/proc/sys/net/ipv4/conf/{veth}/proxy_arp"), "1");
    }

    /// Readiness and liveness probes of one container run, until `stop`.
    fn probe(self: Arc<Self>, pod: &str, ip: Ipv4Addr, c: &Value, stop: &AtomicBool) {
        let readiness = ProbeSpec::from(&c["readinessProbe"]);
        let liveness = ProbeSpec::from(&c["livenessProbe"]);
        let start = Instant::now();
        let mut next_ready = readiness.as_ref().map(|p| start + p.initial_delay);
        let mut next_live = liveness.as_ref().map(|p| start + p.initial_delay);
        let (mut r_fail, mut r_ok, mut l_fail) = (0u32, 0u32, 0u32);
        if readiness.is_none() {
            self.update(pod, |p| p.ready = true);
        }
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if let (Some(p), Some(at)) = (&readiness, next_ready)
                && now >= at
            {
                next_ready = Some(at + p.period);
                let ok = p.run(ip, c);
                let was = self.pod(pod).is_some_and(|p| p.ready);
                if ok {
                    r_fail = 0;
                    r_ok += 1;
                } else {
                    r_ok = 0;
                    r_fail += 1;
                }
                let now_ready = if was {
                    r_fail < p.failure_threshold
                } else {
                    r_ok >= p.success_threshold
                };
                if now_ready != was && !stop.load(Ordering::Relaxed) {
                    self.update(pod, |p| p.ready = now_ready);
                    self.event(format!("{pod} ready={now_ready}"));
                    let (inner, pod, ns) = (
                        self.clone(),
                        pod.to_string(),
                        self.pod(pod).map(|p| p.namespace).unwrap_or_default(),
                    );
                    std::thread::spawn(move || inner.set_status(&pod, &ns, ip, now_ready));
                }
            }
            if let (Some(p), Some(at)) = (&liveness, next_live)
                && now >= at
            {
                next_live = Some(at + p.period);
                if p.run(ip, c) {
                    l_fail = 0;
                } else {
                    l_fail += 1;
                    if l_fail >= p.failure_threshold {
                        self.event(format!("{pod} liveness failed: restarting"));
                        if let Some(pid) = self.pod(pod).and_then(|p| p.pid) {
                            signal(pid, libc::SIGKILL);
                        }
                        l_fail = 0;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn set_status(&self, pod: &str, namespace: &str, ip: Ipv4Addr, ready: bool) {
        let ready_s = if ready { "True" } else { "False" };
        let status = json!({"status": {
            "phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
            "hostIP": NODE_IP.to_string(),
            "conditions": [
                {"type": "Ready", "status": ready_s},
                {"type": "ContainersReady", "status": ready_s},
            ],
        }});
        let _ = self.kubectl(&[
            "patch",
            "pod",
            "-n",
            namespace,
            pod,
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            &status.to_string(),
        ]);
    }
}

struct ProbeSpec {
    path: String,
    port: Value,
    https: bool,
    period: Duration,
    timeout: Duration,
    initial_delay: Duration,
    failure_threshold: u32,
    success_threshold: u32,
}

impl ProbeSpec {
    fn from(p: &Value) -> Option<ProbeSpec> {
        let get = p.get("httpGet")?;
        let secs = |k: &str, d: u64| Duration::from_secs(p[k].as_u64().unwrap_or(d));
        Some(ProbeSpec {
            path: get["path"].as_str().unwrap_or("/").to_string(),
            port: get["port"].clone(),
            https: get["scheme"] == json!("HTTPS"),
            period: secs("periodSeconds", 10),
            timeout: secs("timeoutSeconds", 1),
            initial_delay: secs("initialDelaySeconds", 0),
            failure_threshold: p["failureThreshold"].as_u64().unwrap_or(3) as u32,
            success_threshold: p["successThreshold"].as_u64().unwrap_or(1) as u32,
        })
    }

    /// One probe: a status in 200..400 within the timeout is a success.
    fn run(&self, ip: Ipv4Addr, c: &Value) -> bool {
        let port = match &self.port {
            Value::Number(n) => n.as_u64().unwrap_or(0) as u16,
            Value::String(name) => c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == json!(name))
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or(0) as u16,
            _ => 0,
        };
        http_status(
            SocketAddr::from((ip, port)),
            &self.path,
            self.https,
            self.timeout,
        )
        .is_some_and(|s| (200..400).contains(&s))
    }
}

/// `GET path` as the kubelet's prober sends it (HTTP/1.1, no certificate verification).
fn http_status(addr: SocketAddr, path: &str, https: bool, timeout: Duration) -> Option<u16> {
    let sock = TcpStream::connect_timeout(&addr, timeout).ok()?;
    sock.set_read_timeout(Some(timeout)).ok()?;
    sock.set_write_timeout(Some(timeout)).ok()?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.36\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    let mut raw = Vec::new();
    if https {
        let config = no_verify_config()?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
        let mut tls = rustls::StreamOwned::new(conn, sock);
        tls.write_all(request.as_bytes()).ok()?;
        let _ = tls.read_to_end(&mut raw);
    } else {
        let mut sock = sock;
        sock.write_all(request.as_bytes()).ok()?;
        let _ = sock.read_to_end(&mut raw);
    }
    String::from_utf8_lossy(&raw)
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// The leaf certificate (DER) a TLS server at `addr` presents.
pub fn peer_certificate(addr: SocketAddr) -> Option<Vec<u8>> {
    let config = no_verify_config()?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    sock.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).ok()?;
    }
    Some(conn.peer_certificates()?.first()?.to_vec())
}

fn no_verify_config() -> Option<rustls::ClientConfig> {
    Some(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify))
        .with_no_client_auth(),
    )
}

/// The kubelet's prober does not verify the serving certificate (`InsecureSkipVerify`).
#[derive(Debug)]
struct NoVerify;

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The Secret volumes of a pod spec: (volume name, Secret name, defaultMode).
fn secret_volumes(spec: &Value) -> Vec<(String, String, u32)> {
    spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let s = v.get("secret")?;
            Some((
                v["name"].as_str()?.to_string(),
                s["secretName"].as_str()?.to_string(),
                s["defaultMode"].as_u64().unwrap_or(0o644) as u32,
            ))
        })
        .collect()
}

fn fs_group(spec: &Value) -> Option<u32> {
    spec["securityContext"]["fsGroup"]
        .as_u64()
        .map(|g| g as u32)
}

/// The kubelet's AtomicWriter: the payload in a new `..<timestamp>` folder, `..data` swapped to
/// it by a rename, one symlink per key into `..data`, the old folder removed.
fn write_atomic(dir: &Path, data: &BTreeMap<String, Vec<u8>>, mode: u32, group: Option<u32>) {
    use std::os::unix::fs::symlink;
    std::fs::create_dir_all(dir).expect("volume dir");
    let stamp = format!("..{}", chrono_like_stamp(std::time::SystemTime::now()));
    let ts_dir = dir.join(&stamp);
    std::fs::create_dir_all(&ts_dir).expect("timestamped dir");
    for (k, v) in data {
        let f = ts_dir.join(k);
        std::fs::write(&f, v).expect("volume file");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).expect("chmod");
        if let Some(g) = group {
            chown_group(&f, g);
        }
    }
    if let Some(g) = group {
        chown_group(&ts_dir, g);
        chown_group(dir, g);
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&stamp, &tmp).expect("..data_tmp");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for k in data.keys() {
        let link = dir.join(k);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(format!("..data/{k}"), &link).expect("key symlink");
        }
    }
    if let Some(old) = old
        && old != Path::new(&stamp)
    {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
}

fn current_payload(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir.join("..data")) else {
        return out;
    };
    for e in entries.flatten() {
        if let Ok(bytes) = std::fs::read(e.path()) {
            out.insert(e.file_name().to_string_lossy().into_owned(), bytes);
        }
    }
    out
}

fn chown_group(p: &Path, g: u32) {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path; -1 keeps the owner.
    unsafe {
        libc::chown(c.as_ptr(), u32::MAX, g);
    }
}

/// `2026_12_01_10_41_57.123456789`, as the kubelet names its payload folders.
fn chrono_like_stamp(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let secs = d.as_secs();
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    format!(
        "{year:04}_{month:02}_{day:02}_{:02}_{:02}_{:02}.{:09}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// A mount path with its symlinked prefix resolved (`/var/run` is `/run` on most systems).
fn real_mount_path(target: &str) -> String {
    let mut existing = PathBuf::from(target);
    let mut rest = Vec::new();
    while std::fs::canonicalize(&existing).is_err() {
        rest.push(
            existing
                .file_name()
                .expect("a mount path under /")
                .to_owned(),
        );
        existing.pop();
    }
    let mut real = std::fs::canonicalize(&existing).expect("canonicalize");
    for r in rest.into_iter().rev() {
        real.push(r);
    }
    real.display().to_string()
}

/// `/etc/handoff/tls` → `/etc`.
fn top_dir(path: &str) -> String {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    format!("/{first}")
}

/// `$(VAR)` references expanded from `env` as the kubelet expands them in `args` and `env`
/// values; `$$` is a literal `$`; an unknown reference is left as written.
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn int_or_string(v: &Value, default: usize) -> usize {
    match v {
        Value::Number(n) => n.as_u64().unwrap_or(default as u64) as usize,
        Value::Null => default,
        other => panic!(
            "the stand-in Deployment controller takes integer surge/unavailable, not {other}"
        ),
    }
}

/// A short stable hash of the pod template, for the `pod-template-hash` label.
fn template_hash(template: &Value) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in template.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..10)
        .map(|i| ALPHABET[((h >> (i * 6)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

fn random_suffix() -> String {
    let mut bytes = [0u8; 5];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom");
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill has no memory preconditions.
    unsafe {
        libc::kill(pid, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_like_the_kubelet() {
        let env = vec![("POD_NAMESPACE".to_string(), "handoff-system".to_string())];
        assert_eq!(
            expand("$(POD_NAMESPACE)/handoff-pin", &env),
            "handoff-system/handoff-pin"
        );
        assert_eq!(expand("$$(POD_NAMESPACE)", &env), "$(POD_NAMESPACE)");
        assert_eq!(expand("$(NOPE)", &env), "$(NOPE)");
    }
}
