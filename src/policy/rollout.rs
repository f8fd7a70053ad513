//! Rolling a rule out: each rule's enforcement mode, and break-glass exemptions (pure).
//!
//! A platform team first watches what a rule *would* do (`audit`), then tells the people it
//! would stop (`warn`), then enforces. And on the day a move goes wrong, someone listed as exempt
//! can act, visibly: every exempt request carries a warning, an audit annotation, a log line
//! and a count.

use std::fmt;

use serde::Deserialize;

/// How a rule's verdict reaches the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
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

/// What the rule decided, before the rollout shapes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleOutcome {
    Allow,
    Deny,
    /// A patch (the pin).
    Patch,
}

/// What the API server gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// As the rule decided: allow, deny or patch.
    AsDecided,
    /// Passes unchanged; `warning` is the would-be denial or pin, for kubectl to print.
    Warn { verdict: &'static str },
    /// Passes unchanged, silently.
    Audit { verdict: &'static str },
    /// Passes unchanged under an exemption, with a warning that says so.
    Exempt,
}

impl Delivery {
    /// The `verdict` of logs and metrics, and the `decision` audit annotation.
    pub fn verdict(&self, decided: &'static str) -> &'static str {
        match self {
            Delivery::AsDecided => decided,
            Delivery::Warn { verdict } | Delivery::Audit { verdict } => verdict,
            Delivery::Exempt => "exempt",
        }
    }
}

/// How a rule's outcome is delivered under `mode`, for a requester `exempt` or not. An allow is
/// always delivered as decided: there is nothing to soften or to exempt from.
pub fn deliver(outcome: RuleOutcome, mode: Mode, exempt: bool) -> Delivery {
    let would = match outcome {
        RuleOutcome::Allow => return Delivery::AsDecided,
        RuleOutcome::Deny => "would-deny",
        RuleOutcome::Patch => "would-pin",
    };
    match (exempt, mode) {
        (true, _) => Delivery::Exempt,
        (false, Mode::Enforce) => Delivery::AsDecided,
        (false, Mode::Warn) => Delivery::Warn { verdict: would },
        (false, Mode::Audit) => Delivery::Audit { verdict: would },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_table() {
        use Delivery::*;
        use RuleOutcome::*;
        // (case, outcome, mode, exempt, delivery)
        let rows = [
            (
                "an allow is an allow in every mode",
                Allow,
                Mode::Warn,
                false,
                AsDecided,
            ),
            (
                "an allow needs no exemption",
                Allow,
                Mode::Enforce,
                true,
                AsDecided,
            ),
            ("enforce denies", Deny, Mode::Enforce, false, AsDecided),
            ("enforce pins", Patch, Mode::Enforce, false, AsDecided),
            (
                "warn turns a denial into a warning",
                Deny,
                Mode::Warn,
                false,
                Warn {
                    verdict: "would-deny",
                },
            ),
            (
                "warn turns a pin into a warning",
                Patch,
                Mode::Warn,
                false,
                Warn {
                    verdict: "would-pin",
                },
            ),
            (
                "audit passes a denial silently",
                Deny,
                Mode::Audit,
                false,
                Audit {
                    verdict: "would-deny",
                },
            ),
            (
                "audit passes a pin silently",
                Patch,
                Mode::Audit,
                false,
                Audit {
                    verdict: "would-pin",
                },
            ),
            (
                "an exemption passes a denial under enforce",
                Deny,
                Mode::Enforce,
                true,
                Exempt,
            ),
            (
                "an exemption passes a pin under enforce",
                Patch,
                Mode::Enforce,
                true,
                Exempt,
            ),
            (
                "an exemption is still seen under audit",
                Deny,
                Mode::Audit,
                true,
                Exempt,
            ),
        ];
        for (case, outcome, mode, exempt, want) in rows {
            assert_eq!(deliver(outcome, mode, exempt), want, "{case}");
        }
        assert_eq!(Exempt.verdict("deny"), "exempt");
        assert_eq!(AsDecided.verdict("patch"), "patch");
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
