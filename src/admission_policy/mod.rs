//! The rules as admission policies that run inside the API server (docs/ARCHITECTURE.md §2.1), so that
//! they keep holding while no handoff replica runs. Everything here is pure: from the config
//! and the identities handoff can compute to the API objects; `apply` puts them in a cluster.
//!
//! - The guard is a ValidatingAdmissionPolicy whose parameter is a ConfigMap in which handoff
//!   publishes what CEL cannot compute (a kcp syncer's key is a SHA-224 of its sync target). A
//!   ConfigMap, not a CRD of handoff's own: a binding whose `paramKind` names a resource the API
//!   server does not serve fails *every* request its rules match (checked on v1.36.2: with
//!   `failurePolicy: Fail` every DELETE in the cluster), and ConfigMaps are always served. A
//!   missing ConfigMap is `parameterNotFoundAction: Allow`: with `Deny` the API server refuses
//!   every matched request before it evaluates `matchConditions`.
//! - The pin is two MutatingAdmissionPolicies whose parameter is the MoveWindow: one for the
//!   Deployments a window's selector picks (bound per window with that `objectSelector`), one
//!   for `deployments/scale`, which carries no labels, bound per window and limited to the
//!   Deployments the window lists as pinned. Bindings exist only while a window is open
//!   (`handoff window open|close` manage them): a policy without a binding is never evaluated.
//! - The held-Lease guard is a ValidatingAdmissionPolicy with no parameter.
//!
//! One file each (`guard`, `pin`, `lease_hold`), the guard's parameter in `directory`, what
//! they share in `cel`; this file holds the names every policy object is found by.

pub mod apply;
mod cel;
mod directory;
mod guard;
mod lease_hold;
pub mod per_window;
mod pin;

pub use cel::{cel_selector, cel_str, validation_actions};
pub use directory::{
    Directory, PublishError, directory, params_object, service_account_key, username_key,
};
pub use guard::{guard_binding, guard_policy};
pub use lease_hold::{lease_hold_binding, lease_hold_policy};
pub use pin::{binding_name, pin_policy, pin_scale_policy, window_bindings};

pub const GUARD_POLICY: &str = "handoff-sync-finalizer";
pub const PIN_POLICY: &str = "handoff-move-window-pin";
pub const PIN_SCALE_POLICY: &str = "handoff-move-window-pin-scale";
pub const LEASE_HOLD_POLICY: &str = "handoff-lease-hold";
/// Every object `handoff policy` and `handoff window` create carry it, so that `uninstall`
/// finds them all, window bindings included.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "handoff");
/// On window bindings: the MoveWindow they belong to.
pub const WINDOW_LABEL: &str = "handoff.dev/move-window";
pub const FIELD_MANAGER: &str = "handoff";

/// The ConfigMap in which handoff publishes sync-target identities for the guard's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamsRef {
    pub namespace: String,
    pub name: String,
}

impl Default for ParamsRef {
    fn default() -> Self {
        ParamsRef {
            namespace: crate::rules::move_window::HANDOFF_NAMESPACE.into(),
            name: "handoff-sync-targets".into(),
        }
    }
}

impl std::str::FromStr for ParamsRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (namespace, name) = crate::config::parse_namespaced_name(s)?;
        Ok(ParamsRef { namespace, name })
    }
}

impl std::fmt::Display for ParamsRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests;
