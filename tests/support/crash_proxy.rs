//! A proxy in front of each management cluster's real API server that kills `handoff move` on
//! cue: what a laptop lid or `kill -9` does, at a place a test names exactly.
//!
//! `handoff move` and the clusterctl it runs are given kubeconfigs for these proxies (clusterctl
//! gets handoff's `--kubeconfig` and `--to-kubeconfig`), and the proxies tell the two apart by
//! their User-Agent (client-go's starts with the binary's name). Every write either makes is
//! logged with a label that names what it writes, not which object (`PATCH leases in
//! target`), in one sequence over both clusters. A `Trigger` names a write; when it arrives the
//! proxy sends SIGKILL to handoff's pid, so that to both clusters handoff died right before
//! it (a write of handoff's is then not forwarded) or, for a write of clusterctl's, while
//! clusterctl was at it (forwarded: clusterctl dies by its PDEATHSIG a moment later, as it
//! would).
//!
//! Writes that arrive once the trigger has fired are kept apart (`late_writes`), with their time
//! since the kill: handoff is dead then, and clusterctl dies with it, so a write of clusterctl's
//! arriving well after the kill means a clusterctl copying with nobody supervising it.
//!
//! Everything else is the real server's; requests reach it as the admin.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt as _;

use super::proxy::{ForwardError, Out, Proxy, forward_bytes, relay, request_line, status};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Agent {
    Handoff,
    Clusterctl,
}

/// One write, as the proxies saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub agent: Agent,
    /// `source` or `target` (of the move running now).
    pub role: &'static str,
    /// `METHOD resource[/subresource] [what] in ROLE` (`what_of`).
    pub label: String,
    /// The step of `handoff move` (or of its backup or restore) that made it, as its
    /// User-Agent says (`handoff/<version> (move step StopTarget)`, `(backup step Stop)`);
    /// `None` for clusterctl's.
    pub step: Option<String>,
}

/// A write that arrived after the trigger had fired.
#[derive(Debug, Clone)]
pub struct LateWrite {
    pub agent: Agent,
    /// As sent, for the message (`-` where none was).
    pub user_agent: String,
    pub label: String,
    /// From the kill to the write's arrival at the proxy.
    pub after: Duration,
}

/// Where to kill handoff: at the `nth` (from 1) write of `agent` labelled `label`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    pub agent: Agent,
    pub label: String,
    pub nth: usize,
}

/// What the proxies do, and when: several may be armed at once, each acts once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cue {
    /// Kill handoff at this write (clusterctl dies with it, by its PDEATHSIG).
    Handoff(Trigger),
    /// Kill clusterctl alone while it is at this write: handoff lives, and sees its clusterctl
    /// end by a signal (what an OOM kill of clusterctl does).
    ClusterctlAlone(Trigger),
    /// Kill handoff right before its first write in the `k`-th (from 1) distinct step of
    /// `steps` it writes in: a re-run's or an `--abort`'s own steps, whichever the state it
    /// found makes it take.
    KthStep { steps: Vec<&'static str>, k: usize },
    /// Kill handoff at the `nth` write of `agent`, whatever it writes.
    NthOf { agent: Agent, nth: usize },
}

impl Cue {
    fn describe(&self) -> String {
        match self {
            Cue::Handoff(t) => format!("handoff at {} #{}", t.label, t.nth),
            Cue::ClusterctlAlone(t) => format!("clusterctl alone at {} #{}", t.label, t.nth),
            Cue::KthStep { steps, k } if steps.len() == 1 => {
                format!("handoff at step {}", steps[0])
            }
            Cue::KthStep { k, .. } => format!("handoff at its own step #{k}"),
            Cue::NthOf { agent, nth } => format!("handoff at {agent:?}'s write #{nth}"),
        }
    }
}

/// One armed cue and what it has counted.
#[derive(Debug)]
struct Armed {
    cue: Cue,
    seen: usize,
    steps: Vec<String>,
    done: bool,
}

impl Armed {
    /// Whether `w` is the write this cue acts at.
    fn hits(&mut self, w: &Write) -> bool {
        if self.done {
            return false;
        }
        let hit = match &self.cue {
            Cue::Handoff(t) | Cue::ClusterctlAlone(t) => {
                if t.agent == w.agent && t.label == w.label {
                    self.seen += 1;
                }
                self.seen == t.nth
            }
            Cue::NthOf { agent, nth } => {
                if *agent == w.agent {
                    self.seen += 1;
                }
                self.seen == *nth
            }
            Cue::KthStep { steps, k } => match &w.step {
                Some(s)
                    if w.agent == Agent::Handoff
                        && steps.contains(&s.as_str())
                        && !self.steps.contains(s) =>
                {
                    self.steps.push(s.clone());
                    self.steps.len() == *k
                }
                _ => false,
            },
        };
        self.done = hit;
        hit
    }
}

#[derive(Default)]
struct Shared {
    log: Mutex<Vec<Write>>,
    armed: Mutex<Vec<Armed>>,
    /// The cues that acted, in order, with the write each acted at.
    acted: Mutex<Vec<(Cue, Write)>>,
    victim: AtomicI32,
    fired: AtomicBool,
    killed_at: Mutex<Option<Instant>>,
    late: Mutex<Vec<LateWrite>>,
    /// Which cluster is which in the move running now: proxy index → role.
    roles: Mutex<[&'static str; 2]>,
}

/// Two proxies, one per management cluster, sharing one log and one trigger.
pub struct CrashProxies {
    shared: Arc<Shared>,
    proxies: Vec<Proxy>,
    pub kubeconfigs: Vec<PathBuf>,
}

/// `METHOD resource[/subresource]` of an API path: `/api/v1/namespaces/ns/pods/p` → `pods`,
/// `/apis/g/v/namespaces/ns/deployments/d/scale` → `deployments/scale`, a namespace → `namespaces`.
pub fn resource_of(path: &str) -> String {
    let path = path.split('?').next().unwrap_or(path);
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.first() {
        Some(&"api") => parts.get(2..),
        Some(&"apis") => parts.get(3..),
        _ => None,
    }
    .unwrap_or(&[]);
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    match rest {
        [resource] | [resource, _] => resource.to_string(),
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
        [] => path.to_string(),
    }
}

impl CrashProxies {
    /// One proxy per admin kubeconfig (parsed now, on the caller's thread), its kubeconfig in
    /// `dir`.
    pub fn start(admin_kubeconfigs: [&Path; 2], dir: &Path) -> CrashProxies {
        let shared = Arc::new(Shared {
            roles: Mutex::new(["source", "target"]),
            ..Shared::default()
        });
        let mut proxies = Vec::new();
        let mut kubeconfigs = Vec::new();
        for (i, admin) in admin_kubeconfigs.into_iter().enumerate() {
            let kubeconfig = kube::config::Kubeconfig::read_from(admin).expect("admin kubeconfig");
            let s = shared.clone();
            let proxy = Proxy::start(kubeconfig, false, move |req, client| {
                handle(req, client, s.clone(), i)
            });
            kubeconfigs.push(proxy.write_kubeconfig(
                &dir.join(format!("crash-proxy-{i}.kubeconfig")),
                &proxy.url(),
                None,
            ));
            proxies.push(proxy);
        }
        CrashProxies {
            shared,
            proxies,
            kubeconfigs,
        }
    }

    /// The move about to run goes from cluster `source` (0 or 1) to the other one.
    pub fn set_source(&self, source: usize) {
        *self.shared.roles.lock().unwrap() = match source {
            0 => ["source", "target"],
            _ => ["target", "source"],
        };
    }

    /// Kill `pid` at `trigger` (counted from now), or never.
    pub fn arm(&self, trigger: Option<Trigger>, pid: i32) {
        self.arm_cues(trigger.into_iter().map(Cue::Handoff).collect(), pid);
    }

    /// Act on `cues` (counted from now), `pid` being handoff's.
    pub fn arm_cues(&self, cues: Vec<Cue>, pid: i32) {
        self.shared.victim.store(pid, Ordering::SeqCst);
        self.shared.fired.store(false, Ordering::SeqCst);
        *self.shared.killed_at.lock().unwrap() = None;
        self.shared.late.lock().unwrap().clear();
        self.shared.acted.lock().unwrap().clear();
        *self.shared.armed.lock().unwrap() = cues
            .into_iter()
            .map(|cue| Armed {
                cue,
                seen: 0,
                steps: Vec::new(),
                done: false,
            })
            .collect();
    }

    /// Kill nobody from now on; what the last cues did (`fired`, `acted`, `late_writes`) stays.
    pub fn disarm(&self) {
        self.shared.victim.store(0, Ordering::SeqCst);
        self.shared.armed.lock().unwrap().clear();
    }

    /// Whether a cue killed handoff.
    pub fn fired(&self) -> bool {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// The cues that acted since they were armed, each with the write it acted at.
    pub fn acted(&self) -> Vec<(String, Write)> {
        self.shared
            .acted
            .lock()
            .unwrap()
            .iter()
            .map(|(c, w)| (c.describe(), w.clone()))
            .collect()
    }

    /// The writes that arrived after the armed trigger fired, in order of arrival.
    pub fn late_writes(&self) -> Vec<LateWrite> {
        self.shared.late.lock().unwrap().clone()
    }

    /// Every write so far, and a fresh log.
    pub fn take_log(&self) -> Vec<Write> {
        std::mem::take(&mut *self.shared.log.lock().unwrap())
    }
}

/// What a write writes, for its label: the object where its name is stable across runs (a
/// Lease, a Deployment, a Cluster; a Pod's is random, its namespace is not), and for a
/// MoveWindow's status the step and phases it records. Empty for the rest.
fn what_of(resource: &str, path: &str, body: &[u8]) -> String {
    let path = path.split('?').next().unwrap_or(path);
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let ns = parts
        .iter()
        .position(|p| *p == "namespaces")
        .and_then(|i| parts.get(i + 1))
        .copied()
        .unwrap_or("");
    match resource {
        "movewindows/status" => {
            let s: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let s = &s["status"];
            format!(
                " ({}, move {}: {})",
                s["phase"].as_str().unwrap_or("-"),
                s["move"]["phase"].as_str().unwrap_or("-"),
                s["lastStep"].as_str().unwrap_or("-")
            )
        }
        "pods" => format!(" {ns}"),
        "leases" | "deployments" | "deployments/scale" | "clusters" => {
            let name = path.rsplit('/').next().unwrap_or("");
            let name = match resource {
                "deployments/scale" => parts.iter().rev().nth(1).copied().unwrap_or(""),
                _ => name,
            };
            format!(" {ns}/{name}")
        }
        _ => String::new(),
    }
}

async fn handle(
    req: http::Request<hyper::body::Incoming>,
    client: kube::Client,
    shared: Arc<Shared>,
    index: usize,
) -> Out {
    let (method, target, write) = request_line(&req);
    let resource = resource_of(&target);
    // Reviews and dry runs change nothing: no crash point.
    let write = write && !resource.ends_with("reviews") && !target.contains("dryRun=");
    let arrived = Instant::now();
    // clusterctl's client-go sends `clusterctl/<version> …`; handoff `handoff/<version>`, with
    // the step it performs (`window::user_agent`).
    let user_agent = req
        .headers()
        .get(http::header::USER_AGENT)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let agent = match &user_agent {
        Some(ua) if ua.starts_with("clusterctl") => Agent::Clusterctl,
        _ => Agent::Handoff,
    };
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(503, "ServiceUnavailable", &e.to_string()),
    };
    if write && shared.fired.load(Ordering::SeqCst) {
        let role = shared.roles.lock().unwrap()[index];
        let killed_at = shared.killed_at.lock().unwrap().unwrap_or(arrived);
        let late = LateWrite {
            agent,
            user_agent: user_agent.clone().unwrap_or_else(|| "-".into()),
            label: format!(
                "{method} {} in {role}",
                target.split('?').next().unwrap_or(&target)
            ),
            after: arrived.saturating_duration_since(killed_at),
        };
        eprintln!(
            "crash proxy: a write {:.3}s after the kill: {:?} ({}) {}",
            late.after.as_secs_f64(),
            late.agent,
            late.user_agent,
            late.label
        );
        shared.late.lock().unwrap().push(late);
    } else if write {
        let role = shared.roles.lock().unwrap()[index];
        let what = match agent {
            Agent::Handoff => what_of(&resource, &target, &body),
            Agent::Clusterctl => String::new(),
        };
        let step = user_agent
            .as_deref()
            .and_then(|ua| ua.split_once(" step ")?.1.split(')').next())
            .map(str::to_string);
        let w = Write {
            agent,
            role,
            label: format!("{method} {resource}{what} in {role}"),
            step,
        };
        let hit = shared
            .armed
            .lock()
            .unwrap()
            .iter_mut()
            .find_map(|a| a.hits(&w).then(|| a.cue.clone()));
        shared.log.lock().unwrap().push(w.clone());
        let pid = shared.victim.load(Ordering::SeqCst);
        match hit {
            Some(cue @ Cue::ClusterctlAlone(_)) if pid > 0 => {
                // handoff's children are its clusterctl alone.
                for child in children_of(pid) {
                    // SAFETY: kill(2) of a child of the test's own child, by pid.
                    unsafe {
                        libc::kill(child, libc::SIGKILL);
                    }
                }
                shared.acted.lock().unwrap().push((cue, w));
            }
            Some(cue) if pid > 0 => {
                *shared.killed_at.lock().unwrap() = Some(Instant::now());
                // SAFETY: kill(2) of the test's own child, by pid.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                shared.fired.store(true, Ordering::SeqCst);
                shared.acted.lock().unwrap().push((cue, w));
                if agent == Agent::Handoff {
                    return status(503, "ServiceUnavailable", "killed before this write");
                }
            }
            _ => {}
        }
    }
    match forward_bytes(&client, &parts, &target, body).await {
        Ok(response) => relay(response, std::future::pending()),
        Err(ForwardError::Body(e)) => status(503, "ServiceUnavailable", &e),
        Err(ForwardError::Send(e)) => status(503, "ServiceUnavailable", &e),
    }
}

/// The processes whose parent is `pid` (`/proc/<p>/stat`'s fourth field).
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // After the command's `(name)`, which may hold spaces: state, then the parent.
            let ppid: i32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(p)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::resource_of;

    #[test]
    fn names_the_resource_not_the_object() {
        for (path, want) in [
            (
                "/apis/coordination.k8s.io/v1/namespaces/capi-system/leases/l",
                "leases",
            ),
            (
                "/apis/apps/v1/namespaces/x/deployments/d/scale?fieldManager=h",
                "deployments/scale",
            ),
            (
                "/apis/handoff.dev/v1alpha1/movewindows/w/status",
                "movewindows/status",
            ),
            ("/apis/handoff.dev/v1alpha1/movewindows", "movewindows"),
            ("/api/v1/namespaces/ns1/pods/p", "pods"),
            ("/api/v1/namespaces/ns1", "namespaces"),
            ("/api/v1/namespaces", "namespaces"),
            ("/api/v1/namespaces/ns1/secrets", "secrets"),
        ] {
            assert_eq!(resource_of(path), want, "{path}");
        }
    }
}
