//! What of handoff a cluster has, and what a window puts in place itself where it has nothing:
//! `handoff window open` and `handoff move` need no installation. With the rights of a
//! clusterctl user, a window brings along
//! - the MoveWindow CRD, for its record, where it is not served: created labelled as handoff's
//!   window-installed CRD and annotated with the windows that use it (`WINDOWS_ANNOTATION`),
//!   so that two moves of different namespaces share it and the last one to finish removes it
//!   (its delete carries the resourceVersion of the last registration it saw: a window that
//!   registers meanwhile makes it fail, and the CRD stays);
//! - the held-Lease guard and the pin, as admission policies of its own
//!   (`admission_policy::per_window`), where no webhook or policy of handoff's guards them and
//!   the API server serves the policy kinds (ValidatingAdmissionPolicy since Kubernetes 1.30,
//!   MutatingAdmissionPolicy since 1.36, both `admissionregistration.k8s.io/v1`).
//!
//! `remove` takes it all away again when the window is done: `window close`, and `handoff
//! move` once it has recorded the move finished or aborted. An installation made by an admin
//! (the manifests, the chart, `handoff policy install`) is never touched.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams, Preconditions};
use serde_json::{Value, json};

use crate::admission_policy::{LEASE_HOLD_POLICY, PIN_POLICY, WINDOW_LABEL, apply, per_window};
use crate::resources::move_window::MoveWindow;
use crate::window::cluster::Present;
use crate::window::cluster::{Cluster, Result, WindowError, api_err};

pub const CRD_NAME: &str = "movewindows.handoff.dev";
/// On a CRD a window created: it is handoff's to remove once no window uses it.
pub const INSTALLED_BY: (&str, &str) = ("handoff.dev/installed-by", "handoff-window");
/// On such a CRD: the windows that use it, comma-separated.
pub const WINDOWS_ANNOTATION: &str = "handoff.dev/windows";

/// The MoveWindow CRD, as a window finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Crd {
    Absent,
    /// Installed by an admin: never changed or removed by a window.
    Installed,
    /// Created by a window; the windows that use it.
    ByWindows(BTreeSet<String>),
}

impl Crd {
    pub fn of(crd: Option<&CustomResourceDefinition>) -> Crd {
        let Some(crd) = crd else {
            return Crd::Absent;
        };
        let by_window = crd
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(INSTALLED_BY.0))
            .is_some_and(|v| v == INSTALLED_BY.1);
        if !by_window {
            return Crd::Installed;
        }
        let users = crd
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(WINDOWS_ANNOTATION))
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|w| !w.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Crd::ByWindows(users)
    }
}

fn users_value(users: &BTreeSet<String>) -> String {
    users.iter().cloned().collect::<Vec<_>>().join(",")
}

/// What a window puts in place on one cluster, and what stays unguarded there (said before
/// anything is written).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    pub lease_guard: bool,
    pub pin: bool,
    pub unguarded: Vec<String>,
}

/// From what is there and what the window will stop (`leased`: a Lease will be held;
/// `scaled`: a Deployment will be pinned).
pub fn needs(p: &Present, leased: bool, scaled: bool) -> Needs {
    let mut n = Needs::default();
    if leased && !p.lease_guard {
        match p.serves_vap {
            true => n.lease_guard = true,
            false => n.unguarded.push("the Leases it holds: this API server serves no ValidatingAdmissionPolicy (Kubernetes 1.30+) and handoff's webhook is not installed, so anyone who may write a Lease can take one back (a person, or a provider that releases its Lease when it shuts down); handoff checks every Lease is still the window's before clusterctl copies, and stops the move where one is not".into()),
        }
    }
    if scaled && !p.pin {
        match p.serves_map {
            true => n.pin = true,
            false => n.unguarded.push("the Deployments it pins: this API server serves no MutatingAdmissionPolicy (Kubernetes 1.36+) and handoff's webhook is not installed, so a scale or an update of one brings its controller back".into()),
        }
    }
    n
}

/// Whether handoff's object `name` of this kind is there; a kind not served is not. An
/// operator with the narrow roles of an installation may not read it: an admin installed
/// handoff.
async fn installed(c: &Cluster, kind: &str, name: &str) -> Result<Option<Value>> {
    match apply::get(&c.client, kind, name).await {
        Ok(o) => Ok(o),
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(Some(Value::Null)),
        Err(e) => Err(api_err(c, format!("reading {kind} {name}"))(e)),
    }
}

/// Whether handoff's webhook configuration of this kind has the entry `entry` (or may not be
/// read, see `installed`).
async fn has_entry(c: &Cluster, kind: &str, entry: &str) -> Result<bool> {
    Ok(installed(c, kind, "handoff").await?.is_some_and(|o| {
        o.is_null()
            || o["webhooks"]
                .as_array()
                .is_some_and(|ws| ws.iter().any(|w| w["name"] == entry))
    }))
}

/// What guards this cluster's windows already: read once a run (nothing a run writes
/// changes it).
pub async fn survey(c: &Cluster) -> Result<Present> {
    if let Some(p) = c.surveyed() {
        return Ok(p);
    }
    let served = apply::served(&c.client).await.map_err(api_err(
        c,
        "reading which admission policy kinds are served",
    ))?;
    let p = Present {
        lease_guard: has_entry(
            c,
            "ValidatingWebhookConfiguration",
            "lease-hold.handoff.dev",
        )
        .await?
            || (served.validating
                && installed(c, "ValidatingAdmissionPolicy", LEASE_HOLD_POLICY)
                    .await?
                    .is_some()),
        pin: has_entry(c, "MutatingWebhookConfiguration", "move-window.handoff.dev").await?
            || (served.mutating
                && installed(c, "MutatingAdmissionPolicy", PIN_POLICY)
                    .await?
                    .is_some()),
        serves_vap: served.validating,
        serves_map: served.mutating,
    };
    c.survey_read(p);
    Ok(p)
}

/// The MoveWindow CRD served, with `window` among its users where a window created it: before
/// the window is first written.
pub async fn ensure_crd(c: &Cluster, window: &str) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let err = |what: &str| api_err(c, format!("{what} CustomResourceDefinition {CRD_NAME}"));
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let found = match api.get_opt(CRD_NAME).await {
            Ok(f) => f,
            // The narrow operator role of an installation: the CRD is the admin's.
            Err(kube::Error::Api(e)) if e.code == 403 => return Ok(()),
            Err(e) => return Err(err("reading")(e)),
        };
        // Being deleted by the last window that used it: created anew once it is gone.
        if found
            .as_ref()
            .is_some_and(|d| d.metadata.deletion_timestamp.is_some())
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        match (Crd::of(found.as_ref()), found) {
            (Crd::Installed, _) => return Ok(()),
            (Crd::ByWindows(users), _) if users.contains(window) => {
                return established(c, &api).await;
            }
            (Crd::ByWindows(mut users), Some(mut crd)) => {
                users.insert(window.to_string());
                crd.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(WINDOWS_ANNOTATION.into(), users_value(&users));
                match api.replace(CRD_NAME, &PostParams::default(), &crd).await {
                    Ok(_) => return established(c, &api).await,
                    // Another window registered, or removed it, meanwhile.
                    Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => continue,
                    Err(e) => return Err(err("registering MoveWindow in")(e)),
                }
            }
            _ => {
                let mut crd = crate::resources::move_window::crd();
                crd.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(INSTALLED_BY.0.into(), INSTALLED_BY.1.into());
                crd.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(WINDOWS_ANNOTATION.into(), window.to_string());
                match api.create(&PostParams::default(), &crd).await {
                    Ok(_) => return established(c, &api).await,
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(err("creating")(e)),
                }
            }
        }
    }
    Err(WindowError::Refused {
        cluster: c.label.into(),
        message: format!(
            "CustomResourceDefinition {CRD_NAME} kept changing under us; run the command again"
        ),
    })
}

/// Until the API server serves MoveWindows (the CRD's `Established` condition).
async fn established(c: &Cluster, api: &Api<CustomResourceDefinition>) -> Result<()> {
    let start = tokio::time::Instant::now();
    loop {
        let crd = api.get_opt(CRD_NAME).await.map_err(api_err(
            c,
            format!("reading CustomResourceDefinition {CRD_NAME}"),
        ))?;
        let ready = crd
            .and_then(|d| d.status)
            .and_then(|s| s.conditions)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|x| x.type_ == "Established" && x.status == "True")
            });
        if ready {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(WindowError::Refused {
                cluster: c.label.into(),
                message: format!(
                    "CustomResourceDefinition {CRD_NAME} is not Established after 60s"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Put in place what `needs` asks for, owned by the window; what was put in place, said.
pub async fn ensure_guards(
    c: &Cluster,
    window: &str,
    selector: &LabelSelector,
    n: &Needs,
) -> Result<Vec<String>> {
    if !n.lease_guard && !n.pin {
        return Ok(Vec::new());
    }
    let uid = c.window_uid(window);
    let mut objects = Vec::new();
    if n.lease_guard {
        objects.extend(per_window::lease_guard(window, uid.as_deref()));
    }
    if n.pin {
        objects.extend(per_window::pin(window, uid.as_deref(), selector));
    }
    let mut put = Vec::new();
    for o in &objects {
        let what = format!(
            "{} {}",
            o["kind"].as_str().unwrap_or_default(),
            o["metadata"]["name"].as_str().unwrap_or_default()
        );
        apply::apply(&c.client, o)
            .await
            .map_err(api_err(c, format!("creating {what}")))?;
        put.push(what);
    }
    Ok(put)
}

/// Remove what `window` put in place on this cluster: its policies, and where a window
/// created the CRD, the window itself and its use of the CRD (the CRD with it, where no other
/// window uses it). What was removed, said.
pub async fn remove(c: &Cluster, window: &str) -> Result<Vec<String>> {
    let mut removed = remove_brought(c, window).await?;
    removed.extend(remove_window(c, window).await?);
    Ok(removed)
}

/// What the window brought along for itself (`per_window`).
async fn remove_brought(c: &Cluster, window: &str) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    // Found by the window's label (a read, where an installation left nothing to remove),
    // removed by name.
    let names = per_window::names(window);
    let mut kinds: Vec<&str> = names.iter().map(|(k, _)| *k).collect();
    kinds.dedup();
    let lp = ListParams::default().labels(&format!("{WINDOW_LABEL}={window}"));
    for kind in kinds {
        let api: Api<DynamicObject> = Api::all_with(c.client.clone(), &apply::resource(kind));
        let found = match api.list_metadata(&lp).await {
            Ok(l) => l.items,
            // A kind the API server does not serve, or an operator who may not list it (the
            // narrow roles of an installation): nothing was brought.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => continue,
            Err(e) => {
                return Err(api_err(
                    c,
                    format!("listing {kind}s of MoveWindow {window}"),
                )(e));
            }
        };
        for o in found {
            let name = o.metadata.name.unwrap_or_default();
            if !names.iter().any(|(k, n)| *k == kind && *n == name) {
                continue;
            }
            let obj = json!({"kind": kind, "metadata": {"name": name}});
            if apply::delete(&c.client, &obj)
                .await
                .map_err(api_err(c, format!("deleting {kind} {name}")))?
            {
                removed.push(format!("{kind} {name}"));
            }
        }
    }
    Ok(removed)
}

/// The window, and the CRD with it where it is the CRD's last user.
async fn remove_window(c: &Cluster, window: &str) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let api: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let err = |what: String| api_err(c, what);
    let windows: Api<MoveWindow> = Api::all(c.client.clone());
    for _ in 0..20 {
        let found = match api.get_opt(CRD_NAME).await {
            Ok(f) => f,
            Err(kube::Error::Api(e)) if e.code == 403 => return Ok(removed),
            Err(e) => {
                return Err(err(format!("reading CustomResourceDefinition {CRD_NAME}"))(
                    e,
                ));
            }
        };
        let (Crd::ByWindows(mut users), Some(mut crd)) = (Crd::of(found.as_ref()), found) else {
            return Ok(removed);
        };
        // The last user: the CRD goes, and the window with it, in one write (the window's
        // record stays readable until then, so a run killed before it finds it on the re-run).
        users.remove(window);
        if users.is_empty() {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: crd.metadata.resource_version.clone(),
                    uid: crd.metadata.uid.clone(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(CRD_NAME, &dp).await {
                Ok(_) => {
                    removed.push(format!(
                        "CustomResourceDefinition {CRD_NAME} (and MoveWindow {window} with it)"
                    ));
                    return Ok(removed);
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(removed),
                Err(e) => {
                    return Err(err(format!("deleting CustomResourceDefinition {CRD_NAME}"))(e));
                }
            }
        }
        // Others use it: this window's use of it ends first, then the window goes (a run
        // killed between the two leaves a window that the re-run, or the CRD's last user,
        // removes).
        let registered = Crd::of(Some(&crd)) != Crd::ByWindows(users.clone());
        if registered {
            crd.metadata
                .annotations
                .get_or_insert_default()
                .insert(WINDOWS_ANNOTATION.into(), users_value(&users));
            match api.replace(CRD_NAME, &PostParams::default(), &crd).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(removed),
                Err(e) => {
                    return Err(err(format!(
                        "removing MoveWindow {window} from CustomResourceDefinition {CRD_NAME}"
                    ))(e));
                }
            }
        }
        match windows.delete(window, &DeleteParams::default()).await {
            Ok(_) => removed.push(format!("MoveWindow {window}")),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(err(format!("deleting MoveWindow {window}"))(e)),
        }
        return Ok(removed);
    }
    Err(WindowError::Refused {
        cluster: c.label.into(),
        message: format!(
            "CustomResourceDefinition {CRD_NAME} kept changing under us; run the command again"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(labels: &[(&str, &str)], windows: Option<&str>) -> CustomResourceDefinition {
        let mut d = crate::resources::move_window::crd();
        d.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        d.metadata.annotations =
            windows.map(|w| [(WINDOWS_ANNOTATION.to_string(), w.to_string())].into());
        d
    }

    #[test]
    fn a_crd_is_the_windows_only_where_a_window_created_it() {
        assert_eq!(Crd::of(None), Crd::Absent);
        assert_eq!(Crd::of(Some(&crd(&[], None))), Crd::Installed);
        // An admin's CRD that happens to carry the annotation stays the admin's.
        assert_eq!(Crd::of(Some(&crd(&[], Some("a")))), Crd::Installed);
        assert_eq!(
            Crd::of(Some(&crd(
                &[("handoff.dev/installed-by", "someone")],
                Some("a")
            ))),
            Crd::Installed
        );
        assert_eq!(
            Crd::of(Some(&crd(&[INSTALLED_BY], Some(" b, a,,")))),
            Crd::ByWindows(["a".to_string(), "b".to_string()].into())
        );
        assert_eq!(
            Crd::of(Some(&crd(&[INSTALLED_BY], None))),
            Crd::ByWindows(BTreeSet::new())
        );
        assert_eq!(
            users_value(&["b".to_string(), "a".to_string()].into()),
            "a,b"
        );
    }

    #[test]
    fn a_window_brings_only_what_is_missing_and_says_what_it_cannot() {
        let none = Present {
            serves_vap: true,
            serves_map: true,
            ..Present::default()
        };
        assert_eq!(
            needs(&none, true, true),
            Needs {
                lease_guard: true,
                pin: true,
                unguarded: vec![]
            }
        );
        // Nothing stopped that way, nothing brought.
        assert_eq!(needs(&none, false, false), Needs::default());
        assert!(!needs(&none, true, false).pin);
        // Installed: the installation guards it.
        let installed = Present {
            lease_guard: true,
            pin: true,
            ..none
        };
        assert_eq!(needs(&installed, true, true), Needs::default());
        // Not served: said, not written.
        let old = Present::default();
        let n = needs(&old, true, true);
        assert!(!n.lease_guard && !n.pin);
        assert_eq!(n.unguarded.len(), 2);
        assert!(n.unguarded[0].starts_with("the Leases it holds"));
        assert!(n.unguarded[1].starts_with("the Deployments it pins"));
        // A webhook installed for one, the other brought.
        let half = Present {
            lease_guard: true,
            ..none
        };
        assert_eq!(
            needs(&half, true, true),
            Needs {
                lease_guard: false,
                pin: true,
                unguarded: vec![]
            }
        );
    }
}
