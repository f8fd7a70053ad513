//! State the decisions read: caches fed by kube watches, or a folder of YAML files.

pub mod cache;
pub mod cluster;
pub mod files;
pub mod kcp;
pub mod namespaces;
pub mod single_flight;
pub mod telemetry;
pub mod windows;

use crate::duration::GoDuration;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;

use crate::resources::move_window::MoveWindow;
use crate::rules::identity::Identities;
use crate::rules::move_window::{OwnDeployment, ParentDeployment, Unseen};
use crate::rules::sync_finalizer::{KcpState, NamespaceMeta, NamespaceState};
use namespaces::{CacheEntry, NamespaceCache};
use windows::{DeploymentCache, DeploymentMeta, WindowCache, WindowSnapshot};

/// What a decision learnt about a namespace; owned, so the request can hold it across awaits.
#[derive(Debug, Clone, PartialEq)]
pub enum NamespaceLookup {
    Relevant(NamespaceMeta),
    /// Exists and carries nothing the guard reads, or does not exist.
    Plain,
    Unavailable(String),
}

/// What a decision learnt about the kcp namespace a namespace's locator names; owned, like
/// `NamespaceLookup`.
#[derive(Debug, Clone, PartialEq)]
pub enum KcpRead {
    NotRead,
    Known {
        at: crate::rules::identity::KcpNamespace,
        view: Arc<kcp::KcpView>,
    },
    Unavailable {
        at: Option<crate::rules::identity::KcpNamespace>,
        why: String,
    },
}

/// What a decision learnt about the Deployment behind a scale request.
#[derive(Debug, Clone, PartialEq)]
pub enum DeploymentLookup {
    Known(Arc<DeploymentMeta>),
    Missing,
    Unavailable(String),
}

impl NamespaceLookup {
    /// As the guard reads it.
    pub fn state(&self) -> NamespaceState<'_> {
        match self {
            NamespaceLookup::Relevant(m) => NamespaceState::Known(m),
            NamespaceLookup::Plain => NamespaceState::Plain,
            NamespaceLookup::Unavailable(why) => NamespaceState::Unavailable(why),
        }
    }
}

impl KcpRead {
    /// As the guard reads it; `server` is kcp's base URL, for the message that lifts a hold.
    pub fn state<'a>(&'a self, server: &'a str) -> KcpState<'a> {
        match self {
            KcpRead::NotRead => KcpState::NotRead,
            KcpRead::Known { at, view } => KcpState::Known {
                at,
                holds: &view.holds,
                server,
            },
            KcpRead::Unavailable { at, why } => KcpState::Unavailable {
                at: at.as_ref(),
                why,
            },
        }
    }
}

impl DeploymentLookup {
    /// As the pin reads it; `stale` says why the Deployment cache may be out of date.
    pub fn parent<'a>(&'a self, stale: Option<&'a str>) -> ParentDeployment<'a> {
        match self {
            DeploymentLookup::Known(d) => ParentDeployment::Known {
                labels: d.labels.as_ref(),
                annotations: d.annotations.as_ref(),
                stale,
            },
            DeploymentLookup::Missing => ParentDeployment::Missing,
            DeploymentLookup::Unavailable(why) => ParentDeployment::Unavailable(why),
        }
    }
}

/// Whether a watch is keeping its cache current. A watch that keeps failing (RBAC changed, the
/// API server unreachable) leaves the cache as it was; past `stale_after` that view is no
/// longer trusted: readiness fails and the decisions that read it deny instead of guessing.
#[derive(Debug, Default)]
pub struct WatchHealth {
    failing: std::sync::Mutex<Option<(std::time::Instant, String)>>,
}

impl WatchHealth {
    pub fn failed(&self, error: &str) {
        let mut f = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match f.as_mut() {
            Some((_, last)) => *last = error.to_string(),
            None => *f = Some((std::time::Instant::now(), error.to_string())),
        }
    }

    pub fn ok(&self) {
        let mut f = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_some() {
            *f = None;
        }
    }

    /// How long it has been failing (`None`: it is not).
    pub fn failing_for(&self) -> Option<Duration> {
        self.failure().map(|(d, _)| d)
    }

    /// Why the view this watch fed proves nothing now, if it has failed since it last listed:
    /// from its first error, not after `stale_after`. A failed watch is not a slow one: handoff
    /// knows it is blind at once, and an event missed meanwhile (a hold added, a window opened)
    /// may be the one that matters.
    pub fn blind(&self, what: &str) -> Option<String> {
        let (failing_for, error) = self.failure()?;
        Some(format!(
            "the {what} watch failed {:.1}s ago ({error}) and has not listed again",
            failing_for.as_secs_f64()
        ))
    }

    /// How long it has been failing, and its last error.
    fn failure(&self) -> Option<(Duration, String)> {
        let f = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        f.as_ref()
            .map(|(since, error)| (since.elapsed(), error.clone()))
    }

    /// Why the cache is stale, if it has been failing for longer than `after`.
    pub fn stale(&self, what: &str, after: Duration) -> Option<String> {
        let (failing_for, error) = self.failure().filter(|(d, _)| *d > after)?;
        Some(format!(
            "the {what} watch has been failing for {}s ({error}); the cache may be stale",
            failing_for.as_secs()
        ))
    }
}

/// How each watch is doing: one `WatchHealth` per watch.
#[derive(Debug, Default)]
pub struct Watches {
    pub namespaces: WatchHealth,
    pub windows: WatchHealth,
    pub deployments: WatchHealth,
}

/// Which webhooks this process serves (`--webhooks`): it watches and waits for only what they
/// read, so trouble in one webhook's state never makes the other unready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    /// The sync-finalizer guard: namespaces.
    pub guard: bool,
    /// The move-window pin: MoveWindows and Deployments.
    pub pin: bool,
}

impl Default for Serving {
    fn default() -> Self {
        Serving {
            guard: true,
            pin: true,
        }
    }
}

/// Everything the webhooks read, shared by all requests.
pub struct State {
    pub serving: Serving,
    /// Enforcement modes and exemptions in force; replaced whole when the config file changes.
    rollout: std::sync::RwLock<Arc<crate::rules::rollout::Rollout>>,
    pub ids: Identities,
    pub namespaces: NamespaceCache,
    /// Set when state comes from a cluster: asked once when a cache misses an object.
    pub client: Option<kube::Client>,
    pub windows: WindowCache,
    pub deployments: DeploymentCache,
    /// handoff's own Deployment, never pinned.
    pub own: OwnDeployment,
    /// How long a cache-miss fetch may take before the decision gives up and denies.
    pub api_timeout: Duration,
    pub watches: Watches,
    /// How long a watch may fail before its cache counts as stale.
    pub stale_after: Duration,
    /// How old a namespace view may be before a sync target's delete is allowed on it only
    /// after a fresh read.
    pub max_staleness: Duration,
    /// kcp (`--kcp-kubeconfig`): where the kcp namespaces that located namespaces stand for are
    /// read. `None`: handoff reads the physical namespaces only.
    pub kcp: Option<Arc<kcp::Kcp>>,
    /// Counts for `/metrics` (shared with `kcp`).
    pub telemetry: Arc<telemetry::Telemetry>,
    /// Namespace reads in flight, one per name: the removal epoch each began at, and what it
    /// found (`None`: no such namespace).
    reads: single_flight::SingleFlight<Box<str>, (u64, Option<Annotations>)>,
    /// The MoveWindow read of a blind watch in flight, shared by the requests that wait on it.
    window_reads: single_flight::SingleFlight<(), Arc<WindowSnapshot>>,
}

/// A namespace's annotations as a read finds them.
type Annotations = Option<std::collections::BTreeMap<String, String>>;

/// How long a watch may keep failing before its cache counts as stale (`--stale-after`).
pub const STALE_AFTER: GoDuration = GoDuration::new("30s");
/// How old the namespace view may be before a sync target's delete reads its namespace
/// afresh (`--max-staleness`).
pub const MAX_STALENESS: GoDuration = GoDuration::new("10s");
/// How long a read that a decision waits on may take (`--api-timeout`).
pub const API_TIMEOUT: GoDuration = GoDuration::new("3s");

impl State {
    pub fn new(ids: Identities) -> Self {
        State {
            serving: Serving::default(),
            rollout: Default::default(),
            ids,
            namespaces: NamespaceCache::default(),
            client: None,
            windows: WindowCache::default(),
            deployments: DeploymentCache::default(),
            own: OwnDeployment::default(),
            api_timeout: API_TIMEOUT.get(),
            watches: Watches::default(),
            stale_after: STALE_AFTER.get(),
            max_staleness: MAX_STALENESS.get(),
            kcp: None,
            telemetry: Default::default(),
            reads: Default::default(),
            window_reads: Default::default(),
        }
    }

    pub fn rollout(&self) -> Arc<crate::rules::rollout::Rollout> {
        self.rollout
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_rollout(&self, rollout: crate::rules::rollout::Rollout) {
        *self.rollout.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rollout);
    }

    /// Why the namespace cache cannot be trusted now, if it cannot.
    pub fn namespaces_stale(&self) -> Option<String> {
        self.watches.namespaces.stale("namespace", self.stale_after)
    }

    /// The MoveWindows as the pin may decide on them, and why it cannot see every one, if it
    /// cannot. While the watch is blind (it failed and has not listed again) its view proves
    /// nothing: the windows are read from the API server now, one read shared by the requests
    /// that arrive meanwhile, and a failed read leaves the pin in doubt. Past `stale_after` the
    /// cache is untrusted whatever a read says (readiness fails too), as before.
    pub async fn windows_view(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> (Arc<WindowSnapshot>, Option<Unseen>) {
        let cached = self.windows.snapshot();
        if !self.windows.is_synced() {
            return (cached, Some(Unseen::NotListed));
        }
        if let Some(why) = self.watches.windows.stale("MoveWindow", self.stale_after) {
            return (cached, Some(Unseen::Stale(why)));
        }
        let (Some(why), Some(client)) = (self.watches.windows.blind("MoveWindow"), &self.client)
        else {
            return (cached, None);
        };
        let budget = self.read_budget(deadline);
        let api = kube::Api::<MoveWindow>::all(client.clone());
        let read = self
            .window_reads
            .run((), "the MoveWindow read", || async move {
                match tokio::time::timeout(budget, api.list(&Default::default())).await {
                    Err(_) => Err(format!("the API server did not answer within {budget:?}")),
                    Ok(Err(e)) => Err(format!("the API server said: {e}")),
                    Ok(Ok(list)) => {
                        let read = WindowCache::default();
                        read.replace_all(&list.items);
                        Ok(read.snapshot())
                    }
                }
            })
            .await;
        match read {
            Ok(snap) => (snap, None),
            Err(e) => (
                cached,
                Some(Unseen::Stale(format!(
                    "{why}, and reading the MoveWindows failed: {e}"
                ))),
            ),
        }
    }

    /// How long a read a request waits on may take: `api_timeout`, or up to 50 ms before the
    /// request's deadline, to leave time to answer.
    fn read_budget(&self, deadline: Option<tokio::time::Instant>) -> Duration {
        deadline.map_or(self.api_timeout, |d| {
            d.saturating_duration_since(tokio::time::Instant::now())
                .saturating_sub(Duration::from_millis(50))
                .min(self.api_timeout)
        })
    }

    /// State from a folder of YAML manifests. Kinds it does not read are an error, so that a
    /// typo in `kind` does not silently leave a namespace unguarded.
    pub fn from_dir(dir: &Path, ids: Identities) -> Result<Self, files::StateError> {
        let state = State::new(ids);
        let mut windows = Vec::new();
        // One document at a time, straight into the caches: nothing holds the whole folder.
        state.namespaces.begin_relist();
        state.deployments.begin_relist();
        files::for_each_doc(dir, |doc| {
            match doc.kind.as_str() {
                "Namespace" => {
                    let ns: Namespace = doc.parse()?;
                    let name = ns.metadata.name.clone().unwrap_or_default();
                    if name.is_empty() {
                        return Err(doc.invalid("Namespace has no metadata.name"));
                    }
                    state.namespaces.relist_apply(
                        &name,
                        NamespaceMeta::from_annotations(
                            ns.metadata.annotations.as_ref(),
                            &state.ids,
                        ),
                    );
                }
                "MoveWindow" => {
                    let w: MoveWindow = doc.parse()?;
                    if w.metadata.name.as_deref().unwrap_or("").is_empty() {
                        return Err(doc.invalid("MoveWindow has no metadata.name"));
                    }
                    w.spec
                        .selector()
                        .map_err(|e| doc.invalid(format!("spec.deploymentSelector: {e}")))?;
                    windows.push(w);
                }
                "Deployment" => {
                    let d: Deployment = doc.parse()?;
                    let (Some(ns), Some(name)) =
                        (d.metadata.namespace.as_deref(), d.metadata.name.as_deref())
                    else {
                        return Err(
                            doc.invalid("Deployment needs metadata.namespace and metadata.name")
                        );
                    };
                    state.deployments.relist_apply(
                        ns,
                        name,
                        DeploymentMeta::new(
                            d.metadata.labels.as_ref(),
                            d.metadata.annotations.as_ref(),
                        ),
                    );
                }
                other => {
                    return Err(doc.invalid(format!(
                        "kind {other:?} is not one handoff reads from --state (Namespace, MoveWindow, Deployment)"
                    )));
                }
            }
            Ok::<_, files::StateError>(())
        })?;
        state.namespaces.end_relist();
        state.windows.replace_all(&windows);
        state.deployments.end_relist();
        Ok(state)
    }

    /// The namespace as the guard needs it: from the cache, or read from the API server on a
    /// miss. The flag says whether the answer was read just now (fresh by definition).
    pub async fn namespace(&self, name: &str) -> (NamespaceLookup, bool) {
        if let Some(why) = self.namespaces_stale() {
            return (NamespaceLookup::Unavailable(why), false);
        }
        match self.namespaces.get(name) {
            CacheEntry::Relevant(m) => (NamespaceLookup::Relevant(m), false),
            CacheEntry::Plain => (NamespaceLookup::Plain, false),
            CacheEntry::Unknown => (self.read_namespace(name).await, true),
        }
    }

    /// Why the cached namespace view cannot be shown to be current, if it cannot: the watch
    /// has failed since it last listed, or has delivered nothing for longer than
    /// `max_staleness` (a quiet cluster, or a watch connection that died without a word).
    /// State from files is always current.
    pub fn namespaces_unproven(&self) -> Option<String> {
        self.client.as_ref()?;
        if let Some(why) = self.watches.namespaces.blind("namespace") {
            return Some(why);
        }
        match self.namespaces.proven_ago() {
            Some(ago) if ago <= self.max_staleness => None,
            Some(ago) => Some(format!(
                "the namespace watch has delivered nothing for {}s (--max-staleness {}s)",
                ago.as_secs(),
                self.max_staleness.as_secs()
            )),
            None => Some("the namespace watch has not listed yet".to_string()),
        }
    }

    /// Read one namespace from the API server now, with at most one read in flight per name
    /// (`SingleFlight`: concurrent requests wait for the same answer, and a request joins only
    /// a read that started at most `api_timeout` ago).
    pub async fn read_namespace(&self, name: &str) -> NamespaceLookup {
        let Some(client) = self.client.clone() else {
            return NamespaceLookup::Plain;
        };
        let timeout = self.api_timeout;
        let answer = self
            .reads
            .run(name.into(), "the namespace read", || {
                let api = kube::Api::<Namespace>::all(client);
                let key = name.to_string();
                // A read that began before a removal or a relist may bring back what they
                // removed: `insert_read` checks the epoch.
                let epoch = self.namespaces.removal_epoch();
                async move {
                    match tokio::time::timeout(timeout, api.get_metadata_opt(&key)).await {
                        Err(_) => Err(format!("the API server did not answer within {timeout:?}")),
                        Ok(Err(e)) => Err(format!("the API server said: {e}")),
                        Ok(Ok(ns)) => Ok((epoch, ns.map(|ns| ns.metadata.annotations))),
                    }
                }
            })
            .await;
        match answer {
            Err(why) => NamespaceLookup::Unavailable(why.to_string()),
            Ok((_, None)) => NamespaceLookup::Plain,
            Ok((epoch, Some(annotations))) => {
                let meta = NamespaceMeta::from_annotations(annotations.as_ref(), &self.ids);
                // The watch may have delivered a newer view meanwhile: it wins.
                self.namespaces.insert_read(epoch, name, meta.clone());
                if meta.is_interesting() {
                    NamespaceLookup::Relevant(meta)
                } else {
                    NamespaceLookup::Plain
                }
            }
        }
    }

    /// The kcp namespace that a namespace's locator names, as the guard needs it: read (or
    /// answered from a view at most `--max-staleness` old) only when handoff reads kcp and the
    /// namespace is located. Call it for sync targets only.
    pub async fn kcp_namespace(&self, lookup: &NamespaceLookup) -> KcpRead {
        let (Some(kcp), NamespaceLookup::Relevant(meta)) = (&self.kcp, lookup) else {
            return KcpRead::NotRead;
        };
        match meta.kcp.as_deref() {
            None => KcpRead::NotRead,
            Some(Err(why)) => KcpRead::Unavailable {
                at: None,
                why: why.to_string(),
            },
            Some(Ok(at)) => match kcp.namespace(at).await {
                kcp::KcpLookup::Known(view) => KcpRead::Known {
                    at: at.clone(),
                    view,
                },
                kcp::KcpLookup::Unavailable(why) => KcpRead::Unavailable {
                    at: Some(at.clone()),
                    why,
                },
            },
        }
    }

    /// The Deployment behind a scale request, and why its labels may be out of date, if they
    /// may: from the cache, or asked of the API once on a miss, giving up as "unavailable" 50 ms
    /// before `deadline` to leave time to answer. While the Deployment watch is blind (it
    /// failed and has not listed again) the cache proves nothing and the Deployment is read
    /// now; if that read fails, a cached entry is used marked stale (a window's list of pinned
    /// Deployments then counts too).
    pub async fn deployment(
        &self,
        namespace: &str,
        name: &str,
        deadline: Option<tokio::time::Instant>,
    ) -> (DeploymentLookup, Option<String>) {
        let blind = self.watches.deployments.blind("Deployment");
        let cached = self.deployments.get(namespace, name);
        let stale = || {
            self.watches
                .deployments
                .stale("Deployment", self.stale_after)
        };
        let client = match (&cached, &blind, &self.client) {
            // A proven cache, or no API server to read (state from files): the cache as it is.
            (Some(d), None, _) | (Some(d), _, None) => {
                return (DeploymentLookup::Known(d.clone()), stale());
            }
            (None, _, None) => return (DeploymentLookup::Missing, None),
            (_, _, Some(client)) => client.clone(),
        };
        let budget = self.read_budget(deadline);
        let api = kube::Api::<PartialObjectMeta<Deployment>>::namespaced(client, namespace);
        let failed = match tokio::time::timeout(budget, api.get_opt(name)).await {
            Err(_) => format!("the API server did not answer within {budget:?}"),
            Ok(Err(e)) => format!("the API server said: {e}"),
            Ok(Ok(None)) => return (DeploymentLookup::Missing, None),
            Ok(Ok(Some(d))) => {
                let meta = DeploymentMeta::new(
                    d.metadata.labels.as_ref(),
                    d.metadata.annotations.as_ref(),
                );
                self.deployments
                    .insert_if_absent(namespace, name, meta.clone());
                return (DeploymentLookup::Known(Arc::new(meta)), None);
            }
        };
        match (cached, blind) {
            (Some(d), Some(why)) => (
                DeploymentLookup::Known(d),
                Some(format!("{why}, and reading it failed: {failed}")),
            ),
            _ => (DeploymentLookup::Unavailable(failed), None),
        }
    }

    /// Ready once the caches of the webhooks served have seen their first full list.
    pub fn is_synced(&self) -> bool {
        (!self.serving.guard || self.namespaces.is_synced())
            && (!self.serving.pin || (self.windows.is_synced() && self.deployments.is_synced()))
    }

    /// `Err` with the reason while a cache of a served webhook is not synced or has gone
    /// stale. The other webhook's caches are not consulted (nor watched).
    pub fn readiness(&self) -> Result<(), String> {
        let mut why = Vec::new();
        if self.serving.guard {
            if !self.namespaces.is_synced() {
                why.push("the namespace cache (sync-finalizer) is not synced yet".to_string());
            }
            why.extend(self.namespaces_stale());
        }
        if self.serving.pin {
            if !self.windows.is_synced() {
                why.push("the MoveWindow cache (move-window) is not synced yet".to_string());
            }
            if !self.deployments.is_synced() {
                why.push("the Deployment cache (move-window) is not synced yet".to_string());
            }
            // Each stale watch named: an operator fixes them one by one.
            why.extend(self.watches.windows.stale("MoveWindow", self.stale_after));
            why.extend(
                self.watches
                    .deployments
                    .stale("Deployment", self.stale_after),
            );
        }
        match why.is_empty() {
            true => Ok(()),
            false => Err(why.join("; ")),
        }
    }
}
