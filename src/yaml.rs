//! YAML in and out, through `serde-saphyr` (the crate kube's client already uses for kubeconfigs).
//!
//! Multi-document files are split the way kubectl splits them (a line that starts with `---`
//! begins a document), so each document is parsed alone: one document's text and value in
//! memory at a time, and an error names the document it is in, counted as `serde_yaml` and
//! libyaml counted them (comments before the first `---` are no document; an empty document
//! between two `---` is one).

use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// On one line: callers put it after the file and document they name.
    #[error("{}", crate::rules::one_line(.0.to_string()))]
    Parse(#[source] serde_saphyr::Error),
    #[error("{0}")]
    Serialize(#[source] serde_saphyr::SerializeError),
}

/// Parse one YAML document. The error is one line, without the source snippet that
/// serde-saphyr draws by default (callers name the file and document themselves).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options(text, options).map_err(YamlError::Parse)
}

/// Serialize to YAML.
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String, YamlError> {
    serde_saphyr::to_string(value).map_err(YamlError::Serialize)
}

/// The documents of a YAML stream as `(number, text)`, numbered from 1. A document that holds
/// nothing but comments (or nothing) is yielded too, so that the numbers stay right; parse it
/// with [`is_empty`] in mind.
pub fn documents(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut starts = vec![0];
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if offset > 0 && is_marker(line) {
            starts.push(offset);
        }
        offset += line.len();
    }
    let leading_marker = is_marker(text.split_inclusive('\n').next().unwrap_or(""));
    let mut ends = starts.clone();
    ends.remove(0);
    ends.push(text.len());
    starts
        .into_iter()
        .zip(ends)
        .map(move |(s, e)| &text[s..e])
        .enumerate()
        // What stands before the first `---` is a document only when it holds one.
        .filter(move |&(i, doc)| i > 0 || leading_marker || !is_empty(doc))
        .enumerate()
        .map(|(n, (_, doc))| (n + 1, doc))
}

/// Whether a document holds no node: only blank lines, comments, directives and markers.
pub fn is_empty(doc: &str) -> bool {
    doc.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l.starts_with('%') || l == "---" || l == "..."
    })
}

fn is_marker(line: &str) -> bool {
    line.strip_prefix("---")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_numbered_as_libyaml_numbers_them() {
        let docs: Vec<_> = documents("# c\n---\na: 1\n---\n---\nb: 2\n").collect();
        assert_eq!(
            docs,
            vec![(1, "---\na: 1\n"), (2, "---\n"), (3, "---\nb: 2\n")]
        );
        assert!(is_empty(docs[1].1));
        let docs: Vec<_> = documents("a: 1\n--- # x\nb: 2").collect();
        assert_eq!(docs, vec![(1, "a: 1\n"), (2, "--- # x\nb: 2")]);
        // `---` inside a line, or `----`, starts nothing.
        assert_eq!(documents("a: \"---\"\n----: x\n").count(), 1);
        assert_eq!(documents("").filter(|d| !is_empty(d.1)).count(), 0);
    }

    #[test]
    fn parses_to_json_values_and_errors_in_one_line() {
        let v: serde_json::Value = from_str("---\na: [1, x, true, null, 1.5]\n").unwrap();
        assert_eq!(v, serde_json::json!({"a": [1, "x", true, null, 1.5]}));
        let e = from_str::<serde_json::Value>("a: [\n")
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e}");
        let e = from_str::<serde_json::Value>("a: 1\na: 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate"), "{e}");
    }
}
