//! Kubernetes label selectors (`matchLabels` + `matchExpressions`), evaluated without I/O.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

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
