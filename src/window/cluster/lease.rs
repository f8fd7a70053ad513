//! The Lease strategy's reads and writes: find a Deployment's Leases, take them, prove the
//! former leaders stopped, release them and wait for a pod to lead again. What to write comes
//! from `plan`.

use crate::window::progress::Progress;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

use crate::resources::move_window::HeldLease;
use crate::window::cluster::{Cluster, Result, WindowError, api_err};
use crate::window::plan::stop::{self, LeaseSeen, TakePlan};

/// Every Lease in `ns`, as the plan reads them.
pub async fn leases_in(c: &Cluster, ns: &str) -> Result<Vec<LeaseSeen>> {
    let list = Api::<Lease>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, format!("listing Leases in {ns}")))?;
    Ok(list.items.iter().map(LeaseSeen::from_lease).collect())
}

async fn read(c: &Cluster, ns: &str, name: &str) -> Result<Option<LeaseSeen>> {
    Ok(Api::<Lease>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_err(c, format!("reading Lease {ns}/{name}")))?
        .as_ref()
        .map(LeaseSeen::from_lease))
}

/// Who this client is, as the API server authenticates it: the window's operator, the only
/// user the held Leases' guard lets write them.
pub async fn whoami(c: &Cluster) -> Result<String> {
    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
        "metadata": {},
    }))
    .expect("a SelfSubjectReview");
    let answer = Api::<SelfSubjectReview>::all(c.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(api_err(
            c,
            "asking who we are (SelfSubjectReview, authentication.k8s.io/v1, Kubernetes 1.28+)",
        ))?;
    answer
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| WindowError::Refused {
            cluster: c.label.into(),
            message: "the API server's SelfSubjectReview names no user, so a held Lease could name no operator".into(),
        })
}

/// How long a Lease write that keeps losing to its leader's renewals (409) is tried again. A
/// conflict means the leader renewed between the read and the write: it is alive, and renews
/// every retry period (2 s for Cluster API's managers), so the write wins as soon as a read and
/// a write fit between two renewals. A count of tries can lose that race on a busy API server
/// (five in a row were lost at a load of 60); a minute of tries does not.
struct ConflictBudget(std::time::Instant);

impl ConflictBudget {
    const FOR: Duration = Duration::from_secs(60);

    fn new() -> Self {
        ConflictBudget(std::time::Instant::now() + Self::FOR)
    }

    fn left(&self) -> bool {
        std::time::Instant::now() < self.0
    }
}

/// Take one Lease for `window`; returns what the window records of it. A write that loses to
/// a candidate acquiring at the same moment (409) reads again and takes it from the new
/// holder.
pub async fn take(
    c: &Cluster,
    ns: &str,
    name: &str,
    window: &str,
    operator: &str,
    out: &mut Progress,
) -> Result<HeldLease> {
    let api = Api::<Lease>::namespaced(c.client.clone(), ns);
    let conflicts = ConflictBudget::new();
    loop {
        let Some(l) = read(c, ns, name).await? else {
            return Err(WindowError::Refused {
                cluster: c.label.into(),
                message: format!(
                    "Lease {ns}/{name} is gone since the window chose it; run the command again to choose anew"
                ),
            });
        };
        let now = Timestamp::now();
        match stop::take_plan(&l, window, operator, now) {
            TakePlan::AlreadyHeld {
                former_holder,
                former_duration,
            } => {
                out.say(format!("{}: Lease {ns}/{name} already held", c.label));
                return Ok(HeldLease {
                    name: name.into(),
                    former_holder,
                    former_lease_duration_seconds: former_duration,
                    ..HeldLease::default()
                });
            }
            TakePlan::Refuse(why) => {
                return Err(WindowError::StopRefused {
                    cluster: c.label.into(),
                    deployment: None,
                    why: Box::new(why),
                });
            }
            TakePlan::Take {
                patch,
                former_holder,
                former_duration,
            } => match api
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {
                    // The clock after the write: the take-over happened no later than this.
                    let held = ceil_second(Timestamp::now());
                    out.say(format!("{}: took Lease {ns}/{name} from {} (its leader may lead for up to {former_duration}s more)",
                        c.label,
                        if former_holder.is_empty() {
                            "nobody"
                        } else {
                            &former_holder
                        }));
                    return Ok(HeldLease {
                        name: name.into(),
                        former_holder,
                        former_lease_duration_seconds: former_duration,
                        held_since: Some(held.to_string()),
                        ..HeldLease::default()
                    });
                }
                Err(kube::Error::Api(e)) if e.code == 409 && conflicts.left() => continue,
                Err(kube::Error::Api(e)) if e.code == 409 => break,
                Err(e) => return Err(api_err(c, format!("taking Lease {ns}/{name}"))(e)),
            },
        }
    }
    Err(WindowError::Refused {
        cluster: c.label.into(),
        message: format!("Lease {ns}/{name} kept changing under us; run the command again"),
    })
}

/// What `release` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// The window held it, and wrote it free.
    Freed,
    /// Nothing of the window's on it (released already, or gone).
    AlreadyFree,
    /// Someone else holds it since (the holder identity, empty when nobody does): never
    /// written free over them; only the window's label and annotations come off.
    TakenBack(String),
}

/// Release one Lease if `window` holds it (by its holder identity, not its label).
pub async fn release(c: &Cluster, ns: &str, name: &str, window: &str) -> Result<Released> {
    let api = Api::<Lease>::namespaced(c.client.clone(), ns);
    let conflicts = ConflictBudget::new();
    loop {
        let Some(l) = read(c, ns, name).await? else {
            return Ok(Released::AlreadyFree);
        };
        let (patch, done) = if l.window() == Some(window) {
            (stop::release_patch(&l, Timestamp::now()), Released::Freed)
        } else if let Some((w, holder)) = l.taken_back()
            && w == window
        {
            (
                stop::strip_patch(&l),
                Released::TakenBack(holder.to_string()),
            )
        } else {
            return Ok(Released::AlreadyFree);
        };
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => return Ok(done),
            Err(kube::Error::Api(e)) if e.code == 409 && conflicts.left() => continue,
            Err(kube::Error::Api(e)) if e.code == 409 => break,
            Err(e) => return Err(api_err(c, format!("releasing Lease {ns}/{name}"))(e)),
        }
    }
    Err(WindowError::Refused {
        cluster: c.label.into(),
        message: format!("Lease {ns}/{name} kept changing under us; run the command again"),
    })
}

/// Who holds a Lease the window took, when it is not the window any more: `Some(holder)`
/// (empty: nobody, or the Lease is gone), `None` while the window holds it.
pub async fn taken_from(c: &Cluster, ns: &str, name: &str, window: &str) -> Result<Option<String>> {
    Ok(match read(c, ns, name).await? {
        Some(l) if l.window() == Some(window) => None,
        Some(l) => Some(l.holder),
        None => Some(String::new()),
    })
}

/// Every Lease, in any namespace, that still names `window` as its holder (by the label). An
/// operator whose Lease rights are per namespace may not list cluster-wide: then it says so.
pub async fn held_anywhere(
    c: &Cluster,
    window: &str,
    out: &mut Progress,
) -> Result<Vec<(String, String)>> {
    let selector = format!("{}={window}", crate::rules::lease_hold::HELD_BY_LABEL);
    match Api::<Lease>::all(c.client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
    {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .filter_map(|l| Some((l.metadata.namespace?, l.metadata.name?)))
            .collect()),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            out.say(format!("{}: cannot list Leases cluster-wide to find any that MoveWindow {window} still holds ({}); kubectl get leases -A -l {selector} as an admin shows them",
                c.label, e.message));
            Ok(vec![])
        }
        Err(e) => Err(api_err(c, "listing Leases")(e)),
    }
}

/// The pod of `deployment` that leads with the Lease now.
pub async fn leader(c: &Cluster, ns: &str, name: &str, deployment: &str) -> Result<Option<String>> {
    Ok(read(c, ns, name)
        .await?
        .and_then(|l| stop::leader_of(&l, deployment).map(str::to_string)))
}

/// The window that holds it now, by its holder identity; that identity; and the window a hold
/// taken back still names by its label (for `status`).
pub async fn held_by(
    c: &Cluster,
    ns: &str,
    name: &str,
) -> Result<(Option<String>, String, Option<String>)> {
    Ok(read(c, ns, name)
        .await?
        .map(|l| {
            let back = l.taken_back().map(|(w, _)| w.to_string());
            (l.window().map(str::to_string), l.holder, back)
        })
        .unwrap_or_default())
}

/// Rounded up: a proof of stop computed from it errs late, never early.
fn ceil_second(t: Timestamp) -> Timestamp {
    let whole = Timestamp::from_second(t.as_second()).unwrap_or(t);
    match whole < t {
        true => Timestamp::from_second(t.as_second() + 1).unwrap_or(t),
        false => whole,
    }
}
