//! The config file (`--config`): who the sync targets are, and which kcp conventions count.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::rules::identity::{Identities, KeyScheme};
use crate::rules::rollout::{Exemption, Mode, Rollout};

/// The YAML file `--config FILE` names (`handoff serve`, `handoff review`, `handoff policy`):
/// who the sync targets are, which kcp conventions count, how each rule is enforced and who
/// is exempt. An empty file means every default. An unknown field, a value of the wrong type
/// or an incomplete entry is refused with a message that names the field (at start-up, the
/// process stops; on a reload, the settings in force stay).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    /// Sync targets named explicitly, each by its syncer's username; checked before the kcp
    /// convention (a `kcp-syncer-<name>-<id>` ServiceAccount whose namespace's locator names
    /// the sync target). Read at start-up.
    pub sync_targets: Vec<SyncTargetEntry>,
    /// The annotation domains whose kcp annotations count: `finalizers.workload.<domain>/<key>`
    /// holds, `<domain>/namespace-locator` locates (`kcp.dev` is kcp's legacy domain). Read at
    /// start-up.
    pub annotation_domains: Vec<String>,
    /// How a sync target's key is hashed from its logical cluster and name; a key of any
    /// scheme listed counts. Read at start-up.
    pub key_schemes: Vec<KeyScheme>,
    /// Each rule's mode; re-read when the file changes.
    pub enforcement: Enforcement,
    /// Break-glass: who passes even under `enforce` (visibly: a warning, an audit annotation, a
    /// log line and `handoff_exempt_requests_total`); re-read when the file changes.
    pub exemptions: Vec<ExemptionEntry>,
}

/// What a field the file leaves out is: both annotation domains and both key schemes, every
/// rule enforced, nobody exempt.
impl Default for ConfigFile {
    fn default() -> Self {
        ConfigFile {
            sync_targets: Vec::new(),
            annotation_domains: vec!["kcp.io".into(), "kcp.dev".into()],
            key_schemes: vec![KeyScheme::Current, KeyScheme::Legacy],
            enforcement: Enforcement::default(),
            exemptions: Vec::new(),
        }
    }
}

/// One exempt identity, as the API server authenticated it: exactly one of `username` and
/// `group`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExemptionEntry {
    /// A username, e.g. `alice@example.com`.
    #[serde(default)]
    pub username: Option<String>,
    /// A group the user is a member of, e.g. `move-breakglass`.
    #[serde(default)]
    pub group: Option<String>,
}

impl ExemptionEntry {
    fn exemption(&self, index: usize) -> Result<Exemption, InvalidConfig> {
        match (&self.username, &self.group) {
            (Some(u), None) if !u.trim().is_empty() => Ok(Exemption::Username(u.clone())),
            (None, Some(g)) if !g.trim().is_empty() => Ok(Exemption::Group(g.clone())),
            (Some(_), None) => Err(InvalidConfig::ExemptionUsernameEmpty { index }),
            (None, Some(_)) => Err(InvalidConfig::ExemptionGroupEmpty { index }),
            _ => Err(InvalidConfig::ExemptionNeedsOne { index }),
        }
    }
}

/// The mode of each rule.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Enforcement {
    /// The guard: a sync target's delete that a sync finalizer holds.
    #[serde(default)]
    pub sync_finalizer: Mode,
    /// The pin (a Deployment write or scale request that would run a Deployment an open
    /// MoveWindow selects) and the held-Lease guard.
    #[serde(default)]
    pub move_window: Mode,
}

/// A syncer's username and the sync target it is: either `key`, or both `cluster` and `name`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SyncTargetEntry {
    /// The syncer's username, e.g. `system:serviceaccount:edge:syncer`. One that is no
    /// `kcp-syncer-*` ServiceAccount is never sent to handoff by the manifests'
    /// matchCondition unless it is added there (start-up warns with the expression).
    pub username: String,
    /// The sync target's key (kcp's `syncTargetKey`), as its finalizer annotations name it.
    #[serde(default)]
    pub key: Option<String>,
    /// The sync target's logical cluster, e.g. `root:org:ws` (with `name`: the key is hashed
    /// from both, in every scheme of `keySchemes`).
    #[serde(default)]
    pub cluster: Option<String>,
    /// The sync target's name, e.g. `us-west1` (with `cluster`).
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Invalid {
        path: String,
        #[source]
        source: InvalidConfig,
    },
}

impl From<crate::yaml::YamlError> for InvalidConfig {
    fn from(e: crate::yaml::YamlError) -> Self {
        InvalidConfig::Yaml(Box::new(e))
    }
}

/// What is wrong with a config file's contents; each message names the field.
#[derive(Debug, thiserror::Error)]
pub enum InvalidConfig {
    #[error(transparent)]
    NotUtf8(#[from] std::str::Utf8Error),
    /// Not YAML, an unknown field, or a value of the wrong type. Boxed: the parser's error is
    /// large, and every `Result` of this type would carry its size.
    #[error(transparent)]
    Yaml(Box<crate::yaml::YamlError>),
    #[error("annotationDomains: give at least one domain such as kcp.io, without '/'")]
    AnnotationDomains,
    #[error("keySchemes: give at least one of current, legacy")]
    KeySchemes,
    #[error("syncTargets[{index}].username: must not be empty")]
    SyncTargetUsernameEmpty { index: usize },
    #[error("syncTargets[{index}] ({username}): give either key, or both cluster and name")]
    SyncTargetKeyOrName { index: usize, username: String },
    #[error("exemptions[{index}].username: must not be empty")]
    ExemptionUsernameEmpty { index: usize },
    #[error("exemptions[{index}].group: must not be empty")]
    ExemptionGroupEmpty { index: usize },
    #[error("exemptions[{index}]: give exactly one of username or group")]
    ExemptionNeedsOne { index: usize },
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: p.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|source| ConfigError::Invalid { path: p, source })
    }

    /// Parse and check; the error names the field.
    pub fn parse(text: &str) -> Result<Self, InvalidConfig> {
        let cfg: ConfigFile = if text.trim().is_empty() {
            ConfigFile::default()
        } else {
            crate::yaml::from_str_naming_fields(text)?
        };
        cfg.identities()?;
        for (i, e) in cfg.exemptions.iter().enumerate() {
            e.exemption(i)?;
        }
        Ok(cfg)
    }

    /// The settings a running server takes from a changed file without a restart.
    pub fn rollout(&self) -> Rollout {
        Rollout {
            sync_finalizer: self.enforcement.sync_finalizer,
            move_window: self.enforcement.move_window,
            exemptions: self
                .exemptions
                .iter()
                .enumerate()
                .filter_map(|(i, e)| e.exemption(i).ok())
                .collect(),
        }
    }

    pub fn identities(&self) -> Result<Identities, InvalidConfig> {
        let domains = &self.annotation_domains;
        if domains.is_empty() || domains.iter().any(|d| d.is_empty() || d.contains('/')) {
            return Err(InvalidConfig::AnnotationDomains);
        }
        let schemes = &self.key_schemes;
        if schemes.is_empty() {
            return Err(InvalidConfig::KeySchemes);
        }
        let mut ids = Identities::new(domains, schemes);
        for (index, e) in self.sync_targets.iter().enumerate() {
            if e.username.is_empty() {
                return Err(InvalidConfig::SyncTargetUsernameEmpty { index });
            }
            match (&e.key, &e.cluster, &e.name) {
                (Some(k), None, None) if !k.is_empty() => ids.add_key(&e.username, k),
                (None, Some(c), Some(n)) if !c.is_empty() && !n.is_empty() => {
                    ids.add_cluster_name(&e.username, c, n)
                }
                _ => {
                    return Err(InvalidConfig::SyncTargetKeyOrName {
                        index,
                        username: e.username.clone(),
                    });
                }
            }
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            ConfigFile::parse(
                "syncTargets: [{username: a, key: k}]\nenforcement: {syncFinalizer: maybe}"
            )
            .unwrap_err()
            .to_string(),
            r#"enforcement.syncFinalizer: unknown variant "maybe", expected one of enforce, warn, audit (line 2, column 30)"#
        );
        // Every field of every struct of the file, at every depth: a value of the wrong type
        // or an unknown one, each reported under its own path.
        for (text, path) in [
            // ConfigFile
            ("syncTargets: {username: a}", "syncTargets: "),
            ("annotationDomains: kcp.io", "annotationDomains: "),
            ("annotationDomains: [[kcp.io]]", "annotationDomains[0]: "),
            ("keySchemes: current", "keySchemes: "),
            ("keySchemes: [current, newest]", "keySchemes[1]: "),
            ("enforcement: warn", "enforcement: "),
            ("exemptions: {username: a}", "exemptions: "),
            // SyncTargetEntry
            ("syncTargets: [5]", "syncTargets[0]: "),
            (
                "syncTargets: [{username: [a], key: k}]",
                "syncTargets[0].username: ",
            ),
            ("syncTargets: [{key: k}]", "syncTargets[0]: "),
            (
                "syncTargets: [{username: a, key: [k]}]",
                "syncTargets[0].key: ",
            ),
            (
                "syncTargets: [{username: a, key: k}, {username: b, cluster: {c: 1}, name: n}]",
                "syncTargets[1].cluster: ",
            ),
            (
                "syncTargets: [{username: b, cluster: c, name: [n]}]",
                "syncTargets[0].name: ",
            ),
            (
                "syncTargets: [{username: a, key: k, nmae: x}]",
                "syncTargets[0]: ",
            ),
            // Enforcement
            (
                "enforcement: {syncFinalizer: maybe}",
                "enforcement.syncFinalizer: ",
            ),
            (
                "enforcement: {moveWindow: [warn]}",
                "enforcement.moveWindow: ",
            ),
            ("enforcement: {syncfinalizer: warn}", "enforcement: "),
            // ExemptionEntry
            ("exemptions: [{username: [a]}]", "exemptions[0].username: "),
            (
                "exemptions: [{group: a}, {group: {g: 1}}]",
                "exemptions[1].group: ",
            ),
            ("exemptions: [{user: a}]", "exemptions[0]: "),
            // Checked after parsing.
            (
                "syncTargets: [{username: a}]",
                "syncTargets[0] (a): give either key",
            ),
            (
                "syncTargets: [{username: a, key: k, cluster: c}]",
                "syncTargets[0] (a): ",
            ),
            (
                "syncTargets: [{username: '', key: k}]",
                "syncTargets[0].username: ",
            ),
            ("keySchemes: []", "keySchemes: "),
            ("annotationDomains: []", "annotationDomains: "),
            ("annotationDomains: [a/b]", "annotationDomains: "),
            ("exemptions: [{username: ' '}]", "exemptions[0].username: "),
            ("exemptions: [{}]", "exemptions[0]: "),
            // Wrong in the YAML itself, or nowhere inside a field.
            (
                "syncTargets: [{username: , key: k}]",
                "syncTargets[0].username: ",
            ),
            (
                "syncTargets: [{username: a, key: k, key: j}]",
                "syncTargets[0]: ",
            ),
            ("enforcement:\n", "enforcement: "),
            ("syncTargets: [{username: a", "syncTargets: "),
            ("hello", "invalid type: string \"hello\", expected a map"),
            ("- a", "invalid type: sequence, expected a map"),
            (
                "x: &a [1]\nsyncTargets: *a",
                "unknown field \"x\", expected one of syncTargets,",
            ),
            (
                "syncTargets: [{username: a, key: k}]\n---\nx: 1",
                "only single YAML document",
            ),
        ] {
            let err = ConfigFile::parse(text).unwrap_err().to_string();
            assert!(err.starts_with(path), "{text}: {err}");
            assert!(!err.contains('\n') && !err.contains('`'), "{text}: {err}");
        }
    }

    #[test]
    fn good_config() {
        let cfg = ConfigFile::parse(
            "syncTargets:\n- {username: a, key: K}\n- {username: b, cluster: root:org:ws, name: us-west1}\nkeySchemes: [current]\n",
        )
        .unwrap();
        let ids = cfg.identities().unwrap();
        assert!(ids.is_candidate("a") && ids.is_candidate("b") && !ids.is_candidate("c"));
        assert!(ConfigFile::parse("").is_ok());
    }
}

/// `NAMESPACE/NAME`, as flags that name one namespaced object take it.
pub fn parse_namespaced_name(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

/// Whether the base manifests' matchCondition `kcp-syncers-only` lets the API server send this
/// user's deletes to handoff: the same test as its CEL expression, which reads
/// `request.userInfo.username.startsWith('system:serviceaccount:') &&
/// size(username.split(':')) == 4 && username.split(':')[3].startsWith('kcp-syncer-')`.
pub fn match_condition_sends(username: &str) -> bool {
    let parts: Vec<&str> = username.split(':').collect();
    username.starts_with("system:serviceaccount:")
        && parts.len() == 4
        && parts[3].starts_with("kcp-syncer-")
}

impl ConfigFile {
    /// The configured usernames whose deletes the manifests' matchCondition never sends to
    /// handoff: without an addition to it, their holds are never enforced.
    pub fn usernames_the_webhook_never_sees(&self) -> Vec<&str> {
        self.sync_targets
            .iter()
            .map(|t| t.username.as_str())
            .filter(|u| !match_condition_sends(u))
            .collect()
    }
}

/// The matchCondition expression to append for `usernames`, as the book shows it (reference/index.md).
pub fn match_condition_addition(usernames: &[&str]) -> String {
    let quoted: Vec<String> = usernames
        .iter()
        .map(|u| format!("'{}'", u.replace('\\', "\\\\").replace('\'', "\\'")))
        .collect();
    format!("|| request.userInfo.username in [{}]", quoted.join(", "))
}

#[cfg(test)]
mod match_condition_tests {
    use super::*;

    #[test]
    fn mirrors_the_manifests_cel() {
        for (user, sent) in [
            (
                "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw",
                true,
            ),
            ("system:serviceaccount:edge:kcp-syncer-x", true),
            ("system:serviceaccount:edge:syncer", false),
            ("system:serviceaccount:a:b:kcp-syncer-x", false),
            ("kcp-syncer-x", false),
            ("legacy-syncer", false),
        ] {
            assert_eq!(match_condition_sends(user), sent, "{user}");
        }
        let cfg = ConfigFile::parse(
            "syncTargets:\n- username: system:serviceaccount:edge:syncer\n  key: K\n- username: system:serviceaccount:edge:kcp-syncer-a\n  key: K\n- username: o'brien\n  key: K\n",
        )
        .unwrap();
        let missing = cfg.usernames_the_webhook_never_sees();
        assert_eq!(missing, ["system:serviceaccount:edge:syncer", "o'brien"]);
        assert_eq!(
            match_condition_addition(&missing),
            r"|| request.userInfo.username in ['system:serviceaccount:edge:syncer', 'o\'brien']"
        );
    }
}
