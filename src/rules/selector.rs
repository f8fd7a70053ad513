//! Kubernetes label selectors (`matchLabels` + `matchExpressions`), evaluated without I/O.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// The Cluster API provider controllers (docs/ARCHITECTURE.md §1.2): what a MoveWindow selects when its
/// selector is empty.
pub fn default_deployment_selector() -> LabelSelector {
    let req = |key: &str, operator: &str, values: Option<Vec<String>>| LabelSelectorRequirement {
        key: key.to_string(),
        operator: operator.to_string(),
        values,
    };
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![
            req("clusterctl.cluster.x-k8s.io", "Exists", None),
            req("cluster.x-k8s.io/provider", "Exists", None),
            req(
                "clusterctl.cluster.x-k8s.io/core",
                "NotIn",
                Some(vec!["cert-manager".into(), "inventory".into()]),
            ),
        ]),
    }
}

/// The same, compiled once.
pub fn default_selector() -> &'static Selector {
    static DEFAULT: std::sync::LazyLock<Selector> = std::sync::LazyLock::new(|| {
        Selector::from_label_selector(&default_deployment_selector())
            .expect("the default selector is valid")
    });
    &DEFAULT
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A compiled label selector. The empty selector matches everything, as in Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(pub Vec<Requirement>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("label selector: {0}")]
pub struct SelectorError(String);

impl Selector {
    pub fn from_label_selector(s: &LabelSelector) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for (k, v) in s.match_labels.iter().flatten() {
            reqs.push(Requirement::Equals(k.clone(), v.clone()));
        }
        for LabelSelectorRequirement {
            key,
            operator,
            values,
        } in s.match_expressions.iter().flatten()
        {
            let values = values.clone().unwrap_or_default();
            let r = match operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(SelectorError(format!(
                        "matchExpressions {key} {operator} needs at least one value"
                    )));
                }
                "In" => Requirement::In(key.clone(), values),
                "NotIn" => Requirement::NotIn(key.clone(), values),
                "Exists" => Requirement::Exists(key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(key.clone()),
                other => {
                    return Err(SelectorError(format!(
                        "matchExpressions {key}: unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"
                    )));
                }
            };
            reqs.push(r);
        }
        Ok(Selector(reqs))
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k));
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

/// Parse kubectl's selector syntax (`a=b,c!=d,e in (x,y),f notin (z),g,!h`) into a
/// `LabelSelector`, for `--selector`.
pub fn parse_label_selector(text: &str) -> Result<LabelSelector, SelectorError> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for ch in text.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    parts.push(cur);
    let mut labels = BTreeMap::new();
    let mut exprs = Vec::new();
    let bad = |p: &str| {
        SelectorError(format!(
            "cannot parse {p:?} (use k=v, k!=v, k in (a,b), k notin (a,b), k, !k)"
        ))
    };
    let req = |key: &str, op: &str, values: Option<Vec<String>>| LabelSelectorRequirement {
        key: key.trim().to_string(),
        operator: op.to_string(),
        values,
    };
    for part in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        let list = |rest: &str| -> Result<Vec<String>, SelectorError> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| bad(part))?;
            Ok(inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect())
        };
        if let Some((k, rest)) = part.split_once(" notin ") {
            exprs.push(req(k, "NotIn", Some(list(rest)?)));
        } else if let Some((k, rest)) = part.split_once(" in ") {
            exprs.push(req(k, "In", Some(list(rest)?)));
        } else if let Some((k, v)) = part.split_once("!=") {
            exprs.push(req(k, "NotIn", Some(vec![v.trim().to_string()])));
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            labels.insert(k.trim().to_string(), v.trim().to_string());
        } else if let Some(k) = part.strip_prefix('!') {
            exprs.push(req(k, "DoesNotExist", None));
        } else if part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        {
            exprs.push(req(part, "Exists", None));
        } else {
            return Err(bad(part));
        }
    }
    let sel = LabelSelector {
        match_labels: (!labels.is_empty()).then_some(labels),
        match_expressions: (!exprs.is_empty()).then_some(exprs),
    };
    Selector::from_label_selector(&sel)?;
    Ok(sel)
}

/// The query-string form (`labelSelector=`), as kubectl writes it.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(p: &[(&str, &str)]) -> BTreeMap<String, String> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn operators() {
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"a": "1"},
            "matchExpressions": [
                {"key": "b", "operator": "Exists"},
                {"key": "c", "operator": "NotIn", "values": ["x", "y"]},
                {"key": "d", "operator": "DoesNotExist"},
                {"key": "e", "operator": "In", "values": ["p", "q"]}
            ]
        }))
        .unwrap();
        let s = Selector::from_label_selector(&sel).unwrap();
        assert!(s.matches(Some(&labels(&[("a", "1"), ("b", ""), ("e", "p")]))));
        assert!(s.matches(Some(&labels(&[
            ("a", "1"),
            ("b", ""),
            ("c", "z"),
            ("e", "q")
        ]))));
        assert!(!s.matches(Some(&labels(&[
            ("a", "1"),
            ("b", ""),
            ("c", "x"),
            ("e", "p")
        ]))));
        assert!(!s.matches(Some(&labels(&[
            ("a", "1"),
            ("b", ""),
            ("d", ""),
            ("e", "p")
        ]))));
        assert!(!s.matches(Some(&labels(&[("a", "2"), ("b", ""), ("e", "p")]))));
        assert!(!s.matches(Some(&labels(&[("a", "1"), ("e", "p")]))));
        assert!(!s.matches(None));
        assert_eq!(s.to_string(), "a=1,b,c notin (x,y),!d,e in (p,q)");
        assert!(Selector::default().matches(None));
    }

    #[test]
    fn parses_kubectl_syntax_and_round_trips() {
        let text = "a=1,b,c notin (x,y),!d,e in (p,q),f!=g";
        let sel = Selector::from_label_selector(&parse_label_selector(text).unwrap()).unwrap();
        assert_eq!(
            sel.to_string(),
            "a=1,b,c notin (x,y),!d,e in (p,q),f notin (g)"
        );
        let again = parse_label_selector(&sel.to_string()).unwrap();
        assert_eq!(Selector::from_label_selector(&again).unwrap(), sel);
        assert!(parse_label_selector("a in x").is_err());
        assert!(parse_label_selector("a b").is_err());
        assert!(parse_label_selector("").unwrap().match_labels.is_none());
    }

    #[test]
    fn bad_selectors() {
        let bad: LabelSelector = serde_json::from_value(
            serde_json::json!({"matchExpressions": [{"key": "k", "operator": "Has"}]}),
        )
        .unwrap();
        assert!(
            Selector::from_label_selector(&bad)
                .unwrap_err()
                .to_string()
                .contains("Has")
        );
        let empty_in: LabelSelector = serde_json::from_value(
            serde_json::json!({"matchExpressions": [{"key": "k", "operator": "In", "values": []}]}),
        )
        .unwrap();
        assert!(Selector::from_label_selector(&empty_in).is_err());
    }
}
