//! Rolling a rule out: each rule's enforcement mode, and break-glass exemptions (pure).
//!
//! A platform team first watches what a rule *would* do (`audit`), then tells the people it
//! would stop (`warn`), then enforces. And on the day a move goes wrong, someone listed as exempt
//! can act, visibly: every exempt request carries a warning, an audit annotation, a log line
//! and a count.

use std::fmt;

use serde::Deserialize;

/// How a rule's verdict reaches the API server.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Deny and patch: the rule as designed.
    #[default]
    Enforce,
    /// Pass unchanged; the denial or the pin becomes a warning that kubectl prints.
    Warn,
    /// Pass unchanged, silently; only audit annotations, logs and metrics tell.
    Audit,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Enforce, Mode::Warn, Mode::Audit];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Audit => "audit",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who may pass a rule even under `enforce`. Only the config file says so: nothing in a request
/// can make it exempt but the identity the API server authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exemption {
    Username(String),
    Group(String),
}

impl fmt::Display for Exemption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exemption::Username(u) => write!(f, "user {u:?}"),
            Exemption::Group(g) => write!(f, "a member of group {g:?}"),
        }
    }
}

/// The rollout settings in force (from `--config`, reloaded when the file changes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rollout {
    pub sync_finalizer: Mode,
    pub move_window: Mode,
    pub exemptions: Vec<Exemption>,
}

impl Rollout {
    /// The exemption that covers this requester, if any.
    pub fn exemption(&self, username: &str, groups: &[String]) -> Option<&Exemption> {
        self.exemptions.iter().find(|e| match e {
            Exemption::Username(u) => u == username,
            Exemption::Group(g) => groups.iter().any(|x| x == g),
        })
    }
}

/// What logs and metrics count and the `decision` audit annotation says: a rule's verdict as
/// the rollout delivered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
    /// A patch: the pin.
    Patch,
    /// A denial passed under `warn` or `audit`.
    WouldDeny,
    /// A pin passed unchanged under `warn` or `audit`.
    WouldPin,
    /// A denial or a pin passed under an exemption.
    Exempt,
}

impl Verdict {
    /// The label value of logs and metrics (`manifests/monitoring` reads them).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Patch => "patch",
            Verdict::WouldDeny => "would-deny",
            Verdict::WouldPin => "would-pin",
            Verdict::Exempt => "exempt",
        }
    }
}

/// What the API server gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// As the rule decided: allow, deny or patch.
    AsDecided,
    /// Passes unchanged; the would-be denial or pin becomes a warning for kubectl to print.
    Warn,
    /// Passes unchanged, silently.
    Audit,
    /// Passes unchanged under an exemption, with a warning that says so.
    Exempt,
}

impl Delivery {
    /// The verdict a rule's `decided` verdict becomes.
    pub fn verdict(self, decided: Verdict) -> Verdict {
        match (self, decided) {
            (Delivery::AsDecided, v) => v,
            (Delivery::Warn | Delivery::Audit, Verdict::Deny) => Verdict::WouldDeny,
            (Delivery::Warn | Delivery::Audit, Verdict::Patch) => Verdict::WouldPin,
            (Delivery::Warn | Delivery::Audit, v) => v,
            (Delivery::Exempt, _) => Verdict::Exempt,
        }
    }
}

/// How a rule's verdict is delivered under `mode`, for a requester `exempt` or not. Only a
/// denial or a pin is softened or exempted: an allow has nothing to soften, and a verdict
/// already delivered is delivered as it is.
pub fn deliver(decided: Verdict, mode: Mode, exempt: bool) -> Delivery {
    if !matches!(decided, Verdict::Deny | Verdict::Patch) {
        return Delivery::AsDecided;
    }
    match (exempt, mode) {
        (true, _) => Delivery::Exempt,
        (false, Mode::Enforce) => Delivery::AsDecided,
        (false, Mode::Warn) => Delivery::Warn,
        (false, Mode::Audit) => Delivery::Audit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_table() {
        use Verdict::{Allow, Deny, Patch, WouldDeny, WouldPin};
        // (case, decided, mode, exempt, delivery, verdict delivered)
        let rows = [
            (
                "an allow is an allow in every mode",
                Allow,
                Mode::Warn,
                false,
                Delivery::AsDecided,
                Allow,
            ),
            (
                "an allow needs no exemption",
                Allow,
                Mode::Enforce,
                true,
                Delivery::AsDecided,
                Allow,
            ),
            (
                "enforce denies",
                Deny,
                Mode::Enforce,
                false,
                Delivery::AsDecided,
                Deny,
            ),
            (
                "enforce pins",
                Patch,
                Mode::Enforce,
                false,
                Delivery::AsDecided,
                Patch,
            ),
            (
                "warn turns a denial into a warning",
                Deny,
                Mode::Warn,
                false,
                Delivery::Warn,
                WouldDeny,
            ),
            (
                "warn turns a pin into a warning",
                Patch,
                Mode::Warn,
                false,
                Delivery::Warn,
                WouldPin,
            ),
            (
                "audit passes a denial silently",
                Deny,
                Mode::Audit,
                false,
                Delivery::Audit,
                WouldDeny,
            ),
            (
                "audit passes a pin silently",
                Patch,
                Mode::Audit,
                false,
                Delivery::Audit,
                WouldPin,
            ),
            (
                "an exemption passes a denial under enforce",
                Deny,
                Mode::Enforce,
                true,
                Delivery::Exempt,
                Verdict::Exempt,
            ),
            (
                "an exemption passes a pin under enforce",
                Patch,
                Mode::Enforce,
                true,
                Delivery::Exempt,
                Verdict::Exempt,
            ),
            (
                "an exemption is still seen under audit",
                Deny,
                Mode::Audit,
                true,
                Delivery::Exempt,
                Verdict::Exempt,
            ),
            (
                "a verdict already delivered stays as it is",
                WouldDeny,
                Mode::Enforce,
                true,
                Delivery::AsDecided,
                WouldDeny,
            ),
        ];
        for (case, decided, mode, exempt, want, verdict) in rows {
            let got = deliver(decided, mode, exempt);
            assert_eq!(got, want, "{case}");
            assert_eq!(got.verdict(decided), verdict, "{case}");
        }
        // The label values logs, metrics and the monitoring rules read.
        let labels =
            [Allow, Deny, Patch, WouldDeny, WouldPin, Verdict::Exempt].map(Verdict::as_str);
        assert_eq!(
            labels,
            [
                "allow",
                "deny",
                "patch",
                "would-deny",
                "would-pin",
                "exempt"
            ]
        );
    }

    #[test]
    fn exemptions_match_the_authenticated_identity_only() {
        let r = Rollout {
            exemptions: vec![
                Exemption::Username("alice".into()),
                Exemption::Group("move-breakglass".into()),
            ],
            ..Rollout::default()
        };
        assert_eq!(
            r.exemption("alice", &[]),
            Some(&Exemption::Username("alice".into()))
        );
        assert_eq!(
            r.exemption("bob", &["move-breakglass".into()]),
            Some(&Exemption::Group("move-breakglass".into()))
        );
        assert_eq!(r.exemption("bob", &["system:masters".into()]), None);
        assert_eq!(r.exemption("Alice", &[]), None);
        assert_eq!(
            Exemption::Group("g".into()).to_string(),
            "a member of group \"g\""
        );
    }
}
