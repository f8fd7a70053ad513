//! YAML in and out, through `serde-saphyr` (the crate kube's client already uses for kubeconfigs).
//!
//! Multi-document files are split the way kubectl splits them (a line that starts with `---`
//! begins a document), so each document is parsed alone: one document's text and value in
//! memory at a time, and an error names the document it is in, counted as `serde_yaml` and
//! libyaml counted them (comments before the first `---` are no document; an empty document
//! between two `---` is one).

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;
use serde_saphyr::{Error, Localizer, Location, MessageFormatter};

#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// On one line: callers put it after the file and document they name.
    #[error("{}", crate::rules::one_line(.0.to_string()))]
    Parse(#[source] serde_saphyr::Error),
    /// From [`from_str_naming_fields`]: `syncTargets[0].username: invalid type: ... (line 3,
    /// column 15)`, on one line, as kubectl names a field. `path` is `None` when the error is
    /// not inside any field (a syntax error before the first key, an unknown top-level field:
    /// its map is the document itself). The parser's error is not a `source()`: this message
    /// says all it says, and a chain printed cause by cause would say it twice.
    #[error("{}", field_message(path.as_deref(), error))]
    Field {
        path: Option<String>,
        error: Box<serde_saphyr::Error>,
    },
    #[error("{0}")]
    Serialize(#[source] serde_saphyr::SerializeError),
}

/// Parse one YAML document. The error is one line, without the source snippet that
/// serde-saphyr draws by default (callers name the file and document themselves).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options(text, options).map_err(YamlError::Parse)
}

/// Parse one YAML document into a typed value whose error names the field it is about, by
/// its path in the document (`enforcement.syncFinalizer`, `syncTargets[0].username`), with the
/// value or name in double quotes and the location in parentheses:
/// `enforcement.syncFinalizer: unknown variant "maybe", expected one of enforce, warn, audit
/// (line 2, column 18)`. An unknown field is reported at the path of the map that holds it.
///
/// The path comes from `serde_path_to_error` wrapped around serde-saphyr's own (streaming)
/// deserializer, so the line and column are still the parser's.
pub fn from_str_naming_fields<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let options = serde_saphyr::options! { with_snippet: false };
    let mut track = serde_path_to_error::Track::new();
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        T::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
    })
    .map_err(|error| {
        let path = track.path();
        let mut segments: Vec<&Segment> = path.iter().collect();
        // The tracker stops at an unknown key itself (and at a duplicate one as `?`); kubectl
        // names the map that holds it.
        match (error.without_snippet(), segments.last()) {
            (Error::SerdeUnknownField { field, .. }, Some(Segment::Map { key }))
                if key == field =>
            {
                segments.pop();
            }
            (Error::DuplicateMappingKey { .. }, Some(Segment::Unknown)) => {
                segments.pop();
            }
            _ => {}
        }
        let error = with_what_was_found(error, text, &segments);
        YamlError::Field {
            path: (!segments.is_empty()).then(|| path_text(&segments)),
            error: Box::new(error),
        }
    })
}

/// `syncTargets[0].username`: `.` between fields, `[i]` for an index.
fn path_text(segments: &[&Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => out.push_str(if out.is_empty() { "?" } else { ".?" }),
        }
    }
    out
}

/// serde-saphyr reports a node of the wrong kind as `expected sequence start`, without what
/// stands there; serde's own wording says both (`invalid type: string "kcp.io", expected a
/// sequence`). The document is read again, as a plain value, to find the node at `path`; where
/// that fails, the parser's message stays.
fn with_what_was_found(error: Error, text: &str, path: &[&Segment]) -> Error {
    let (expected, location) = match *error.without_snippet() {
        Error::Unexpected { expected, location } => match expected {
            "sequence start" => ("a sequence", location),
            "mapping start" => ("a map", location),
            "string scalar" => ("a string", location),
            _ => return error,
        },
        Error::ExternallyTaggedEnumExpectedScalarOrMapping { location } => {
            ("a variant name", location)
        }
        Error::NullIntoString { location } => ("a string", location),
        _ => return error,
    };
    let Ok(document) = from_str::<serde_json::Value>(text) else {
        return error;
    };
    let mut node = &document;
    for segment in path {
        node = match (segment, node) {
            (Segment::Seq { index }, serde_json::Value::Array(items)) => match items.get(*index) {
                Some(item) => item,
                None => return error,
            },
            (Segment::Map { key }, serde_json::Value::Object(fields)) => match fields.get(key) {
                Some(value) => value,
                None => return error,
            },
            _ => return error,
        };
    }
    let unexpected = match node {
        serde_json::Value::Null => "null".to_string(),
        serde_json::Value::Bool(b) => format!("boolean \"{b}\""),
        serde_json::Value::Number(n) if n.is_f64() => format!("floating point \"{n}\""),
        serde_json::Value::Number(n) => format!("integer \"{n}\""),
        serde_json::Value::String(s) => format!("string {s:?}"),
        serde_json::Value::Array(_) => "sequence".to_string(),
        serde_json::Value::Object(_) => "map".to_string(),
    };
    Error::SerdeInvalidType {
        unexpected,
        expected: expected.to_string(),
        location,
    }
}

/// `PATH: MESSAGE (line L, column C)`, on one line.
fn field_message(path: Option<&str>, error: &Error) -> String {
    let message =
        crate::rules::one_line(error.render_with_options(serde_saphyr::render_options! {
            formatter: &FieldMessages,
            snippets: serde_saphyr::SnippetMode::Off,
        }));
    match path {
        Some(path) => format!("{path}: {message}"),
        None => message,
    }
}

/// serde's messages with the offending value or name in double quotes (serde quotes with
/// backticks), the rest as serde-saphyr words them for users (without its hints about parser
/// options, which are for the developer).
struct FieldMessages;

impl MessageFormatter for FieldMessages {
    fn localizer(&self) -> &dyn Localizer {
        &InParentheses
    }

    fn format_message<'a>(&self, err: &'a Error) -> Cow<'a, str> {
        fn one_of(expected: &[&str], none: &str) -> String {
            if expected.is_empty() {
                none.to_string()
            } else {
                format!("expected one of {}", expected.join(", "))
            }
        }
        Cow::Owned(match err {
            Error::SerdeUnknownVariant {
                variant, expected, ..
            } => format!(
                "unknown variant {variant:?}, {}",
                one_of(expected, "there are no variants")
            ),
            Error::SerdeUnknownField {
                field, expected, ..
            } => format!(
                "unknown field {field:?}, {}",
                one_of(expected, "there are no fields")
            ),
            Error::SerdeMissingField { field, .. } => format!("missing field {field:?}"),
            Error::SerdeInvalidType {
                unexpected,
                expected,
                ..
            } => format!("invalid type: {}, expected {expected}", quoted(unexpected)),
            Error::SerdeInvalidValue {
                unexpected,
                expected,
                ..
            } => format!("invalid value: {}, expected {expected}", quoted(unexpected)),
            Error::DuplicateMappingKey { key: Some(k), .. } => {
                format!("duplicate key {k:?}")
            }
            other => return serde_saphyr::UserMessageFormatter.format_message(other),
        })
    }
}

/// serde's `integer `5`` as `integer "5"`; `string "x"` (already quoted) and `map` unchanged.
fn quoted(unexpected: &str) -> Cow<'_, str> {
    match unexpected.strip_suffix('`').and_then(|u| u.split_once('`')) {
        Some((kind, value)) if !kind.contains('"') => Cow::Owned(format!("{kind}{value:?}")),
        _ => Cow::Borrowed(unexpected),
    }
}

/// ` (line 2, column 18)` after the message, instead of ` at line 2, column 18`.
struct InParentheses;

impl Localizer for InParentheses {
    fn attach_location<'a>(&self, base: Cow<'a, str>, loc: Location) -> Cow<'a, str> {
        if loc == Location::UNKNOWN {
            base
        } else {
            Cow::Owned(format!(
                "{base} (line {}, column {})",
                loc.line(),
                loc.column()
            ))
        }
    }
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
    fn typed_errors_name_the_field() {
        /// A value parsed by hand, as a duration would be.
        #[derive(Debug)]
        struct Seconds(#[allow(dead_code)] u64);
        impl<'de> serde::Deserialize<'de> for Seconds {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.strip_suffix('s')
                    .and_then(|n| n.parse().ok())
                    .map(Seconds)
                    .ok_or_else(|| serde::de::Error::custom(format!("invalid duration {s:?}")))
            }
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        #[allow(dead_code)]
        struct Probe {
            retry_after: Seconds,
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Doc {
            #[serde(default)]
            note: Option<String>,
            probes: Vec<Probe>,
        }
        for (text, want) in [
            (
                "probes:\n- retryAfter: 5s\n- retryAfter: soon\n",
                r#"probes[1].retryAfter: invalid duration "soon" (line 3, column 15)"#,
            ),
            (
                "probes: &a [{retryAfter: 1s}]\nprobes: *a\n",
                r#"duplicate key "probes" (line 2, column 1)"#,
            ),
            (
                "probes: [{retryAfter: 1s}, &a [1s]]\n",
                "probes[1]: invalid type: sequence, expected a map (line 1, column 31)",
            ),
            (
                "note: &a soon\nprobes: [{retryAfter: *a}]\n",
                r#"probes[0].retryAfter: invalid duration "soon" (defined at line 1, column 10) (used at line 2, column 23)"#,
            ),
        ] {
            let err = from_str_naming_fields::<Doc>(text).unwrap_err().to_string();
            assert_eq!(err, want, "{text}");
        }
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
