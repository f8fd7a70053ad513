//! The config file (`--config`): who the sync targets are, and which kcp conventions count.

use std::path::Path;

use serde::Deserialize;

use crate::policy::identity::{Identities, KeyScheme};

/// ```yaml
/// syncTargets:                      # explicit identities, checked before the kcp convention
///   - username: system:serviceaccount:edge:syncer
///     key: 6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g
///   - username: legacy-syncer
///     cluster: root:org:ws
///     name: us-west1
/// annotationDomains: [kcp.io, kcp.dev]   # default: both
/// keySchemes: [current, legacy]          # default: both
/// ```
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub sync_targets: Vec<SyncTargetEntry>,
    #[serde(default)]
    pub annotation_domains: Option<Vec<String>>,
    #[serde(default)]
    pub key_schemes: Option<Vec<KeyScheme>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SyncTargetEntry {
    pub username: String,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub cluster: Option<String>,
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
    #[error("config file {path}: {message}")]
    Invalid { path: String, message: String },
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: p.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ConfigError::Invalid { path: p, message })
    }

    /// Parse and check; the error names the field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let cfg: ConfigFile = if text.trim().is_empty() {
            ConfigFile::default()
        } else {
            crate::yaml::from_str(text)?
        };
        cfg.identities()?;
        Ok(cfg)
    }

    pub fn identities(&self) -> Result<Identities, String> {
        let domains = self
            .annotation_domains
            .clone()
            .unwrap_or_else(|| vec!["kcp.io".into(), "kcp.dev".into()]);
        if domains.is_empty() || domains.iter().any(|d| d.is_empty() || d.contains('/')) {
            return Err(
                "annotationDomains: give at least one domain such as kcp.io, without '/'".into(),
            );
        }
        let schemes = self
            .key_schemes
            .clone()
            .unwrap_or_else(|| vec![KeyScheme::Current, KeyScheme::Legacy]);
        if schemes.is_empty() {
            return Err("keySchemes: give at least one of current, legacy".into());
        }
        let mut ids = Identities::new(&domains, &schemes);
        for (i, e) in self.sync_targets.iter().enumerate() {
            let at = format!("syncTargets[{i}]");
            if e.username.is_empty() {
                return Err(format!("{at}.username: must not be empty"));
            }
            match (&e.key, &e.cluster, &e.name) {
                (Some(k), None, None) if !k.is_empty() => ids.add_key(&e.username, k),
                (None, Some(c), Some(n)) if !c.is_empty() && !n.is_empty() => {
                    ids.add_cluster_name(&e.username, c, n)
                }
                _ => {
                    return Err(format!(
                        "{at} ({}): give either key, or both cluster and name",
                        e.username
                    ));
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
        for (text, want) in [
            ("syncTarget: []", "unknown field `syncTarget`"),
            (
                "syncTargets: [{username: a}]",
                "syncTargets[0] (a): give either key",
            ),
            (
                "syncTargets: [{username: a, key: k, cluster: c}]",
                "syncTargets[0]",
            ),
            (
                "syncTargets: [{username: '', key: k}]",
                "syncTargets[0].username",
            ),
            (
                "syncTargets: [{username: a, key: k, nmae: x}]",
                "unknown field `nmae`",
            ),
            ("keySchemes: [newest]", "unknown variant `newest`"),
            ("keySchemes: []", "keySchemes"),
            ("annotationDomains: []", "annotationDomains"),
        ] {
            let err = ConfigFile::parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
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
