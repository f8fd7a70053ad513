//! A watch of one former leader's Pod from its take-over on, collecting what the API server
//! reports of it (`proof::PodReport`), so that `prove` can tell the moment the kubelet
//! reported its end. A watch, not reads: the kubelet's last status of a deleted Pod lives only
//! in the watch events before its DELETED (and in that event's object); a read after it finds
//! nothing. A report lost to a dropped watch (its relist finds the Pod gone) is lost for good:
//! the proof falls back to the Lease's bound and says so.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::watcher::{self, Event};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::window::cluster::Cluster;
use crate::window::plan::proof::{PodReport, report};

/// How long the take-over waits for the watch's first listing before it deletes the Pod (a
/// watch that starts after the delete may miss the end; then the bound holds).
const LISTED_WITHIN: Duration = Duration::from_secs(5);

pub struct PodWatch {
    reports: Arc<Mutex<Vec<PodReport>>>,
    task: JoinHandle<()>,
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PodWatch {
    /// Watch Pod `ns/name`; returns once its first listing is in (or `LISTED_WITHIN` passed).
    pub async fn start(c: &Cluster, ns: &str, name: &str) -> PodWatch {
        let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let reports = Arc::new(Mutex::new(Vec::new()));
        let (listed, on_listed) = oneshot::channel();
        let task = tokio::spawn(watch(api, config, reports.clone(), listed));
        let _ = tokio::time::timeout(LISTED_WITHIN, on_listed).await;
        PodWatch { reports, task }
    }

    pub fn reports(&self) -> Vec<PodReport> {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Ends where the watch is forbidden; `listed` is sent then too (dropped), so that the
/// take-over never waits on it.
async fn watch(
    api: Api<Pod>,
    config: watcher::Config,
    reports: Arc<Mutex<Vec<PodReport>>>,
    listed: oneshot::Sender<()>,
) {
    let mut listed = Some(listed);
    let push = |r: PodReport| {
        reports.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    };
    // Whether the listing under way has found the Pod.
    let mut found = false;
    let mut events = watcher::watcher(api, config).boxed();
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Init) => found = false,
            Ok(Event::InitApply(p) | Event::Apply(p)) => {
                found = true;
                push(report(&p, Timestamp::now()));
            }
            Ok(Event::InitDone) => {
                if !found {
                    push(PodReport::Gone {
                        at: Timestamp::now(),
                    });
                }
                if let Some(tx) = listed.take() {
                    let _ = tx.send(());
                }
            }
            Ok(Event::Delete(p)) => {
                push(report(&p, Timestamp::now()));
                push(PodReport::Gone {
                    at: Timestamp::now(),
                });
            }
            // Not allowed to watch Pods (an operator role from before handoff watched them):
            // what was listed stays, and the bound proves the stop; the take-over goes on.
            Err(watcher::Error::WatchFailed(kube::Error::Api(e)))
            | Err(watcher::Error::InitialListFailed(kube::Error::Api(e)))
                if e.code == 403 =>
            {
                break;
            }
            // The stream lists again after an error; a pause keeps a failing API server from
            // being asked in a tight loop.
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
