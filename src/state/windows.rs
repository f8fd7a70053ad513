//! Open MoveWindows and the Deployments they may select, as the pin reads them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::policy::move_window::{OpenWindow, PinnedRef, SAVED_REPLICAS_ANNOTATION};
use crate::resources::move_window::MoveWindow;

/// What the cache keeps of one MoveWindow.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Closed,
    Open(OpenWindow, Vec<PinnedRef>),
    /// Open, with a `deploymentSelector` that does not parse: the reason.
    Invalid(String, Vec<PinnedRef>),
}

/// The windows as one request reads them: taken with one `Arc` clone, no lock held while
/// deciding.
#[derive(Debug, Default)]
pub struct WindowSnapshot {
    pub open: Vec<OpenWindow>,
    /// Open windows whose selector cannot be evaluated, as messages.
    pub invalid: Vec<String>,
    /// The Deployments that open windows (valid or not) list as pinned in their status.
    pub pinned: Vec<PinnedRef>,
}

/// Every MoveWindow by name; the open ones compiled for the pin.
#[derive(Default)]
pub struct WindowCache {
    all: RwLock<BTreeMap<String, Entry>>,
    /// Rebuilt on every change.
    snapshot: RwLock<Arc<WindowSnapshot>>,
    relist: RwLock<Option<BTreeMap<String, Entry>>>,
    synced: AtomicBool,
}

fn compile(w: &MoveWindow) -> Entry {
    let name = w.metadata.name.clone().unwrap_or_default();
    if !w.spec.is_open() {
        return Entry::Closed;
    }
    let pinned = w
        .status
        .as_ref()
        .map(|s| {
            s.pinned
                .iter()
                .filter(|p| p.restored_at.is_none())
                .map(|p| PinnedRef {
                    window: name.clone(),
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    match w.spec.selector() {
        Ok(selector) => Entry::Open(OpenWindow { name, selector }, pinned),
        Err(e) => {
            tracing::error!(window = %name, error = %e, "open MoveWindow has an invalid deploymentSelector");
            Entry::Invalid(
                format!("MoveWindow \"{name}\" is open but its spec.{e}"),
                pinned,
            )
        }
    }
}

impl WindowCache {
    pub fn snapshot(&self) -> Arc<WindowSnapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The open windows whose selectors are read.
    pub fn open(&self) -> Vec<OpenWindow> {
        self.snapshot().open.clone()
    }

    fn publish(&self, all: &BTreeMap<String, Entry>) {
        let mut snap = WindowSnapshot::default();
        for e in all.values() {
            match e {
                Entry::Open(w, pinned) => {
                    snap.open.push(w.clone());
                    snap.pinned.extend(pinned.iter().cloned());
                }
                Entry::Invalid(why, pinned) => {
                    snap.invalid.push(why.clone());
                    snap.pinned.extend(pinned.iter().cloned());
                }
                Entry::Closed => {}
            }
        }
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snap);
    }

    pub fn upsert(&self, w: &MoveWindow) {
        let mut all = self.all.write().unwrap_or_else(|e| e.into_inner());
        all.insert(w.metadata.name.clone().unwrap_or_default(), compile(w));
        self.publish(&all);
    }

    pub fn remove(&self, name: &str) {
        let mut all = self.all.write().unwrap_or_else(|e| e.into_inner());
        all.remove(name);
        self.publish(&all);
    }

    pub fn begin_relist(&self) {
        *self.relist.write().unwrap_or_else(|e| e.into_inner()) = Some(BTreeMap::new());
    }

    pub fn relist_apply(&self, w: &MoveWindow) {
        let mut relist = self.relist.write().unwrap_or_else(|e| e.into_inner());
        match relist.as_mut() {
            Some(buf) => {
                buf.insert(w.metadata.name.clone().unwrap_or_default(), compile(w));
            }
            None => {
                drop(relist);
                self.upsert(w);
            }
        }
    }

    pub fn end_relist(&self) {
        let buf = self
            .relist
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(buf) = buf {
            let mut all = self.all.write().unwrap_or_else(|e| e.into_inner());
            *all = buf;
            self.publish(&all);
        }
        self.synced.store(true, Ordering::Release);
    }

    pub fn replace_all<'a>(&self, windows: impl IntoIterator<Item = &'a MoveWindow>) {
        self.begin_relist();
        for w in windows {
            self.relist_apply(w);
        }
        self.end_relist();
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}

/// What the pin keeps of a Deployment: its labels and its saved count.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeploymentMeta {
    pub labels: Option<BTreeMap<String, String>>,
    /// Only `handoff.dev/replicas-before-move`, when present.
    pub annotations: Option<BTreeMap<String, String>>,
}

impl DeploymentMeta {
    pub fn new(
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Self {
        DeploymentMeta {
            labels: labels.filter(|l| !l.is_empty()).cloned(),
            annotations: annotations
                .and_then(|a| a.get(SAVED_REPLICAS_ANNOTATION))
                .map(|v| BTreeMap::from([(SAVED_REPLICAS_ANNOTATION.to_string(), v.clone())])),
        }
    }
}

type DeploymentKey = (Box<str>, Box<str>);

/// Deployments by namespace and name, for resolving the parent of a scale request.
#[derive(Default)]
pub struct DeploymentCache {
    map: RwLock<HashMap<DeploymentKey, Arc<DeploymentMeta>>>,
    relist: RwLock<Option<HashMap<DeploymentKey, Arc<DeploymentMeta>>>>,
    synced: AtomicBool,
}

fn key(ns: &str, name: &str) -> DeploymentKey {
    (ns.into(), name.into())
}

impl DeploymentCache {
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<DeploymentMeta>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key(ns, name))
            .cloned()
    }

    pub fn upsert(&self, ns: &str, name: &str, meta: DeploymentMeta) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(ns, name), Arc::new(meta));
    }

    /// Insert unless the cache already has an entry (a fetch must not undo a newer event).
    pub fn insert_if_absent(&self, ns: &str, name: &str, meta: DeploymentMeta) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key(ns, name))
            .or_insert_with(|| Arc::new(meta));
    }

    pub fn remove(&self, ns: &str, name: &str) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(ns, name));
    }

    pub fn begin_relist(&self) {
        *self.relist.write().unwrap_or_else(|e| e.into_inner()) = Some(HashMap::new());
    }

    pub fn relist_apply(&self, ns: &str, name: &str, meta: DeploymentMeta) {
        let mut relist = self.relist.write().unwrap_or_else(|e| e.into_inner());
        match relist.as_mut() {
            Some(buf) => {
                buf.insert(key(ns, name), Arc::new(meta));
            }
            None => {
                drop(relist);
                self.upsert(ns, name, meta);
            }
        }
    }

    pub fn end_relist(&self) {
        if let Some(buf) = self
            .relist
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            *self.map.write().unwrap_or_else(|e| e.into_inner()) = buf;
        }
        self.synced.store(true, Ordering::Release);
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// How many Deployments the open windows select now (for the metrics gauge).
    pub fn count_selected(&self, windows: &[OpenWindow]) -> usize {
        if windows.is_empty() {
            return 0;
        }
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|d| {
                windows
                    .iter()
                    .any(|w| w.selector.matches(d.labels.as_ref()))
            })
            .count()
    }
}
