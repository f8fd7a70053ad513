//! The real Cluster API for the tests: `../shared/capi` runs the real clusterctl, core Cluster
//! API, kubeadm bootstrap (CABPK) and control-plane (KCP) managers and CAPD (its in-memory
//! backend fakes machines and workload clusters) on envtest kube-apiservers, from their own
//! rendered `config/default` manifests, with `podsim.py` as kubelet, Deployment controller and
//! kube-proxy. Every cluster lives in the calling test's network namespace (`netns.rs`), and
//! `down.sh` stops it when its `Mgmt` is dropped.
//!
//! What the tests read of it comes from the clusters themselves: watches (`kubectl get -w`) of
//! Leases, Pods, Deployments and Clusters, stamped with the wall clock as they arrive; the
//! managers' own logs (`DIR/podsim/logs/<pod>.log`); and server-side dry-run creates through
//! the providers' fail-closed webhooks.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::apiserver::{Handoff, kubectl_watch, text};

/// The provider namespaces, their Deployment, and its leader-election Lease (as the shipped
/// manifests name them).
pub const PROVIDERS: [(&str, &str, &str); 4] = [
    (
        "capi-system",
        "capi-controller-manager",
        "controller-leader-election-capi",
    ),
    (
        "capi-kubeadm-bootstrap-system",
        "capi-kubeadm-bootstrap-controller-manager",
        "kubeadm-bootstrap-manager-leader-election-capi",
    ),
    (
        "capi-kubeadm-control-plane-system",
        "capi-kubeadm-control-plane-controller-manager",
        "kubeadm-control-plane-manager-leader-election-capi",
    ),
    (
        "capd-system",
        "capd-controller-manager",
        "controller-leader-election-capd",
    ),
];

pub const WINDOW_HOLDER: &str = "handoff.dev/move-window/";
pub const HELD_BY: &str = "handoff.dev/held-by-window";
pub const BLOCK_MOVE: &str = "clusterctl.cluster.x-k8s.io/block-move";
pub const SAVED: &str = "handoff.dev/replicas-before-move";
pub const DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
/// What client-go's leader election logs on taking a Lease, lowercased.
pub const ACQUIRED: &str = "successfully acquired lease";

/// One manager's log line saying it acquired its Lease.
#[derive(Debug, Clone)]
pub struct Acquisition {
    /// The provider's Deployment (`PROVIDERS`).
    pub provider: &'static str,
    pub pod: String,
    pub line: String,
    /// Its klog time, seconds since the epoch.
    pub at: f64,
}

/// The provider whose Lease `line` says was acquired: its `lock="ns/name"`, or else the pod's
/// Deployment.
fn acquired_provider(pod: &str, line: &str) -> Option<&'static str> {
    let lock = line
        .split_once("lock=\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(lock, _)| lock);
    PROVIDERS
        .iter()
        .find(|(ns, dep, lease)| match lock {
            Some(lock) => lock == format!("{ns}/{lease}"),
            None => pod.starts_with(&format!("{dep}-")),
        })
        .map(|(_, dep, _)| *dep)
}

/// Seconds since the epoch, now.
pub fn wall() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The lock between `unpack.sh`, which rewrites the unpacked manifests, and `up.sh`, which
/// reads them: one process's unpack must not truncate a file that another's `up.sh` is reading.
fn rig_lock() -> PathBuf {
    std::env::temp_dir().join("handoff-capi-unpack.lock")
}

/// `../shared/capi` and its unpacked binaries.
pub struct Rig {
    pub scripts: PathBuf,
    /// `CAPI_ROOT`: bin/ and manifests/.
    pub root: PathBuf,
}

impl Rig {
    /// The rig, or `None` (one line on stderr) where `../shared/capi` is missing; under
    /// `HANDOFF_REQUIRE_APISERVER=1` a missing rig fails the test instead.
    pub fn find() -> Option<Rig> {
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/capi");
        let required = std::env::var("HANDOFF_REQUIRE_APISERVER").is_ok_and(|v| v == "1");
        if !scripts.join("up.sh").exists() {
            let why = format!("{} has no up.sh", scripts.display());
            assert!(!required, "HANDOFF_REQUIRE_APISERVER=1 but {why}");
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the real Cluster API tests need ../shared/capi ({why})"
            );
            return None;
        }
        static ROOT: OnceLock<PathBuf> = OnceLock::new();
        let root = ROOT
            .get_or_init(|| {
                // Under the rig's lock, held alone: the two suites of tests/capi run in
                // processes of their own at the same time, and unpack.sh copies the manifests
                // in place, which `up` reads (under the same lock, shared).
                let out = Command::new("flock")
                    .arg(rig_lock())
                    .arg(scripts.join("unpack.sh"))
                    .output()
                    .expect("flock (util-linux) running unpack.sh");
                assert!(out.status.success(), "unpack.sh: {}", text(&out.stderr));
                PathBuf::from(text(&out.stdout).trim())
            })
            .clone();
        Some(Rig { scripts, root })
    }

    pub fn clusterctl(&self) -> PathBuf {
        self.root.join("bin/clusterctl")
    }

    /// What clusterctl needs here: no version check (no internet), its config under the rig.
    pub fn clusterctl_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CLUSTERCTL_DISABLE_VERSIONCHECK", "true".into()),
            (
                "XDG_CONFIG_HOME",
                self.root.join("xdg").display().to_string(),
            ),
        ]
    }

    /// `handoff move` from `from` to `to` (kubeconfig paths), with clusterctl's environment.
    pub fn handoff_move(&self, from: &Path, to: &Path, ns: &str) -> Command {
        let mut cmd = self.handoff(&self.clusterctl(), &[]);
        cmd.arg("--kubeconfig")
            .arg(from)
            .arg("--to-kubeconfig")
            .arg(to)
            .args(["--namespace", ns]);
        cmd
    }

    /// `handoff move ARGS` running `clusterctl` (the rig's, or a stand-in that fails), with
    /// clusterctl's environment and no KUBECONFIG of the test's.
    pub fn handoff(&self, clusterctl: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_handoff"));
        cmd.arg("move")
            .args(args)
            .arg("--clusterctl")
            .arg(clusterctl)
            .env_remove("KUBECONFIG");
        for (k, v) in self.clusterctl_env() {
            cmd.env(k, v);
        }
        cmd
    }

    /// Management clusters, started in parallel (`up.sh DIR NAME`), with `env` for up.sh
    /// (leader-election settings, restart back-off).
    pub fn up(&self, dir: &Path, names: &[&'static str], env: &[(&str, &str)]) -> Vec<Mgmt> {
        let started: Vec<(&'static str, PathBuf, Child)> = names
            .iter()
            .map(|name| {
                let d = dir.join(name);
                let mut cmd = Command::new("flock");
                // --close: what up.sh leaves running (the API servers, podsim) must not hold
                // the lock on; flock itself holds it until up.sh returns.
                cmd.args(["--shared", "--close"])
                    .arg(rig_lock())
                    .arg(self.scripts.join("up.sh"))
                    .arg(&d)
                    .arg(name)
                    .env("CAPI_ROOT", &self.root)
                    .env("TZ", "UTC")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                for (k, v) in env {
                    cmd.env(k, v);
                }
                (*name, d, cmd.spawn().expect("up.sh"))
            })
            .collect();
        let mut out = Vec::new();
        for (name, d, child) in started {
            let o = child.wait_with_output().expect("up.sh");
            // Dropped (stopped) even when the next one failed.
            let m = Mgmt {
                name,
                dir: d.clone(),
                kubeconfig: PathBuf::from(text(&o.stdout).trim()),
                scripts: self.scripts.clone(),
                handoff: None,
            };
            assert!(o.status.success(), "up.sh {name}: {}", text(&o.stderr));
            eprintln!("{}", text(&o.stderr).trim_end());
            out.push(m);
        }
        out
    }
}

/// `kubectl --kubeconfig K ARGS`, with `stdin` written to it.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(s) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(s.as_bytes())
            .expect("write");
    }
    child.wait_with_output().expect("kubectl")
}

/// One management cluster of the rig.
pub struct Mgmt {
    pub name: &'static str,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    scripts: PathBuf,
    handoff: Option<Handoff>,
}

impl Mgmt {
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        kubectl(&self.kubeconfig, args, stdin)
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "{}: kubectl {args:?}: {}",
            self.name,
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    pub fn get(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(&[&["get"], args, &["-o", "json"]].concat())).expect("json")
    }

    /// Delete every MoveWindow, where the CRD is served (a window that brought it along takes
    /// it away again, and the API server stops serving the kind as it goes).
    pub fn delete_all_windows(&self) {
        let out = self.kubectl(&["delete", "movewindows", "--all"]);
        let why = text(&out.stderr);
        assert!(
            out.status.success() || why.contains("doesn't have a resource type"),
            "{}: deleting every MoveWindow: {why}",
            self.name
        );
    }

    /// Nothing of handoff in this cluster, where nothing of it was installed: no MoveWindow
    /// CRD, no admission policy, binding or webhook configuration of handoff's.
    pub fn nothing_of_handoff_at_all(&self) {
        // handoff's delete of the CRD returns while the API server's own finalizer
        // (`customresourcecleanup.apiextensions.k8s.io`) still removes what is left of the
        // kind: found at all, it must be being deleted, and then it goes.
        let crd = "crd/movewindows.handoff.dev";
        let find = || {
            let out = self.kubectl(&["get", crd, "-o", "json", "--ignore-not-found"]);
            assert!(out.status.success(), "{}: {}", self.name, text(&out.stderr));
            let json = text(&out.stdout);
            (!json.trim().is_empty()).then(|| serde_json::from_str::<Value>(&json).expect("json"))
        };
        if let Some(left) = find() {
            assert!(
                left["metadata"]["deletionTimestamp"].is_string(),
                "{}: the MoveWindow CRD outlived the move: {left}",
                self.name
            );
            super::apiserver::eventually(
                &format!("{}: the deleted MoveWindow CRD to go", self.name),
                Duration::from_secs(60),
                || find().is_none().then_some(()),
            );
        }
        for kind in [
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
            "mutatingadmissionpolicies",
            "mutatingadmissionpolicybindings",
            "validatingwebhookconfigurations",
            "mutatingwebhookconfigurations",
        ] {
            let left = self.ok(&["get", kind, "-o", "name"]);
            assert!(
                !left.contains("handoff"),
                "{}: {kind} left: {left}",
                self.name
            );
        }
    }

    /// `handoff serve` for this cluster, registered with the project's `local` overlay (the
    /// MoveWindow CRD and the webhook configurations, pointed at it).
    pub fn register_handoff(&mut self) {
        let mut h = Handoff::start_with_kubeconfig(&self.kubeconfig, &[]);
        let out = self.kubectl_stdin(&["apply", "-f", "-"], Some(&h.rendered_local_overlay()));
        assert!(
            out.status.success(),
            "{}: handoff's manifests: {}",
            self.name,
            text(&out.stderr)
        );
        h.wait_ready();
        self.handoff = Some(h);
    }

    /// Stop this cluster's `handoff serve`: its webhooks no longer answer (as when the
    /// handoff-pin Deployment is gone); `register_handoff` brings one back.
    pub fn stop_handoff(&mut self) {
        if let Some(mut h) = self.handoff.take() {
            h.stop();
        }
    }

    /// `workload.sh`: a workload cluster (KCP with one machine, a MachineDeployment with
    /// `workers`), returned running; `wait` on it.
    pub fn workload(&self, rig: &Rig, ns: &str, name: &str, workers: u32) -> Child {
        Command::new(rig.scripts.join("workload.sh"))
            .arg(&self.kubeconfig)
            .args([ns, name, &workers.to_string()])
            .env("CAPI_ROOT", &rig.root)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("workload.sh")
    }

    /// The manifest `workload.sh` applied for `ns/name` (clusterctl generate cluster).
    pub fn workload_yaml(&self, ns: &str, name: &str) -> PathBuf {
        self.kubeconfig
            .parent()
            .expect("kubeconfig folder")
            .join(format!("workload-{ns}-{name}.yaml"))
    }

    /// Every manager log line, as podsim keeps them (all restarts of each pod).
    pub fn manager_logs(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let dir = self.dir.join("podsim/logs");
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let pod = e
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".log")
                .to_string();
            for line in std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .lines()
            {
                out.push((pod.clone(), line.to_string()));
            }
        }
        out
    }

    /// Nothing of handoff's in this cluster: no Lease labelled or held by a window, no saved
    /// count, no handoff block-move, every window closed, every provider at its shipped count.
    pub fn nothing_of_handoff_left(&self, ns: &str) {
        for l in self.get(&["leases", "-A"])["items"].as_array().unwrap() {
            let holder = l["spec"]["holderIdentity"].as_str().unwrap_or("");
            assert!(
                l["metadata"]["labels"].get(HELD_BY).is_none()
                    && !holder.starts_with(WINDOW_HOLDER),
                "{}: {l}",
                self.name
            );
        }
        for d in self.get(&["deployments", "-A"])["items"]
            .as_array()
            .unwrap()
        {
            assert!(
                d["metadata"]["annotations"].get(SAVED).is_none(),
                "{}: {d}",
                self.name
            );
            if PROVIDERS
                .iter()
                .any(|(_, dep, _)| d["metadata"]["name"] == *dep)
            {
                assert_eq!(
                    d["spec"]["replicas"], 1,
                    "{}: {}",
                    self.name, d["metadata"]["name"]
                );
            }
        }
        // Where handoff was installed, its windows stay, closed; where a window brought the
        // CRD, it took it away again (`nothing_of_handoff_at_all`).
        if self.handoff.is_some() {
            for w in self.get(&["movewindows"])["items"].as_array().unwrap() {
                assert_eq!(w["spec"]["state"], "Closed", "{}: {w}", self.name);
            }
        }
        // No window's own webhook configuration outlives it.
        for c in self.get(&["mutatingwebhookconfigurations"])["items"]
            .as_array()
            .unwrap()
        {
            let name = c["metadata"]["name"].as_str().unwrap_or("");
            assert!(
                !name.starts_with("handoff-window-"),
                "{}: {name}",
                self.name
            );
        }
        for c in self.get(&["-n", ns, "clusters.cluster.x-k8s.io"])["items"]
            .as_array()
            .unwrap()
        {
            let block = c["metadata"]["annotations"][BLOCK_MOVE]
                .as_str()
                .unwrap_or("");
            assert!(!block.starts_with("handoff.dev/"), "{}: {c}", self.name);
        }
    }

    /// Stop this cluster's kube-apiserver (SIGTERM, then SIGKILL after 5 s) and
    /// start it again with the same arguments, port and etcd, as `start-apiserver.sh` launched
    /// it (its own session, the same log and pid file, so `down.sh` stops it). Returns once
    /// `/readyz` answers again, with how long it was gone.
    pub fn restart_apiserver(&self, down: Duration) -> Duration {
        let dir = self.dir.join("apiserver");
        let pid_file = dir.join("kube-apiserver.pid");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .expect("kube-apiserver.pid")
            .trim()
            .parse()
            .expect("a pid");
        let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
            .expect("kube-apiserver's command line")
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let started = std::time::Instant::now();
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
        };
        // SIGTERM, and SIGKILL after 5 s, as a kubelet restarting a static pod with a short
        // grace period does: left to drain, it waits out its 60 s request timeout for every
        // client still connected.
        for (sig, wait) in [(libc::SIGTERM, 5.0), (libc::SIGKILL, 30.0)] {
            // SAFETY: kill(2) of the kube-apiserver this cluster started, by its recorded pid.
            unsafe {
                libc::kill(pid, sig);
            }
            let t = std::time::Instant::now();
            while alive() && t.elapsed().as_secs_f64() < wait {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !alive() {
                break;
            }
        }
        std::thread::sleep(down);
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("kube-apiserver.log"))
            .expect("kube-apiserver.log");
        // --fork: the server is no child of ours (down.sh stops it by its pid file).
        let status = Command::new("setsid")
            .args(["--fork", "bash", "-c", "echo $$ >\"$0\"; exec \"$@\""])
            .arg(&pid_file)
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .status()
            .expect("setsid");
        assert!(
            status.success(),
            "{}: kube-apiserver again: {status}",
            self.name
        );
        // Generous: on a busy machine a kube-apiserver takes a minute and more to start.
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        loop {
            let out = self.kubectl(&["get", "--raw", "/readyz"]);
            if out.status.success() && text(&out.stdout).trim() == "ok" {
                return started.elapsed();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{}: kube-apiserver not ready again after 5 minutes: {}",
                self.name,
                text(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A merge patch of Lease `ns/name`, as an operator's `kubectl patch` sends it.
    pub fn patch_lease(&self, ns: &str, name: &str, merge: &str) -> Output {
        self.kubectl(&[
            "-n", ns, "patch", "lease", name, "--type", "merge", "-p", merge,
        ])
    }

    /// Whether the window holds every provider Lease now.
    pub fn window_holds_every_provider_lease(&self) -> bool {
        PROVIDERS.iter().all(|(ns, _, lease)| {
            self.get(&["-n", ns, "lease", lease])["spec"]["holderIdentity"]
                .as_str()
                .is_some_and(|h| h.starts_with(WINDOW_HOLDER))
        })
    }

    pub fn window_holds_any_provider_lease(&self) -> bool {
        PROVIDERS.iter().any(|(ns, _, lease)| {
            self.get(&["-n", ns, "lease", lease])["spec"]["holderIdentity"]
                .as_str()
                .is_some_and(|h| h.starts_with(WINDOW_HOLDER))
        })
    }

    /// Every time a manager logged acquiring its Lease, with its provider. client-go logs
    /// `"Successfully acquired lease" lock="ns/name"` (structured klog). Fails unless the logs
    /// show an acquisition for every provider (each acquired its Lease when it started): "no
    /// acquisition in an interval" proves nothing of a log that was not written, not read, or
    /// no longer says it this way.
    pub fn lease_acquisitions(&self) -> Vec<Acquisition> {
        let found: Vec<Acquisition> = self
            .manager_logs()
            .into_iter()
            .filter(|(_, line)| line.to_ascii_lowercase().contains(ACQUIRED))
            .map(|(pod, line)| {
                // An acquisition whose time cannot be read must not drop out of the count.
                let at = klog_time(&line).unwrap_or_else(|| {
                    panic!(
                        "{}: {pod}: an acquisition without a klog time: {line}",
                        self.name
                    )
                });
                let provider = acquired_provider(&pod, &line).unwrap_or_else(|| {
                    panic!(
                        "{}: {pod}: an acquisition of no provider's Lease: {line}",
                        self.name
                    )
                });
                Acquisition {
                    provider,
                    pod,
                    line,
                    at,
                }
            })
            .collect();
        let missing: Vec<&str> = PROVIDERS
            .iter()
            .map(|(_, dep, _)| *dep)
            .filter(|dep| !found.iter().any(|a| a.provider == *dep))
            .collect();
        assert!(
            missing.is_empty(),
            "{}: no manager log of {missing:?} says {ACQUIRED:?} (logs of {:?} in {}): an acquisition during the move would go unseen",
            self.name,
            self.manager_logs()
                .iter()
                .map(|(pod, _)| pod.as_str())
                .collect::<BTreeSet<_>>(),
            self.dir.join("podsim/logs").display()
        );
        found
    }

    /// Whether every provider Lease is held by a pod of its own Deployment now.
    pub fn providers_lead(&self) -> bool {
        PROVIDERS.iter().all(|(ns, dep, lease)| {
            self.get(&["-n", ns, "lease", lease])["spec"]["holderIdentity"]
                .as_str()
                .is_some_and(|h| h.starts_with(&format!("{dep}-")))
        })
    }

    /// What `clusterctl move` moves of namespace `ns`, as this cluster holds it: every object
    /// of the Cluster API types (the CRDs clusterctl discovers by their
    /// `clusterctl.cluster.x-k8s.io` label), every Secret and every ConfigMap (clusterctl
    /// moves those its graph reaches; a namespace of the rig holds no other: envtest runs no
    /// kube-controller-manager to publish `kube-root-ca.crt`).
    pub fn move_objects(&self, ns: &str) -> Vec<Value> {
        let crds = self.ok(&[
            "get",
            "crd",
            "-l",
            "clusterctl.cluster.x-k8s.io",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ]);
        let kinds: Vec<&str> = crds
            .split_whitespace()
            .filter(|n| !n.ends_with(".clusterctl.cluster.x-k8s.io"))
            .chain(["secrets", "configmaps"])
            .collect();
        self.get(&["-n", ns, &kinds.join(",")])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `ns/name` of the Cluster re-provisioned by this cluster's controllers: infrastructure
    /// provisioned, control plane initialized, Available, every Machine with a nodeRef.
    pub fn provisioned(&self, ns: &str, name: &str, machines: usize) -> Option<String> {
        let c = self.get(&["-n", ns, "clusters.cluster.x-k8s.io", name]);
        let s = &c["status"];
        let cond = |t: &str| {
            s["conditions"]
                .as_array()
                .and_then(|v| v.iter().find(|c| c["type"] == t))
                .map(|c| c["status"] == "True")
                .unwrap_or(false)
        };
        let nodes = self.get(&[
            "-n",
            ns,
            "machines.cluster.x-k8s.io",
            "-l",
            &format!("cluster.x-k8s.io/cluster-name={name}"),
        ])["items"]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter(|m| m["status"]["nodeRef"]["name"].is_string())
                    .count()
            })
            .unwrap_or(0);
        let ok = c["spec"]["paused"] != true
            && s["initialization"]["infrastructureProvisioned"] == true
            && s["initialization"]["controlPlaneInitialized"] == true
            && cond("ControlPlaneInitialized")
            && cond("Available")
            && nodes >= machines;
        ok.then(|| format!("{ns}/{name}: provisioned, Available, {nodes} nodeRefs"))
    }
}

impl Drop for Mgmt {
    fn drop(&mut self) {
        if let Some(mut h) = self.handoff.take() {
            h.stop();
        }
        let _ = Command::new(self.scripts.join("down.sh"))
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// One event of a watch: when it arrived (wall clock), its type and object.
#[derive(Debug, Clone)]
pub struct Event {
    pub at: f64,
    /// The earliest the change can have happened: `at` for one the watch delivered as it came;
    /// for a delete that a re-list found (it happened while the watch was broken: a
    /// kube-apiserver restart), the last moment the watch had delivered anything before.
    pub since: f64,
    pub kind: String,
    pub object: Value,
}

impl Event {
    pub fn key(&self) -> String {
        let m = &self.object["metadata"];
        format!(
            "{}/{}",
            m["namespace"].as_str().unwrap_or(""),
            m["name"].as_str().unwrap_or("")
        )
    }
}

/// `kubectl get RESOURCE -w --output-watch-events -o json`, every event kept with its arrival
/// time; it starts with the objects there are (`ADDED`).
pub struct Watch {
    pub what: String,
    events: Arc<Mutex<Vec<Event>>>,
    child: Child,
}

impl Watch {
    pub fn start(m: &Mgmt, args: &[&str]) -> Watch {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let child = kubectl_watch(
            &m.kubeconfig,
            args,
            Default::default(),
            move |kind, object| {
                let at = wall();
                sink.lock().unwrap().push(Event {
                    at,
                    since: at,
                    kind: kind.to_string(),
                    object,
                });
                true
            },
        );
        Watch {
            what: format!("{}: {}", m.name, args.join(" ")),
            events,
            child,
        }
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The holder of each Lease over time: `(at, namespace/name, holderIdentity)`, one entry per
/// change.
pub fn holders(w: &Watch) -> Vec<(f64, String, String)> {
    let mut last: std::collections::BTreeMap<String, String> = Default::default();
    let mut out = Vec::new();
    for e in w.events() {
        let holder = e.object["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let key = e.key();
        if last.get(&key) != Some(&holder) {
            last.insert(key.clone(), holder.clone());
            out.push((e.at, key, holder));
        }
    }
    out
}

/// Ready pods per namespace over time: `(at, namespace, ready pods)` after each pod event.
pub fn ready_pods(w: &Watch) -> Vec<(f64, String, usize)> {
    let mut ready: std::collections::BTreeMap<String, bool> = Default::default();
    let mut out = Vec::new();
    for e in w.events() {
        let key = e.key();
        let ns = key.split('/').next().unwrap_or("").to_string();
        let is_ready = e.kind != "DELETED"
            && e.object["metadata"]["deletionTimestamp"].is_null()
            && e.object["status"]["conditions"]
                .as_array()
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
        ready.insert(key, is_ready);
        let n = ready
            .iter()
            .filter(|(k, r)| **r && k.starts_with(&format!("{ns}/")))
            .count();
        out.push((e.at, ns, n));
    }
    out
}

/// A probe that failed: when, on which cluster, of which kind, and the error.
pub type Failed = (f64, String, String, String);

/// The Ready pods of namespace `ns` now.
pub fn ready_pod_names(m: &Mgmt, ns: &str) -> Vec<String> {
    m.get(&["-n", ns, "pods"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Server-side dry-run creates through every fail-closed webhook of the workload's kinds, one
/// object per cluster a tick, for as long as it runs: `(at, cluster, kind, error)` of each that
/// failed, and how many ran.
pub struct Prober {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(usize, Vec<Failed>)>>,
}

impl Prober {
    /// `objects`: JSON objects to dry-run create (name and namespace set), per cluster.
    pub fn start(clusters: Vec<(String, PathBuf, Vec<Value>)>) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut failed = Vec::new();
            let mut ran = 0;
            let mut i = 0usize;
            while !flag.load(Ordering::Relaxed) {
                for (name, kubeconfig, objects) in &clusters {
                    let o = &objects[i % objects.len()];
                    let out = kubectl(
                        kubeconfig,
                        &["create", "--dry-run=server", "-o", "name", "-f", "-"],
                        Some(&o.to_string()),
                    );
                    ran += 1;
                    if !out.status.success() {
                        failed.push((
                            wall(),
                            name.clone(),
                            o["kind"].as_str().unwrap_or("").to_string(),
                            text(&out.stderr),
                        ));
                    }
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(700));
            }
            (ran, failed)
        });
        Prober {
            stop,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> (usize, Vec<Failed>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().expect("thread").join().expect("prober")
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The objects of a workload manifest, renamed into `ns` as `probe-<kind>`: what a dry-run
/// create sends through each provider's webhooks without creating anything.
pub fn probe_objects(manifest: &Path, ns: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(manifest).expect("workload manifest");
    text.split("\n---")
        .filter_map(|doc| handoff::yaml::from_str::<Value>(doc).ok())
        .filter(|v| v.is_object() && v["kind"].is_string())
        .map(|mut v| {
            let kind = v["kind"].as_str().unwrap_or("").to_lowercase();
            v["metadata"]["namespace"] = Value::from(ns);
            v["metadata"]["name"] = Value::from(format!("probe-{kind}"));
            v
        })
        .collect()
}

/// A klog line's time (`I1201 21:47:16.123456 …`, UTC, this year) as seconds since the epoch.
pub fn klog_time(line: &str) -> Option<f64> {
    let head = line.get(1..21)?;
    let (md, time) = head.split_once(' ')?;
    let year = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y")
        .to_string();
    let ts: k8s_openapi::jiff::Timestamp =
        format!("{year}-{}-{}T{}Z", &md[..2], &md[2..4], time.trim())
            .parse()
            .ok()?;
    Some(ts.as_nanosecond() as f64 / 1e9)
}

/// Every kind `clusterctl move` moves out of a namespace: the namespaced types of the CRDs it
/// discovers by their `clusterctl.cluster.x-k8s.io` label (not its own inventory), at their
/// storage version, and Secrets and ConfigMaps (objectgraph.go's `getDiscoveryTypes`).
pub fn moved_kinds(m: &Mgmt) -> Vec<kube::core::ApiResource> {
    let crds = m.get(&["crd", "-l", "clusterctl.cluster.x-k8s.io"]);
    let mut kinds: Vec<kube::core::ApiResource> = crds["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["spec"]["group"] != "clusterctl.cluster.x-k8s.io"
                && c["spec"]["scope"] == "Namespaced"
        })
        .map(|c| {
            let spec = &c["spec"];
            let version = spec["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["storage"] == true)
                .and_then(|v| v["name"].as_str())
                .unwrap_or_else(|| panic!("{}: a CRD without a storage version: {c}", m.name));
            let gvk = kube::core::GroupVersionKind::gvk(
                spec["group"].as_str().unwrap_or(""),
                version,
                spec["names"]["kind"].as_str().unwrap_or(""),
            );
            kube::core::ApiResource::from_gvk_with_plural(
                &gvk,
                spec["names"]["plural"].as_str().unwrap_or(""),
            )
        })
        .collect();
    for (kind, plural) in [("Secret", "secrets"), ("ConfigMap", "configmaps")] {
        kinds.push(kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("", "v1", kind),
            plural,
        ));
    }
    kinds
}

/// Every object of every moved kind in one namespace of one cluster, watched (one watch per
/// kind: kubectl watches one kind at a time, so through kube-rs, on a thread of its own), each
/// event stamped with the wall clock as it arrives. The first listing's objects are `LISTED`;
/// after that `ADDED`, `MODIFIED`, `DELETED`. A watch that must list again (after its API
/// server restarted) reports what the new listing no longer holds as `DELETED` when the
/// listing ends, and what it holds new as `ADDED`.
pub struct MovedObjects {
    pub what: String,
    kinds: usize,
    events: Arc<Mutex<Vec<Event>>>,
    /// Which kinds finished their first listing.
    listed: Arc<Mutex<BTreeSet<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MovedObjects {
    pub fn start(m: &Mgmt, ns: &str) -> MovedObjects {
        Self::start_in(m, Some(ns))
    }

    /// Every moved kind in every namespace (a whole management cluster's move).
    pub fn start_all(m: &Mgmt) -> MovedObjects {
        Self::start_in(m, None)
    }

    fn start_in(m: &Mgmt, ns: Option<&str>) -> MovedObjects {
        let kinds = moved_kinds(m);
        assert!(
            kinds.iter().any(|k| k.kind == "Cluster") && kinds.len() > 10,
            "{}: the moved kinds: {:?}",
            m.name,
            kinds.iter().map(|k| &k.kind).collect::<Vec<_>>()
        );
        let events = Arc::new(Mutex::new(Vec::new()));
        let listed = Arc::new(Mutex::new(BTreeSet::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (kubeconfig, ns_owned, n) = (m.kubeconfig.clone(), ns.map(String::from), kinds.len());
        let (sink, lists) = (events.clone(), listed.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the watches");
            rt.block_on(async move {
                let kc = kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
                let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .expect("client config");
                let client = kube::Client::try_from(config).expect("client");
                let mut tasks = tokio::task::JoinSet::new();
                for ar in kinds {
                    let api = match &ns_owned {
                        Some(ns) => kube::Api::<kube::core::DynamicObject>::namespaced_with(
                            client.clone(),
                            ns,
                            &ar,
                        ),
                        None => kube::Api::all_with(client.clone(), &ar),
                    };
                    tasks.spawn(watch_kind(
                        api,
                        ar.group.clone(),
                        ar.kind.clone(),
                        sink.clone(),
                        lists.clone(),
                    ));
                }
                let _ = stopped.await;
                tasks.abort_all();
            });
        });
        MovedObjects {
            what: format!(
                "{}: every moved kind in {}",
                m.name,
                ns.unwrap_or("every namespace")
            ),
            kinds: n,
            events,
            listed,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Whether every kind's watch has listed what there was.
    pub fn listed(&self) -> bool {
        self.listed.lock().unwrap().len() == self.kinds
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// `Kind name` → the object, of what the events say there is at `at`.
    pub fn live_at(&self, at: f64) -> BTreeMap<String, Value> {
        let mut live = BTreeMap::new();
        for e in self.events().into_iter().filter(|e| e.at <= at) {
            if e.kind == "DELETED" {
                live.remove(&kind_name(&e.object));
            } else {
                live.insert(kind_name(&e.object), e.object);
            }
        }
        live
    }

    /// The first object of any moved kind created at or after `since`: when its `ADDED`
    /// arrived, and its `Kind name`.
    pub fn first_created(&self, since: f64) -> Option<(f64, String)> {
        self.events()
            .into_iter()
            .find(|e| e.kind == "ADDED" && e.at >= since)
            .map(|e| (e.at, kind_name(&e.object)))
    }
}

impl Drop for MovedObjects {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn kind_name(o: &Value) -> String {
    format!(
        "{} {}",
        o["kind"].as_str().unwrap_or(""),
        o["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// One kind's watch, for `MovedObjects`: a failed watch is retried every 200 ms (the API
/// server may be restarting), and every object keeps its `kind` (a listing's items have none).
async fn watch_kind(
    api: kube::Api<kube::core::DynamicObject>,
    group: String,
    kind: String,
    sink: Arc<Mutex<Vec<Event>>>,
    lists: Arc<Mutex<BTreeSet<String>>>,
) {
    use futures::StreamExt as _;
    use kube::runtime::watcher;
    let mut known: BTreeMap<String, Value> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Value>> = None;
    let mut first = true;
    // The last moment the watch delivered anything: a delete that a re-list finds happened
    // after it.
    let mut delivered = wall();
    let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
    while let Some(next) = stream.next().await {
        let push_since = |what: &str, object: Value, since: Option<f64>| {
            let at = wall();
            sink.lock().unwrap().push(Event {
                at,
                since: since.unwrap_or(at),
                kind: what.to_string(),
                object,
            })
        };
        let push = |what: &str, object: Value| push_since(what, object, None);
        let value = |o: kube::core::DynamicObject| {
            let mut v = serde_json::to_value(o).expect("an object as JSON");
            v["kind"] = Value::from(kind.as_str());
            v
        };
        let uid = |v: &Value| v["metadata"]["uid"].as_str().unwrap_or("").to_string();
        match next {
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(watcher::Event::Init) => listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(o)) => {
                let v = value(o);
                let what = match known.get(&uid(&v)) {
                    _ if first => Some("LISTED"),
                    None => Some("ADDED"),
                    Some(old)
                        if old["metadata"]["resourceVersion"]
                            != v["metadata"]["resourceVersion"] =>
                    {
                        Some("MODIFIED")
                    }
                    Some(_) => None,
                };
                if let Some(what) = what {
                    push(what, v.clone());
                }
                listing.get_or_insert_with(BTreeMap::new).insert(uid(&v), v);
            }
            Ok(watcher::Event::InitDone) => {
                let now = listing.take().unwrap_or_default();
                for (u, old) in &known {
                    if !now.contains_key(u) {
                        push_since("DELETED", old.clone(), Some(delivered));
                    }
                }
                delivered = wall();
                known = now;
                first = false;
                lists.lock().unwrap().insert(format!("{group}/{kind}"));
            }
            Ok(watcher::Event::Apply(o)) => {
                let v = value(o);
                let what = if known.contains_key(&uid(&v)) {
                    "MODIFIED"
                } else {
                    "ADDED"
                };
                known.insert(uid(&v), v.clone());
                push(what, v);
                delivered = wall();
            }
            Ok(watcher::Event::Delete(o)) => {
                let v = value(o);
                known.remove(&uid(&v));
                push("DELETED", v);
                delivered = wall();
            }
        }
    }
}

/// A move's copy, as the clusters saw it.
#[derive(Debug, Clone)]
pub struct Copy {
    /// When the first object of any moved kind was created in the target, and which.
    pub first_create: (f64, String),
    /// When the last of what the target received was deleted from the source, and which.
    pub last_delete: (f64, String),
    /// The earliest that last delete can have happened (`Event::since`): before `last_delete`
    /// where only a re-list after a kube-apiserver restart saw it.
    pub last_delete_since: f64,
}

/// The copy of a move that started at `since`: the first create in the target of an object of
/// any moved kind (clusterctl creates owners first, but which root comes first is its graph's
/// order, not the Cluster's), and, once the source holds none of what the target received, the
/// last of those deletes.
pub fn copy_seen(target: &MovedObjects, source: &MovedObjects, since: f64) -> Copy {
    let first_create = target.first_created(since).unwrap_or_else(|| {
        panic!(
            "{}: nothing created since +0 ({since}): {:?}",
            target.what,
            target
                .events()
                .iter()
                .map(|e| format!("{} {} at {:.1}", e.kind, kind_name(&e.object), e.at))
                .collect::<Vec<_>>()
        )
    });
    let received: BTreeSet<String> = target
        .events()
        .iter()
        .filter(|e| e.kind == "ADDED" && e.at >= since)
        .map(|e| kind_name(&e.object))
        .collect();
    let (last_delete, last_delete_since) = super::apiserver::eventually(
        &format!(
            "{}: none of the {} objects the target received left",
            source.what,
            received.len()
        ),
        Duration::from_secs(120),
        || {
            let left: Vec<String> = source
                .live_at(f64::INFINITY)
                .into_keys()
                .filter(|k| received.contains(k))
                .collect();
            if !left.is_empty() {
                return None;
            }
            source
                .events()
                .into_iter()
                .filter(|e| e.kind == "DELETED" && e.at >= since)
                .filter(|e| received.contains(&kind_name(&e.object)))
                .max_by(|a, b| a.at.total_cmp(&b.at))
                .map(|e| ((e.at, kind_name(&e.object)), e.since))
        },
    );
    Copy {
        first_create,
        last_delete,
        last_delete_since,
    }
}

/// The etcd revision of the write an event reports: one API server's writes are ordered by
/// it exactly, where the arrival times of two watches are not.
pub fn rv(e: &Event) -> u64 {
    e.object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion: {}", e.object))
}

/// Whether the window held every provider Lease of `m` at revision `at`: each Lease's last
/// write at or before it names the window as holder.
pub fn held_at(m: &Mgmt, leases: &Watch, at: u64) -> Result<(), String> {
    window_held_at(&leases.events(), at).map_err(|why| format!("{}: {why}", m.name))
}

/// `held_at` on one cluster's Lease events: ordered by that cluster's etcd revisions, never by
/// when the watch delivered them (two watches of one cluster deliver in their own time).
pub fn window_held_at(events: &[Event], at: u64) -> Result<(), String> {
    for (ns, _, lease) in PROVIDERS {
        let key = format!("{ns}/{lease}");
        let holder = events
            .iter()
            .filter(|e| e.key() == key && rv(e) <= at)
            .max_by_key(|e| rv(e))
            .map(|e| {
                e.object["spec"]["holderIdentity"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            });
        match holder {
            Some(h) if h.starts_with(WINDOW_HOLDER) => {}
            h => return Err(format!("Lease {key} at revision {at} was held by {h:?}")),
        }
    }
    Ok(())
}
