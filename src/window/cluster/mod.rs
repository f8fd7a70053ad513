//! A cluster as the commands read and write it: the clusters, the errors, reading the selected
//! Deployments and recording progress in the window's status; beside it, what of handoff
//! guards a cluster (`installed`, `window_webhook`), its Leases, standbys and pods, the
//! preflight and `handoff window status`.

pub mod installed;
pub(crate) mod lease;
pub(crate) mod pod_watch;
pub(crate) mod preflight;
pub(crate) mod standby;
pub(crate) mod status;
pub mod window_webhook;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::{Timestamp, Unit};
use kube::Api;
use kube::api::{ApiResource, ListParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde_json::json;

use crate::resources::move_window::{
    MoveRole, MoveWindow, MoveWindowStatus, PinnedDeployment, WindowState,
};
use crate::rules::move_window::{HANDOFF_NAMESPACE, OwnDeployment, PIN_DEPLOYMENT};
use crate::rules::selector::Selector;

/// One cluster a command acts on.
#[derive(Clone)]
pub struct Cluster {
    /// What messages call it: from its role, never a string a caller could misspell.
    pub label: Label,
    pub client: kube::Client,
    pub role: Option<MoveRole>,
    written: Written,
    /// The API of each CRD as first read this run (`None`: not installed): read once, not
    /// once per object written.
    crds: Arc<Mutex<HashMap<String, Option<ApiResource>>>>,
    /// What of handoff guards this cluster, as first surveyed this run (`installed::survey`):
    /// nothing a run writes changes it.
    surveyed: Arc<Mutex<Option<Present>>>,
}

impl Cluster {
    pub fn new(client: kube::Client, role: Option<MoveRole>) -> Self {
        Cluster {
            label: Label::of(role),
            client,
            role,
            written: Written::default(),
            crds: Arc::default(),
            surveyed: Arc::default(),
        }
    }

    pub fn surveyed(&self) -> Option<Present> {
        *self.surveyed.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn survey_read(&self, p: Present) {
        *self.surveyed.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    /// The UID of window `name` as this run last read or wrote it.
    pub fn window_uid(&self, name: &str) -> Option<String> {
        self.written.get(name).and_then(|w| w.metadata.uid)
    }

    pub fn crd_known(&self, crd: &str) -> Option<Option<ApiResource>> {
        self.crds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(crd)
            .cloned()
    }

    pub fn crd_read(&self, crd: &str, ar: Option<ApiResource>) {
        let mut m = self.crds.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(crd.to_string(), ar);
    }
}

/// Each window as this run last read or wrote it: `record` writes over it without reading
/// first, and the API server's resourceVersion check (409) sends it back to read whenever
/// anyone else wrote since. One request per recorded step, not two.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<HashMap<String, MoveWindow>>>);

impl Written {
    fn get(&self, name: &str) -> Option<MoveWindow> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    fn put(&self, w: &MoveWindow) {
        if let Some(name) = &w.metadata.name {
            let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
            m.insert(name.clone(), w.clone());
        }
    }

    fn forget(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }
}

/// A Deployment whose pods back a webhook that fails closed. It lives beside the error that
/// carries it (`WindowError::Preflight`), not in `preflight`, which finds it: `preflight` uses
/// this module, so this module must not use `preflight`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub cluster: Label,
    pub deployment: String,
    pub service: String,
    pub hook: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: Deployment {} backs Service {}, used by {}",
            self.cluster, self.deployment, self.service, self.hook
        )
    }
}

/// What a message calls a cluster: the one of `handoff window` without `--source` and
/// `--target`, or one of a move's two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Label {
    Cluster,
    Source,
    Target,
}

impl Label {
    pub fn of(role: Option<MoveRole>) -> Label {
        match role {
            None => Label::Cluster,
            Some(MoveRole::Source) => Label::Source,
            Some(MoveRole::Target) => Label::Target,
        }
    }
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Cluster => "cluster",
            Label::Source => "source",
            Label::Target => "target",
        }
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The clusters an error is about: one, or each a step acted on (`target+source`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct On(pub Vec<Label>);

impl On {
    /// Whether the error is about this cluster alone (the API server to name).
    pub fn only(&self, l: Label) -> bool {
        self.0 == [l]
    }
}

impl From<Label> for On {
    fn from(l: Label) -> On {
        On(vec![l])
    }
}

impl std::fmt::Display for On {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, l) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            write!(f, "{l}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    #[error("{cluster}: {action}: {source}{}", handoff_webhook_down(.source))]
    Api {
        cluster: On,
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "preflight: these Deployments hold no leader-election Lease, so they would be pinned to 0 replicas, and that stops webhooks that fail closed: API requests they serve will be rejected until the window closes:\n{}\nre-run with --allow-webhook-outage to open the window anyway",
        .0.iter().map(|f| format!("  {f}")).collect::<Vec<_>>().join("\n")
    )]
    Preflight(Vec<Finding>),
    #[error("{cluster}: {message}")]
    Refused { cluster: On, message: String },
    /// A move the planner refused to start or go on with, as it said.
    #[error("{cluster}: {why}")]
    MoveRefused {
        cluster: Label,
        why: crate::window::plan::move_plan::Refusal,
    },
    /// A Deployment, or its Lease, a window may not stop, write or release, as `plan::stop`
    /// said.
    #[error("{cluster}: {}{why}", .deployment.as_ref().map(|d| format!("{d}: ")).unwrap_or_default())]
    StopRefused {
        cluster: On,
        /// The Deployment it is about, where `why` does not name it.
        deployment: Option<String>,
        why: Box<crate::window::plan::stop::StopRefusal>,
    },
    /// A backup its planner refused, as it said.
    #[error("{cluster}: {why}")]
    DirectoryRefused {
        cluster: Label,
        why: crate::window::plan::directory_plan::DirectoryRefusal,
    },
    /// A whole management cluster's move its planner refused, as it said.
    #[error("{cluster}: {why}")]
    WholeRefused {
        cluster: Label,
        why: crate::window::plan::all_next::WholeRefusal,
    },
    /// A `window open` or `window close` its planner refused, as it said.
    #[error("{cluster}: {why}")]
    WindowRefused {
        cluster: On,
        why: crate::window::plan::window_next::WindowRefusal,
    },
    /// Where a command needs SIGINT and SIGTERM caught (from a move's checks until clusterctl
    /// is done) and cannot, it writes nothing more.
    #[error("handoff: {0}")]
    CannotCatch(#[from] crate::window::runner::CannotCatch),
    /// A backup that failed and was put back: why, as recorded.
    #[error("{0}")]
    Failed(String),
    /// `handoff move`: clusterctl failed; `help` says what is left and the ways on.
    #[error("{help}")]
    Clusterctl { code: i32, help: String },
    #[error(
        "{cluster}: timed out after {after:?} {what}; the window stays as it is: run the same command again to resume"
    )]
    Timeout {
        cluster: On,
        after: Duration,
        what: String,
    },
}

pub type Result<T> = std::result::Result<T, WindowError>;

/// The clusters an error is about, as one label (`target+source`).
pub fn labels<'a>(clusters: impl IntoIterator<Item = &'a Cluster>) -> On {
    On(clusters.into_iter().map(|c| c.label).collect())
}

/// What to do when the API server refused a write because one of handoff's own fail-closed
/// webhooks did not answer (the handoff-pin Deployment is down): they hold what a window holds,
/// against everyone, this command included, until they answer again. Empty for anything else.
pub fn handoff_webhook_down(e: &kube::Error) -> String {
    let kube::Error::Api(s) = e else {
        return String::new();
    };
    let held = match () {
        _ if !s.message.contains("failed calling webhook") => return String::new(),
        _ if s.message.contains("lease-hold.handoff.dev") => "a Lease a window holds",
        _ if s.message.contains("move-window.handoff.dev") => "a Cluster API provider's Deployment",
        _ => return String::new(),
    };
    let (ns, pin) = (HANDOFF_NAMESPACE, PIN_DEPLOYMENT);
    format!(
        "\nhandoff's webhook is not answering (the {pin} Deployment), and it fails closed: nobody can change {held} until it answers again, this command included; what the window holds stays held meanwhile. Bring it back (kubectl -n {ns} rollout status deployment/{pin}; its pods' logs say why it is down), then run the same command again"
    )
}

pub fn api_err(c: &Cluster, action: impl Into<String>) -> impl FnOnce(kube::Error) -> WindowError {
    let cluster = c.label.into();
    let action = action.into();
    move |source| WindowError::Api {
        cluster,
        action,
        source,
    }
}

pub fn now() -> String {
    Timestamp::now()
        .round(Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| Timestamp::now().to_string())
}

pub fn dep_key(d: &Deployment) -> (String, String) {
    (
        d.metadata.namespace.clone().unwrap_or_default(),
        d.metadata.name.clone().unwrap_or_default(),
    )
}

pub async fn selected_deployments(
    c: &Cluster,
    selector: &Selector,
    own: &OwnDeployment,
) -> Result<Vec<Deployment>> {
    let api: Api<Deployment> = Api::all(c.client.clone());
    let list = api
        .list(&ListParams::default().labels(&selector.to_string()))
        .await
        .map_err(api_err(c, "listing Deployments"))?;
    let mut items: Vec<Deployment> = list
        .items
        .into_iter()
        // The API server filtered already; filtering again guards against a server that
        // ignored the selector, since pinning the wrong controller is not undoable.
        .filter(|d| selector.matches(d.metadata.labels.as_ref()))
        .filter(|d| {
            let (ns, name) = dep_key(d);
            !(ns == own.namespace && name == own.name)
        })
        .collect();
    items.sort_by_key(dep_key);
    Ok(items)
}

/// The window `name`, if it exists.
pub async fn read_window(c: &Cluster, name: &str) -> Result<Option<MoveWindow>> {
    let w = match Api::<MoveWindow>::all(c.client.clone()).get(name).await {
        Ok(w) => Some(w),
        // No such window, or no MoveWindow CRD at all (nothing of handoff installed: the
        // window brings it, `installed::ensure_crd`).
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(e) => return Err(api_err(c, format!("reading MoveWindow {name}"))(e)),
    };
    match &w {
        Some(w) => c.written.put(w),
        None => c.written.forget(name),
    }
    Ok(w)
}

/// Each cluster's window `name`, as a driver reads them before its first step.
pub async fn read_windows(clusters: &[Cluster], name: &str) -> Result<Vec<Option<MoveWindow>>> {
    let mut windows = Vec::new();
    for c in clusters {
        windows.push(read_window(c, name).await?);
    }
    Ok(windows)
}

/// Set `spec.state`.
pub async fn set_state(c: &Cluster, name: &str, state: WindowState) -> Result<()> {
    let w = Api::<MoveWindow>::all(c.client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"state": state}})),
        )
        .await
        .map_err(api_err(c, format!("setting MoveWindow {name} {state:?}")))?;
    c.written.put(&w);
    Ok(())
}

/// Change the window's status with `f` and write the whole status back, over the window as
/// this run last saw it (read first where it has not).
pub async fn record(
    c: &Cluster,
    name: &str,
    f: impl Fn(&mut MoveWindowStatus),
) -> Result<MoveWindowStatus> {
    let api: Api<MoveWindow> = Api::all(c.client.clone());
    // Read-modify-write guarded by the resourceVersion the read returned: a concurrent run of
    // another command makes this one read again instead of overwriting what the other
    // recorded. A replace, not a merge patch: what `f` cleared is gone.
    for attempt in 0..5 {
        let mut w = match c.written.get(name).filter(|_| attempt == 0) {
            Some(w) => w,
            None => api
                .get(name)
                .await
                .map_err(api_err(c, format!("reading MoveWindow {name}")))?,
        };
        let mut status = w.status.take().unwrap_or_default();
        // Nothing is written over a record this version cannot read.
        let unknown = status
            .phase
            .as_ref()
            .and_then(|p| p.known(name).err())
            .or_else(|| status.move_record.as_ref()?.phase.known(name).err());
        if let Some(e) = unknown {
            return Err(WindowError::Refused {
                cluster: c.label.into(),
                message: e.to_string(),
            });
        }
        f(&mut status);
        status.pinned_count = status.pinned.len() as i32;
        w.status = Some(status.clone());
        match api.replace_status(name, &PostParams::default(), &w).await {
            Ok(written) => {
                c.written.put(&written);
                return Ok(status);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                c.written.forget(name);
                continue;
            }
            Err(e) => {
                return Err(api_err(c, format!("recording status of MoveWindow {name}"))(e));
            }
        }
    }
    Err(WindowError::Refused {
        cluster: c.label.into(),
        message: format!("MoveWindow {name} kept changing under us; run the command again"),
    })
}

/// The window's record of `ns/name`, to change.
pub fn pinned_mut<'a>(
    status: &'a mut MoveWindowStatus,
    ns: &str,
    name: &str,
) -> Option<&'a mut PinnedDeployment> {
    status
        .pinned
        .iter_mut()
        .find(|p| p.namespace == ns && p.name == name)
}

pub fn upsert_pinned(status: &mut MoveWindowStatus, entry: PinnedDeployment) {
    match status
        .pinned
        .iter_mut()
        .find(|p| p.namespace == entry.namespace && p.name == entry.name)
    {
        Some(p) => *p = entry,
        None => {
            status.pinned.push(entry);
            status
                .pinned
                .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::handoff_webhook_down;

    #[test]
    fn a_refusal_by_handoffs_own_webhook_says_what_to_do() {
        let refused = |message: &str| {
            let mut s = kube::core::Status::failure(message, "InternalError");
            s.code = 500;
            kube::Error::Api(Box::new(s))
        };
        let hint = handoff_webhook_down(&refused(
            r#"Internal error occurred: failed calling webhook "lease-hold.handoff.dev": failed to call webhook: Post "https://handoff-pin.handoff-system.svc:443/validate/lease-hold?timeout=5s": dial tcp 10.96.0.12:443: connect: connection refused"#,
        ));
        assert!(
            hint.contains("a Lease a window holds") && hint.contains("handoff-pin"),
            "{hint}"
        );
        assert!(
            handoff_webhook_down(&refused(
                r#"failed calling webhook "move-window.handoff.dev": x"#
            ))
            .contains("provider's Deployment")
        );
        assert_eq!(
            handoff_webhook_down(&refused(
                r#"failed calling webhook "validation.cluster.x-k8s.io": x"#
            )),
            ""
        );
        assert_eq!(
            handoff_webhook_down(&refused("leases.coordination.k8s.io \"l\" not found")),
            ""
        );
    }
}

/// What guards a cluster's windows already, and what its API server serves (surveyed by
/// `installed::survey`, kept on the `Cluster` for the run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Present {
    /// handoff's `lease-hold.handoff.dev` webhook, or its `handoff-lease-hold` policy.
    pub lease_guard: bool,
    /// handoff's `move-window.handoff.dev` webhook, or its pin policy.
    pub pin: bool,
    pub serves_vap: bool,
    pub serves_map: bool,
}
