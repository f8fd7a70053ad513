//! Load through the API server at a fixed rate, every answer classified: requests the webhooks
//! must hold, and requests they must never touch, each asked in turn.
//!
//! - `SyncerDeleteHeld`: the sync target deletes a ConfigMap in a namespace carrying its sync
//!   finalizer: must be denied by `sync-finalizer.handoff.dev`;
//! - `SyncerDeleteFree`: the same sync target, a namespace without the finalizer: must pass;
//! - `AdminDeleteHeld`: an admin deletes in the held namespace: must pass;
//! - `AppScale`: an application's Deployment scaled (the scale subresource): must pass unchanged;
//! - `ControllerScale`: a Cluster API controller scaled inside an open MoveWindow: must come
//!   back pinned at 0;
//! - `Baseline`: the ConfigMap creates that the deletes need, which no webhook of handoff's sees:
//!   the API server's own latency, for comparison.
//!
//! A request is sent on its tick whatever the earlier ones are doing (each is its own task), so
//! a slow webhook shows up as latency, not as a lower rate.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    SyncerDeleteHeld,
    SyncerDeleteFree,
    AdminDeleteHeld,
    AppScale,
    ControllerScale,
    Baseline,
}

impl Class {
    const ROTATION: [Class; 5] = [
        Class::SyncerDeleteHeld,
        Class::SyncerDeleteFree,
        Class::AdminDeleteHeld,
        Class::AppScale,
        Class::ControllerScale,
    ];

    /// Whether handoff must change this request's fate (deny or pin it).
    pub fn guarded(self) -> bool {
        matches!(self, Class::SyncerDeleteHeld | Class::ControllerScale)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answered as the rules say.
    Right,
    /// Answered, wrongly: a guarded request let through, or an unguarded one refused or changed.
    Wrong(String),
    /// The API server could not get an answer from the webhook ("failed calling webhook",
    /// a timeout): refused, since the webhooks fail closed, but not by a decision.
    WebhookFailed(String),
    /// Anything else (the API server itself, a conflict): reported, not counted against handoff.
    Other(String),
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub class: Class,
    /// When it was sent, from the start of the load.
    pub at: Duration,
    pub latency: Duration,
    pub outcome: Outcome,
}

/// Where the load goes: the namespaces and objects `prepare` made.
#[derive(Debug, Clone)]
pub struct Targets {
    pub held_namespace: String,
    pub free_namespace: String,
    pub app: (String, String),
    pub controller: (String, String),
}

pub struct Load {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub started: Instant,
}

impl Load {
    /// Start sending `per_second` requests a second: `admin` as cluster-admin, `syncer` the
    /// sync target's identity.
    pub fn start(
        admin: kube::Config,
        syncer: kube::Config,
        targets: Targets,
        per_second: u32,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let (s, out) = (stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(run(admin, syncer, targets, per_second, s, out, started));
        });
        Load {
            stop,
            samples,
            thread: Some(thread),
            started,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stop sending; wait for the answers still due.
    pub fn stop(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut s = self.samples.lock().unwrap().clone();
        s.sort_by_key(|s| s.at);
        s
    }
}

async fn run(
    admin: kube::Config,
    syncer: kube::Config,
    t: Targets,
    per_second: u32,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Vec<Sample>>>,
    started: Instant,
) {
    let admin = kube::Client::try_from(admin).expect("admin client");
    let syncer = kube::Client::try_from(syncer).expect("syncer client");
    let t = Arc::new(t);
    let seq = Arc::new(AtomicU64::new(0));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let class = Class::ROTATION[n % Class::ROTATION.len()];
        n += 1;
        let (admin, syncer, t, out, seq) = (
            admin.clone(),
            syncer.clone(),
            t.clone(),
            out.clone(),
            seq.clone(),
        );
        tasks.spawn(async move {
            let id = seq.fetch_add(1, Ordering::Relaxed);
            for s in one(class, id, &admin, &syncer, &t, started).await {
                out.lock().unwrap().push(s);
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// One request of `class` (and the create it needs first, as a `Baseline` sample).
async fn one(
    class: Class,
    id: u64,
    admin: &kube::Client,
    syncer: &kube::Client,
    t: &Targets,
    started: Instant,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut timed = |class, sent: Instant, outcome| {
        samples.push(Sample {
            class,
            at: sent.duration_since(started),
            latency: sent.elapsed(),
            outcome,
        })
    };
    match class {
        Class::SyncerDeleteHeld => {
            let cms: Api<ConfigMap> = Api::namespaced(syncer.clone(), &t.held_namespace);
            let sent = Instant::now();
            let r = cms.delete("held", &DeleteParams::default()).await;
            let outcome = match r {
                Ok(_) => Outcome::Wrong("a held delete was admitted".into()),
                Err(e) => classify_denial(&e, "sync-finalizer.handoff.dev"),
            };
            timed(class, sent, outcome.clone());
            if matches!(outcome, Outcome::Wrong(_)) {
                let _ = create_cm(admin, &t.held_namespace, "held").await;
            }
        }
        Class::SyncerDeleteFree | Class::AdminDeleteHeld => {
            let (ns, who) = if class == Class::SyncerDeleteFree {
                (&t.free_namespace, syncer)
            } else {
                (&t.held_namespace, admin)
            };
            let name = format!("load-{id}");
            let sent = Instant::now();
            let created = create_cm(admin, ns, &name).await;
            timed(
                Class::Baseline,
                sent,
                match &created {
                    Ok(()) => Outcome::Right,
                    Err(e) => Outcome::Other(e.clone()),
                },
            );
            if created.is_err() {
                return samples;
            }
            let cms: Api<ConfigMap> = Api::namespaced(who.clone(), ns);
            let sent = Instant::now();
            let outcome = match cms.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Outcome::Right,
                Err(e) => classify_refusal(&e),
            };
            timed(class, sent, outcome);
        }
        Class::AppScale | Class::ControllerScale => {
            let (ns, name) = if class == Class::AppScale {
                &t.app
            } else {
                &t.controller
            };
            let want = (id % 3 + 1) as i32;
            let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
            let sent = Instant::now();
            let r = deployments
                .patch_scale(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": want}})),
                )
                .await;
            let outcome = match r {
                Ok(scale) => {
                    let got = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
                    match (class, got) {
                        (Class::AppScale, g) if g == want => Outcome::Right,
                        (Class::AppScale, g) => Outcome::Wrong(format!(
                            "an application scaled to {want} came back at {g}"
                        )),
                        (_, 0) => Outcome::Right,
                        (_, g) => Outcome::Wrong(format!(
                            "a controller scaled in an open window came back at {g}, not 0"
                        )),
                    }
                }
                Err(e) => classify_refusal(&e),
            };
            timed(class, sent, outcome);
        }
        Class::Baseline => unreachable!("baseline samples come with the deletes"),
    }
    samples
}

async fn create_cm(admin: &kube::Client, ns: &str, name: &str) -> Result<(), String> {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name}, "data": {"k": "v"},
    }))
    .expect("ConfigMap");
    match cms.create(&PostParams::default(), &cm).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// A guarded request's error: only the rule's own denial is right. A denial by the same webhook
/// for another reason (its deadline, a namespace it could not read) is handoff failing closed,
/// which is no decision: counted with the failed calls.
fn classify_denial(e: &kube::Error, webhook: &str) -> Outcome {
    let msg = e.to_string();
    let by_webhook = msg.contains(&format!(
        "admission webhook \"{webhook}\" denied the request"
    ));
    if by_webhook && msg.contains(HELD_DENIAL) {
        Outcome::Right
    } else if by_webhook {
        Outcome::WebhookFailed(msg)
    } else {
        failed_or_other(msg)
    }
}

/// What the guard's denial of a delete under a namespace's sync finalizer says.
const HELD_DENIAL: &str = "carries the sync finalizer";

/// An unguarded request's error: a denial by handoff is wrong.
fn classify_refusal(e: &kube::Error) -> Outcome {
    let msg = e.to_string();
    if msg.contains("handoff.dev\" denied the request") {
        Outcome::Wrong(msg)
    } else {
        failed_or_other(msg)
    }
}

fn failed_or_other(msg: String) -> Outcome {
    if msg.contains("failed calling webhook")
        || msg.contains("context deadline exceeded")
        || msg.contains("Timeout")
    {
        Outcome::WebhookFailed(msg)
    } else {
        Outcome::Other(msg)
    }
}

/// Counts and latencies of one stretch of samples.
#[derive(Debug, Default)]
pub struct Tally {
    pub sent: usize,
    pub right: usize,
    pub wrong: Vec<String>,
    pub failed: Vec<String>,
    pub other: Vec<String>,
    latencies_ms: Vec<f64>,
}

impl Tally {
    pub fn add(&mut self, s: &Sample) {
        self.sent += 1;
        self.latencies_ms.push(s.latency.as_secs_f64() * 1000.0);
        match &s.outcome {
            Outcome::Right => self.right += 1,
            Outcome::Wrong(w) => {
                self.wrong
                    .push(format!("{:?} at {:.1}s: {w}", s.class, s.at.as_secs_f64()))
            }
            Outcome::WebhookFailed(w) => {
                self.failed
                    .push(format!("{:?} at {:.1}s: {w}", s.class, s.at.as_secs_f64()))
            }
            Outcome::Other(w) => {
                self.other
                    .push(format!("{:?} at {:.1}s: {w}", s.class, s.at.as_secs_f64()))
            }
        }
    }

    /// The `q`-quantile latency in milliseconds (nearest rank).
    pub fn quantile(&self, q: f64) -> f64 {
        if self.latencies_ms.is_empty() {
            return 0.0;
        }
        let mut v = self.latencies_ms.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    }
}

/// The report: per class, and during vs outside the disturbances (`windows`, in load time).
pub struct Report {
    pub by_class: BTreeMap<Class, Tally>,
    pub during: BTreeMap<bool, Tally>,
    pub baseline: BTreeMap<bool, Tally>,
    pub all: Tally,
    /// Failed calls that were in flight when a replica was killed (`crash_at`): a crash takes
    /// them with it, and `failurePolicy: Fail` refuses them. Reported apart, not as failures
    /// of the drain.
    pub in_flight_at_crash: Vec<String>,
    /// The API server's own count, over the load, of calls to handoff's webhooks that failed
    /// (`apiserver_admission_webhook_rejection_count` with a calling or internal error) and of
    /// those let through by `failurePolicy: Ignore` (`..._fail_open_count`): what the client
    /// cannot see for the scale webhook, which fails open.
    pub apiserver_failed_calls: f64,
    pub apiserver_fail_open: f64,
    /// Requests the load was to send, at its rate over its duration.
    pub expected: usize,
}

impl Report {
    pub fn new(
        samples: &[Sample],
        windows: &[(Duration, Duration)],
        crash_at: Option<Duration>,
    ) -> Report {
        let mut r = Report {
            by_class: BTreeMap::new(),
            during: BTreeMap::new(),
            baseline: BTreeMap::new(),
            all: Tally::default(),
            in_flight_at_crash: Vec::new(),
            apiserver_failed_calls: 0.0,
            apiserver_fail_open: 0.0,
            expected: 0,
        };
        for s in samples {
            let during = windows.iter().any(|(a, b)| s.at >= *a && s.at <= *b);
            if s.class == Class::Baseline {
                r.baseline.entry(during).or_default().add(s);
                continue;
            }
            let crashed = crash_at.is_some_and(|c| s.at <= c && c <= s.at + s.latency);
            if crashed && matches!(s.outcome, Outcome::WebhookFailed(_)) {
                r.in_flight_at_crash
                    .push(format!("{:?} at {:.1}s", s.class, s.at.as_secs_f64()));
                continue;
            }
            r.all.add(s);
            r.by_class.entry(s.class).or_default().add(s);
            r.during.entry(during).or_default().add(s);
        }
        r
    }

    /// No wrong answer, no failed call (but those a crash took), nothing unexplained, the load
    /// sent what it was to, and the API server counted no more failures than the client saw.
    pub fn assert_clean(&self) {
        assert!(
            self.all.wrong.is_empty(),
            "wrong answers: {:#?}",
            self.all.wrong
        );
        assert!(
            self.all.failed.is_empty(),
            "failed webhook calls: {:#?}",
            self.all.failed
        );
        assert!(
            self.all.other.is_empty(),
            "unexplained answers: {:#?}",
            self.all.other
        );
        assert!(
            self.all.sent + self.in_flight_at_crash.len() >= self.expected * 9 / 10,
            "the load sent {} of the {} requests it was to",
            self.all.sent,
            self.expected
        );
        assert_eq!(
            self.apiserver_fail_open, 0.0,
            "the API server let calls to a handoff webhook through on failurePolicy Ignore"
        );
        assert!(
            self.apiserver_failed_calls <= self.in_flight_at_crash.len() as f64,
            "the API server counted {} failed calls to handoff's webhooks; the client saw {} (at the crash)",
            self.apiserver_failed_calls,
            self.in_flight_at_crash.len()
        );
    }

    /// Guarded requests let through, and unguarded ones refused or changed.
    pub fn wrong(&self) -> Vec<String> {
        self.all.wrong.clone()
    }

    pub fn print(&self, title: &str) {
        println!("== {title}");
        println!(
            "{:<18} {:>6} {:>6} {:>6} {:>7} {:>6} {:>9} {:>9}",
            "class", "sent", "right", "wrong", "failed", "other", "p50 ms", "p99 ms"
        );
        for (c, t) in &self.by_class {
            println!(
                "{:<18} {:>6} {:>6} {:>6} {:>7} {:>6} {:>9.1} {:>9.1}",
                format!("{c:?}"),
                t.sent,
                t.right,
                t.wrong.len(),
                t.failed.len(),
                t.other.len(),
                t.quantile(0.5),
                t.quantile(0.99)
            );
        }
        for (during, t) in &self.during {
            let b = self.baseline.get(during);
            println!(
                "{:<18} {:>6} requests, p50 {:.1} ms / p99 {:.1} ms (baseline ConfigMap create p50 {:.1} / p99 {:.1} ms)",
                if *during {
                    "during disturbances"
                } else {
                    "outside them"
                },
                t.sent,
                t.quantile(0.5),
                t.quantile(0.99),
                b.map_or(0.0, |b| b.quantile(0.5)),
                b.map_or(0.0, |b| b.quantile(0.99)),
            );
        }
        println!(
            "in flight at the crash and failed: {}; the API server's count: {} failed calls, {} let through by failurePolicy Ignore",
            self.in_flight_at_crash.len(),
            self.apiserver_failed_calls,
            self.apiserver_fail_open
        );
        for w in self
            .all
            .wrong
            .iter()
            .chain(&self.all.failed)
            .chain(&self.all.other)
            .take(20)
        {
            println!("  {w}");
        }
    }
}
