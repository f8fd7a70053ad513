//! Open MoveWindows and the Deployments they may select, as the pin reads them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use super::cache::Projected;

use crate::resources::move_window::{MoveWindow, Strategy};
use crate::rules::move_window::{OpenWindow, PinnedRef, SAVED_REPLICAS_ANNOTATION};

/// What the cache keeps of one MoveWindow.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Closed,
    Open(OpenWindow, Vec<PinnedRef>, Gauges),
    /// Open, with a `deploymentSelector` that does not parse: the reason.
    Invalid(String, Vec<PinnedRef>, Gauges),
}

/// What `/metrics` shows of an open window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gauges {
    pub name: String,
    /// `status.openedAt`, Unix seconds.
    pub opened_at: Option<i64>,
    /// Leases it holds (recorded, not released).
    pub held_leases: usize,
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
    /// Every open window, for `/metrics`.
    pub gauges: Vec<Gauges>,
}

/// Every MoveWindow by name; the open ones compiled for the pin.
#[derive(Default)]
pub struct WindowCache {
    all: Projected<String, Entry>,
    /// Rebuilt on every change.
    snapshot: RwLock<Arc<WindowSnapshot>>,
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
                    lease_stopped: p.strategy() == Strategy::Lease,
                })
                .collect()
        })
        .unwrap_or_default();
    let status = w.status.as_ref();
    let gauges = Gauges {
        name: name.clone(),
        opened_at: status
            .and_then(|s| s.opened_at.as_deref())
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_second()),
        held_leases: status
            .map(|s| {
                s.pinned
                    .iter()
                    .filter(|p| p.restored_at.is_none())
                    .flat_map(|p| &p.leases)
                    .filter(|l| l.released_at.is_none())
                    .count()
            })
            .unwrap_or(0),
    };
    match w.spec.selector() {
        Ok(selector) => Entry::Open(OpenWindow { name, selector }, pinned, gauges),
        Err(e) => {
            tracing::error!(window = %name, error = %e, "open MoveWindow has an invalid deploymentSelector");
            Entry::Invalid(
                format!("MoveWindow \"{name}\" is open but its spec.{e}"),
                pinned,
                gauges,
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

    fn publish(&self) {
        let snap = self
            .all
            .fold(WindowSnapshot::default(), |mut snap, (_, e)| {
                match e {
                    Entry::Open(w, pinned, g) => {
                        snap.open.push(w.clone());
                        snap.pinned.extend(pinned.iter().cloned());
                        snap.gauges.push(g.clone());
                    }
                    Entry::Invalid(why, pinned, g) => {
                        snap.invalid.push(why.clone());
                        snap.pinned.extend(pinned.iter().cloned());
                        snap.gauges.push(g.clone());
                    }
                    Entry::Closed => {}
                }
                snap
            });
        // In name order, as the BTreeMap this cache used to be kept them: when two open
        // windows select one Deployment, the same one names the pin every time.
        let mut snap = snap;
        snap.open.sort_by(|a, b| a.name.cmp(&b.name));
        snap.invalid.sort();
        snap.gauges.sort_by(|a, b| a.name.cmp(&b.name));
        snap.pinned.sort_by(|a, b| {
            (&a.window, &a.namespace, &a.name).cmp(&(&b.window, &b.namespace, &b.name))
        });
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snap);
    }

    pub fn upsert(&self, w: &MoveWindow) {
        self.all
            .upsert(w.metadata.name.clone().unwrap_or_default(), compile(w));
        self.publish();
    }

    pub fn remove(&self, name: &str) {
        self.all.remove(name);
        self.publish();
    }

    pub fn begin_relist(&self) {
        self.all.begin_relist();
    }

    pub fn relist_apply(&self, w: &MoveWindow) {
        self.all
            .relist_apply(w.metadata.name.clone().unwrap_or_default(), compile(w));
    }

    pub fn end_relist(&self) {
        self.all.end_relist();
        self.publish();
    }

    pub fn replace_all<'a>(&self, windows: impl IntoIterator<Item = &'a MoveWindow>) {
        self.all.replace_all(
            windows
                .into_iter()
                .map(|w| (w.metadata.name.clone().unwrap_or_default(), compile(w))),
        );
        self.publish();
    }

    pub fn is_synced(&self) -> bool {
        self.all.is_synced()
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
pub struct DeploymentCache(Projected<DeploymentKey, Arc<DeploymentMeta>>);

fn key(ns: &str, name: &str) -> DeploymentKey {
    (ns.into(), name.into())
}

impl DeploymentCache {
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<DeploymentMeta>> {
        self.0.get(&key(ns, name))
    }

    pub fn upsert(&self, ns: &str, name: &str, meta: DeploymentMeta) {
        self.0.upsert(key(ns, name), Arc::new(meta));
    }

    /// Insert unless the cache already has an entry (a read must not undo a newer event).
    pub fn insert_if_absent(&self, ns: &str, name: &str, meta: DeploymentMeta) {
        self.0.insert_if_absent(key(ns, name), Arc::new(meta));
    }

    pub fn remove(&self, ns: &str, name: &str) {
        self.0.remove(&key(ns, name));
    }

    pub fn begin_relist(&self) {
        self.0.begin_relist();
    }

    pub fn relist_apply(&self, ns: &str, name: &str, meta: DeploymentMeta) {
        self.0.relist_apply(key(ns, name), Arc::new(meta));
    }

    pub fn end_relist(&self) {
        self.0.end_relist();
    }

    pub fn is_synced(&self) -> bool {
        self.0.is_synced()
    }

    /// How many Deployments the open windows select now (for the metrics gauge).
    pub fn count_selected(&self, windows: &[OpenWindow]) -> usize {
        if windows.is_empty() {
            return 0;
        }
        self.0.fold(0, |n, (_, d)| {
            n + usize::from(
                windows
                    .iter()
                    .any(|w| w.selector.matches(d.labels.as_ref())),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::move_window::{MoveWindowSpec, WindowState};

    fn window(name: &str) -> MoveWindow {
        MoveWindow::new(
            name,
            MoveWindowSpec {
                state: WindowState::Open,
                deployment_selector: None,
                reason: None,
                role: None,
                stop: None,
            },
        )
    }

    /// Two open windows selecting one Deployment: the pin names the same one every time,
    /// whatever order the watch delivered them in.
    #[test]
    fn open_windows_come_in_name_order() {
        let names = ["move-c", "move-a", "move-d", "move-b"];
        let c = WindowCache::default();
        c.replace_all(&names.map(window));
        let open: Vec<String> = c.snapshot().open.iter().map(|w| w.name.clone()).collect();
        assert_eq!(open, ["move-a", "move-b", "move-c", "move-d"]);
        c.upsert(&window("move-0"));
        assert_eq!(c.snapshot().open[0].name, "move-0");
    }
}
