//! The source's Clusters, watched while clusterctl runs: its pause is seen the moment it is
//! written, and waiting for it costs no request (listing them each second did, and listing
//! every moved kind with them: about twenty requests a second).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use kube::Api;
use kube::api::DynamicObject;
use kube::runtime::watcher::{self, Event};
use tokio::task::JoinHandle;

use super::cluster_api::{CLUSTERS, resource, seen};
use crate::window::cluster::{Cluster, Result};
use crate::window::plan::move_plan::ClusterSeen;

/// The Clusters as last listed and watched; `None` until the first listing is in.
type View = Arc<Mutex<Option<BTreeMap<String, ClusterSeen>>>>;

pub struct PauseWatch {
    view: View,
    /// The first error the watch met (a watch the user may not make, a dropped connection):
    /// from then on the Clusters are listed instead, as before the watch.
    failed: Arc<Mutex<Option<String>>>,
    task: Option<JoinHandle<()>>,
}

impl Drop for PauseWatch {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

impl PauseWatch {
    /// Watch the Clusters of `ns` (none where Cluster API's CRD is not installed).
    pub async fn start(c: &Cluster, ns: &str) -> Result<PauseWatch> {
        let view: View = Arc::new(Mutex::new(None));
        let Some(ar) = resource(c, CLUSTERS).await? else {
            *view.lock().unwrap_or_else(|e| e.into_inner()) = Some(BTreeMap::new());
            return Ok(PauseWatch {
                view,
                failed: Arc::default(),
                task: None,
            });
        };
        let api = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar);
        let failed = Arc::new(Mutex::new(None));
        let task = tokio::spawn(watch(api, ns.to_string(), view.clone(), failed.clone()));
        Ok(PauseWatch {
            view,
            failed,
            task: Some(task),
        })
    }

    /// Why the watch cannot be relied on, once it has failed.
    pub fn failed(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The Clusters, sorted by key, once listed.
    pub fn clusters(&self) -> Option<Vec<ClusterSeen>> {
        let view = self.view.lock().unwrap_or_else(|e| e.into_inner());
        view.as_ref().map(|m| m.values().cloned().collect())
    }
}

async fn watch(
    api: Api<DynamicObject>,
    ns: String,
    view: View,
    failed: Arc<Mutex<Option<String>>>,
) {
    // A listing under way is built aside: until it is done the last view stands.
    let mut listing = BTreeMap::new();
    let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = events.next().await {
        let set = |f: &dyn Fn(&mut BTreeMap<String, ClusterSeen>)| {
            if let Some(m) = view.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                f(m);
            }
        };
        match ev {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(o)) => {
                let s = seen(&o, &ns);
                listing.insert(s.key.clone(), s);
            }
            Ok(Event::InitDone) => {
                *view.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(std::mem::take(&mut listing));
            }
            Ok(Event::Apply(o)) => {
                let s = seen(&o, &ns);
                set(&|m| {
                    m.insert(s.key.clone(), s.clone());
                });
            }
            Ok(Event::Delete(o)) => {
                let key = seen(&o, &ns).key;
                set(&|m| {
                    m.remove(&key);
                });
            }
            Err(e) => {
                failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(|| e.to_string());
                return;
            }
        }
    }
}
