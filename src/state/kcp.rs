//! The kcp side (`--kcp-kubeconfig`): the namespaces in kcp that located physical namespaces
//! stand for, read where kcp users set their holds (docs/ARCHITECTURE.md §1.1), and mirrored onto the
//! physical namespaces for the in-API-server policy.
//!
//! A kcp namespace is read at kcp's logical-cluster URL
//! `/clusters/<cluster>/api/v1/namespaces/<namespace>`. Two sources answer, and neither ever
//! answers with a view older than `--max-staleness`:
//! - a metadata-only watch of `/clusters/*/api/v1/namespaces` (every logical cluster at once,
//!   each item naming its cluster in the `kcp.io/cluster` annotation), where kcp allows it. It
//!   answers only for a namespace it holds and only while it has proven itself current within
//!   `--max-staleness`; a namespace it does not hold is read, never taken as "no hold" (the
//!   watch keys by logical cluster *name*, a locator may name a workspace *path*);
//! - otherwise a read of that one namespace, at most one in flight per namespace, whose answer
//!   is kept for `--max-staleness` from when the read began.
//!
//! When neither can answer, the lookup is `Unavailable` and the guard denies the sync target's
//! delete. Nothing here is read for anyone but a sync target acting in a located namespace.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;

use super::cache::Projected;
use super::single_flight::{FlightError, SingleFlight};
use super::{State, WatchHealth};
use crate::rules::identity::{Identities, KcpNamespace};
use crate::rules::sync_finalizer::{SoftFinalizer, blocking_finalizers};

/// The annotations kcp puts on every object of a wildcard (`/clusters/*`) list or watch: the
/// logical cluster the object lives in.
pub const CLUSTER_ANNOTATIONS: [&str; 2] = ["kcp.io/cluster", "kcp.dev/cluster"];

/// The field manager the mirror applies with; it owns only the sync-finalizer annotations it
/// copied, never anything else.
pub const MIRROR_FIELD_MANAGER: &str = "handoff-kcp-mirror";

/// What handoff keeps of a kcp namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KcpView {
    /// Whether it exists (a missing namespace holds nothing).
    pub exists: bool,
    /// Its sync-finalizer annotations, blocking or not: what the mirror copies.
    pub annotations: BTreeMap<String, String>,
    /// The blocking ones, for the guard.
    pub holds: Arc<[SoftFinalizer]>,
}

impl KcpView {
    pub fn new(annotations: Option<&BTreeMap<String, String>>, ids: &Identities) -> Self {
        let annotations: BTreeMap<String, String> = annotations
            .into_iter()
            .flatten()
            .filter(|(k, _)| ids.finalizer_key(k).is_some())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        KcpView {
            exists: true,
            holds: blocking_finalizers(&annotations, ids).into(),
            annotations,
        }
    }
}

/// What a lookup learnt.
#[derive(Debug, Clone, PartialEq)]
pub enum KcpLookup {
    Known(Arc<KcpView>),
    Unavailable(String),
}

/// Why a kcp kubeconfig gives no client.
#[derive(Debug, thiserror::Error)]
pub enum KcpConfigError {
    #[error(transparent)]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error(transparent)]
    Uri(#[from] http::uri::InvalidUri),
    #[error(transparent)]
    UriParts(#[from] http::uri::InvalidUriParts),
    #[error(transparent)]
    Client(#[from] kube::Error),
}

/// Why a kcp namespace could not be read. Clone: one read's answer goes to every request
/// waiting for it (`SingleFlight`), so what is not `Clone` is shared behind an `Arc`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KcpReadError {
    #[error("kcp did not answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Request(Arc<http::Error>),
    /// A 404 that does not name the namespace: a missing logical cluster, or not kcp at all.
    #[error(
        "kcp answered 404 for {path} without naming the namespace ({message}): is logical cluster {cluster} there, and is --kcp-kubeconfig kcp's?"
    )]
    NotThere {
        path: String,
        message: String,
        cluster: String,
    },
    #[error("kcp said: {0}")]
    Api(#[source] Arc<kube::Error>),
}

/// Read answers, with when each read began.
type Answers = HashMap<KcpNamespace, (Instant, Arc<KcpView>)>;

/// kcp, as the guard and the mirror read it.
pub struct Kcp {
    /// kcp's base URL (without any `/clusters/…`), for messages.
    pub server: String,
    /// A client for kcp's base URL; requests name the logical cluster in their path.
    client: kube::Client,
    /// A client for `<base>/clusters/*`, for the wildcard watch.
    wildcard: kube::Client,
    ids: Identities,
    /// How old an answer may be: `--max-staleness`.
    pub max_staleness: Duration,
    /// How long a read may take: `--api-timeout`.
    pub timeout: Duration,
    /// The wildcard watch's view.
    watched: Projected<KcpNamespace, Arc<KcpView>>,
    pub health: WatchHealth,
    /// Answers of reads, with when the read began.
    read: Arc<Mutex<Answers>>,
    in_flight: SingleFlight<KcpNamespace, (Instant, Arc<KcpView>), KcpReadError>,
    /// Reads and mirror applies, for `/metrics` (the state's, once handoff serves).
    pub telemetry: Arc<super::telemetry::Telemetry>,
}

/// kcp's base URL of a kcp kubeconfig's server: a kubeconfig made for one workspace points at
/// `<base>/clusters/<workspace>`; handoff reads every workspace, so it cuts that off.
pub fn base_url(server: &http::Uri) -> Result<http::Uri, KcpConfigError> {
    let path = server.path();
    let base = match path.find("/clusters/") {
        Some(i) => &path[..i],
        None => path,
    };
    let mut parts = server.clone().into_parts();
    parts.path_and_query = Some(
        base.trim_end_matches('/')
            .parse()
            .or_else(|_| "/".parse())?,
    );
    Ok(http::Uri::from_parts(parts)?)
}

impl Kcp {
    /// From a kubeconfig for kcp (its base URL, or any workspace's URL).
    pub async fn from_kubeconfig(
        path: &std::path::Path,
        ids: Identities,
        max_staleness: Duration,
        timeout: Duration,
    ) -> Result<Kcp, KcpConfigError> {
        let kc = kube::config::Kubeconfig::read_from(path)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        Kcp::from_config(config, ids, max_staleness, timeout)
    }

    pub fn from_config(
        mut config: kube::Config,
        ids: Identities,
        max_staleness: Duration,
        timeout: Duration,
    ) -> Result<Kcp, KcpConfigError> {
        let base = base_url(&config.cluster_url)?;
        config.cluster_url = base.clone();
        let mut wildcard_config = config.clone();
        wildcard_config.cluster_url =
            format!("{}/clusters/*", base.to_string().trim_end_matches('/'))
                .parse::<http::Uri>()?;
        let client = kube::Client::try_from(config)?;
        let wildcard = kube::Client::try_from(wildcard_config)?;
        Ok(Kcp {
            server: base.to_string().trim_end_matches('/').to_string(),
            client,
            wildcard,
            ids,
            max_staleness,
            timeout,
            watched: Projected::default(),
            health: WatchHealth::default(),
            read: Default::default(),
            in_flight: Default::default(),
            telemetry: Default::default(),
        })
    }

    /// The kcp namespace `at`, never older than `max_staleness`.
    pub async fn namespace(&self, at: &KcpNamespace) -> KcpLookup {
        if let Some(v) = self.watched_view(at) {
            return KcpLookup::Known(v);
        }
        if let Some(v) = self.read_view(at) {
            return KcpLookup::Known(v);
        }
        match self.read_now(at).await {
            Ok((_, v)) => KcpLookup::Known(v),
            Err(why) => KcpLookup::Unavailable(why.to_string()),
        }
    }

    /// The watch's view of `at`, if it holds it and has proven itself current lately.
    fn watched_view(&self, at: &KcpNamespace) -> Option<Arc<KcpView>> {
        self.watch_current().then(|| self.watched.get(at)).flatten()
    }

    /// A read's answer, if it began within `max_staleness`.
    fn read_view(&self, at: &KcpNamespace) -> Option<Arc<KcpView>> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        read.get(at)
            .filter(|(when, _)| when.elapsed() <= self.max_staleness)
            .map(|(_, v)| v.clone())
    }

    /// Read `at` from kcp now, joining a read of it already under way.
    async fn read_now(
        &self,
        at: &KcpNamespace,
    ) -> Result<(Instant, Arc<KcpView>), FlightError<KcpReadError>> {
        let (client, ids, timeout) = (self.client.clone(), self.ids.clone(), self.timeout);
        let (key, answers, max_age) = (at.clone(), self.read.clone(), self.max_staleness);
        let telemetry = self.telemetry.clone();
        self.in_flight
            .run(at.clone(), "the kcp read", move || async move {
                let began = Instant::now();
                let answer = match tokio::time::timeout(timeout, get(&client, &key, &ids)).await {
                    Err(_) => Err(KcpReadError::Timeout(timeout)),
                    Ok(r) => r,
                };
                telemetry
                    .kcp_read_duration
                    .observe(began.elapsed().as_secs_f64());
                let outcome = match answer.is_ok() {
                    true => super::telemetry::OK,
                    false => super::telemetry::ERROR,
                };
                telemetry.kcp_reads.get_or_create(&outcome).inc();
                if answer.is_ok() {
                    telemetry.kcp_last_success.set(super::telemetry::unix_now());
                }
                let v = answer?;
                let mut answers = answers.lock().unwrap_or_else(|e| e.into_inner());
                // Forget answers nobody may use any more, now and then.
                if answers.len() >= 1024 && answers.len().is_power_of_two() {
                    answers.retain(|_, (when, _)| when.elapsed() <= max_age);
                }
                answers.insert(key, (began, v.clone()));
                Ok((began, v))
            })
            .await
    }

    /// Keep the wildcard watch's view current, for as long as the process runs. Where kcp
    /// refuses it (no rights across workspaces, a shard without the wildcard), it keeps
    /// retrying with backoff and every lookup is a read.
    pub async fn watch(self: Arc<Self>) {
        let api: kube::Api<PartialObjectMeta<Namespace>> = kube::Api::all(self.wildcard.clone());
        let key = |o: &PartialObjectMeta<Namespace>| {
            let cluster = CLUSTER_ANNOTATIONS
                .iter()
                .find_map(|k| o.metadata.annotations.as_ref()?.get(*k))?;
            Some(KcpNamespace {
                cluster: cluster.clone(),
                namespace: o.metadata.name.clone()?,
            })
        };
        // Most kcp namespaces carry no sync finalizer: they share one view, and cost the watch
        // little more than their names.
        let plain = Arc::new(KcpView::new(None, &self.ids));
        let view = |o: &PartialObjectMeta<Namespace>| {
            let v = KcpView::new(o.metadata.annotations.as_ref(), &self.ids);
            match v == *plain {
                true => plain.clone(),
                false => Arc::new(v),
            }
        };
        let cache = &self.watched;
        super::cluster::run(api, "kcp namespaces", &self.health, |ev| match ev {
            Event::Init => cache.begin_relist(),
            Event::InitApply(o) => {
                if let Some(k) = key(&o) {
                    cache.relist_apply(k, view(&o));
                }
            }
            Event::InitDone => cache.end_relist(),
            Event::Apply(o) => {
                if let Some(k) = key(&o) {
                    cache.upsert(k, view(&o));
                }
                cache.prove();
            }
            Event::Delete(o) => {
                if let Some(k) = key(&o) {
                    cache.remove(&k);
                }
                cache.prove();
            }
        })
        .await
    }

    /// Whether the wildcard watch answers now (listed, not failed since, and proven current
    /// within `max_staleness`): from its first error its view proves nothing, and every lookup
    /// is a read until it lists again.
    pub fn watch_current(&self) -> bool {
        self.watched.is_synced()
            && self.health.failing_for().is_none()
            && self
                .watched
                .proven_ago()
                .is_some_and(|ago| ago <= self.max_staleness)
    }

    /// Whether the wildcard watch has listed and is not failing: good enough for the mirror,
    /// which holds nothing by itself (the guard never allows on a view the watch has not proven
    /// current within `max_staleness`).
    pub fn watch_healthy(&self) -> bool {
        self.watched.is_synced() && self.health.stale("", Duration::ZERO).is_none()
    }

    /// The kcp namespace `at` for the mirror: the watch's view while it is healthy, however
    /// quiet kcp has been; else as the guard reads it.
    pub async fn namespace_for_mirror(&self, at: &KcpNamespace) -> KcpLookup {
        if self.watch_healthy()
            && let Some(v) = self.watched.get(at)
        {
            return KcpLookup::Known(v);
        }
        self.namespace(at).await
    }
}

/// GET `/clusters/<cluster>/api/v1/namespaces/<namespace>`: a missing namespace is one that
/// holds nothing. Only a 404 that names the namespace says it is missing; any other 404 (a
/// logical cluster kcp does not know, a kubeconfig that is not kcp's, a proxy's page) says
/// nothing about holds and is an error, so that a wrong URL can never read as "no hold".
async fn get(
    client: &kube::Client,
    at: &KcpNamespace,
    ids: &Identities,
) -> Result<Arc<KcpView>, KcpReadError> {
    let request = http::Request::get(at.path())
        .header(http::header::ACCEPT, "application/json")
        .body(Vec::new())
        .map_err(|e| KcpReadError::Request(Arc::new(e)))?;
    match client.request::<Namespace>(request).await {
        Ok(ns) => Ok(Arc::new(KcpView::new(
            ns.metadata.annotations.as_ref(),
            ids,
        ))),
        Err(kube::Error::Api(s))
            if s.is_not_found()
                && s.details
                    .as_ref()
                    .is_some_and(|d| d.name == at.namespace && d.kind == "namespaces") =>
        {
            Ok(Arc::new(KcpView::default()))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Err(KcpReadError::NotThere {
            path: at.path(),
            message: s.message,
            cluster: at.cluster.clone(),
        }),
        Err(e) => Err(KcpReadError::Api(Arc::new(e))),
    }
}

/// Keep every located physical namespace's sync-finalizer annotations equal to its kcp
/// namespace's, for as long as the process runs (docs/ARCHITECTURE.md §2.1: the in-API-server policy cannot
/// call kcp). Server-side apply with its own field manager and without force: it owns exactly
/// the annotations it copied, an apply without one releases (removes) it, and an annotation
/// another manager set with another value is never taken over or removed (the apply reports
/// a conflict and the guard's read-through still holds). While kcp cannot be read, a namespace
/// is left as it is. The guard's decisions never wait for it.
pub async fn mirror(state: Arc<State>, kcp: Arc<Kcp>, client: kube::Client, every: Duration) {
    let api: kube::Api<Namespace> = kube::Api::all(client);
    let params = kube::api::PatchParams::apply(MIRROR_FIELD_MANAGER);
    // What this process last applied to each namespace.
    let mut applied: HashMap<String, BTreeMap<String, String>> = HashMap::new();
    // Namespaces whose last apply was refused, with what it tried: said once, and tried again
    // only when kcp says something else or at the resync.
    let mut refused: HashMap<String, BTreeMap<String, String>> = HashMap::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round: u64 = 0;
    loop {
        tick.tick().await;
        round += 1;
        // Now and then apply everything again: someone may have edited what was applied. On a
        // round that also runs without the watch (1 mod 15, below): 60 is a multiple of 15.
        let resync = round % 60 == 1;
        // Without the wildcard watch every comparison is a read of kcp: compare every 15th
        // round only (30 s at the default 2 s), so that the mirror does not read each kcp
        // namespace every few seconds. The guard never waits for the mirror.
        if !kcp.watch_healthy() && round % 15 != 1 {
            continue;
        }
        let located = state.namespaces.located_in_kcp();
        let names: HashSet<&str> = located.iter().map(|(n, _, _)| n.as_str()).collect();
        applied.retain(|n, _| names.contains(n.as_str()));
        refused.retain(|n, _| names.contains(n.as_str()));
        for (name, at, held_here) in &located {
            let want = match kcp.namespace_for_mirror(at).await {
                KcpLookup::Known(v) => v.annotations.clone(),
                KcpLookup::Unavailable(why) => {
                    tracing::debug!(namespace = %name, kcp_namespace = %at, %why, "mirror: kcp unreadable; namespace left as it is");
                    continue;
                }
            };
            let needed = match applied.get(name) {
                Some(last) => *last != want || (resync && !want.is_empty()),
                // Not applied by this process yet: something to copy, or a hold here that an
                // earlier run may have copied and kcp has lifted since.
                None => !want.is_empty() || *held_here,
            };
            if !needed || (!resync && refused.get(name) == Some(&want)) {
                continue;
            }
            let patch = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "annotations": want},
            });
            match api
                .patch(name, &params, &kube::api::Patch::Apply(&patch))
                .await
            {
                Ok(_) => {
                    kcp.telemetry
                        .kcp_mirror_applies
                        .get_or_create(&super::telemetry::OK)
                        .inc();
                    if refused.remove(name).is_some() || applied.get(name) != Some(&want) {
                        tracing::info!(namespace = %name, kcp_namespace = %at, annotations = ?want.keys().collect::<Vec<_>>(), "mirror: sync finalizers copied from kcp");
                    }
                    applied.insert(name.clone(), want);
                }
                Err(e) => {
                    let outcome = match &e {
                        kube::Error::Api(s) if s.code == 409 => super::telemetry::CONFLICT,
                        _ => super::telemetry::ERROR,
                    };
                    kcp.telemetry
                        .kcp_mirror_applies
                        .get_or_create(&outcome)
                        .inc();
                    if refused.insert(name.clone(), want).is_none() {
                        tracing::warn!(namespace = %name, kcp_namespace = %at, error = %e, "mirror: cannot copy the sync finalizers from kcp (the guard still reads kcp)");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: &str = "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g";

    fn at() -> KcpNamespace {
        KcpNamespace {
            cluster: "root:org:ws".into(),
            namespace: "test".into(),
        }
    }

    fn held() -> Arc<KcpView> {
        let a = BTreeMap::from([
            (HOLD.to_string(), "glbc".to_string()),
            ("example.com/other".to_string(), "x".to_string()),
        ]);
        Arc::new(KcpView::new(Some(&a), &Identities::default()))
    }

    /// kcp at a port nothing listens on.
    fn unreachable(max_staleness: Duration) -> Kcp {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        Kcp::from_config(
            config,
            Identities::default(),
            max_staleness,
            Duration::from_secs(2),
        )
        .unwrap()
    }

    #[test]
    fn base_url_cuts_a_workspace_url_back_to_kcp_itself() {
        for (server, want) in [
            ("https://kcp.example:6443", "https://kcp.example:6443/"),
            ("https://kcp.example:6443/", "https://kcp.example:6443/"),
            (
                "https://kcp.example:6443/clusters/root:org:ws",
                "https://kcp.example:6443/",
            ),
            (
                "https://front.example/kcp/clusters/root",
                "https://front.example/kcp",
            ),
            ("http://127.0.0.1:8080/clusters/*", "http://127.0.0.1:8080/"),
        ] {
            let got = base_url(&server.parse().unwrap()).unwrap();
            assert_eq!(got.to_string(), want, "{server}");
        }
    }

    #[test]
    fn a_kcp_view_keeps_the_sync_finalizers_only_and_the_blocking_ones_apart() {
        let v = held();
        assert!(v.exists);
        assert_eq!(v.annotations.len(), 1);
        assert_eq!(v.holds.len(), 1);
        let a = BTreeMap::from([(HOLD.to_string(), String::new())]);
        let lifted = KcpView::new(Some(&a), &Identities::default());
        assert_eq!(lifted.annotations.len(), 1, "the mirror copies it as it is");
        assert!(lifted.holds.is_empty(), "\"\" does not block");
        assert!(!KcpView::default().exists);
    }

    #[tokio::test]
    async fn no_answer_older_than_max_staleness_is_ever_used() {
        let kcp = unreachable(Duration::from_millis(200));
        // A read's answer within max-staleness answers without asking kcp...
        kcp.read
            .lock()
            .unwrap()
            .insert(at(), (Instant::now(), held()));
        assert_eq!(kcp.namespace(&at()).await, KcpLookup::Known(held()));
        // ...and past it, kcp is asked again: unreachable, so unavailable, never "no hold".
        tokio::time::sleep(Duration::from_millis(250)).await;
        match kcp.namespace(&at()).await {
            KcpLookup::Unavailable(why) => assert!(why.contains("kcp said"), "{why}"),
            other => panic!("{other:?}"),
        }
        // The watch's view counts only while it has proven itself current lately.
        kcp.watched.replace_all([(at(), held())]);
        assert!(kcp.watch_current());
        assert_eq!(kcp.namespace(&at()).await, KcpLookup::Known(held()));
        // A watch that failed proves nothing from its first error, however recent its last
        // event: kcp is read (unreachable here), until the watch lists again.
        kcp.health.failed("connection reset");
        assert!(!kcp.watch_current());
        assert!(matches!(
            kcp.namespace(&at()).await,
            KcpLookup::Unavailable(_)
        ));
        kcp.health.ok();
        kcp.watched.replace_all([(at(), held())]);
        assert!(kcp.watch_current());
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(!kcp.watch_current());
        assert!(matches!(
            kcp.namespace(&at()).await,
            KcpLookup::Unavailable(_)
        ));
        // A namespace the watch does not hold is read, never taken as "no hold" (the watch
        // keys by logical cluster name, a locator may name a workspace path).
        kcp.watched.replace_all([]);
        assert!(kcp.watch_current());
        assert!(matches!(
            kcp.namespace(&at()).await,
            KcpLookup::Unavailable(_)
        ));
        // The mirror takes a healthy watch's view however quiet kcp has been.
        kcp.watched.replace_all([(at(), held())]);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(
            kcp.namespace_for_mirror(&at()).await,
            KcpLookup::Known(held())
        );
        kcp.health.failed("connection reset");
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(matches!(
            kcp.namespace_for_mirror(&at()).await,
            KcpLookup::Unavailable(_)
        ));
    }
}
