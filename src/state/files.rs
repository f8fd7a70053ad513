//! `--state DIR`: a folder of YAML manifests standing in for the cluster.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// One YAML document of a state folder, with where it came from.
#[derive(Debug, Clone)]
pub struct StateDoc {
    pub file: PathBuf,
    /// 1-based position of the document in its file.
    pub index: usize,
    pub kind: String,
    pub value: serde_json::Value,
}

impl StateDoc {
    pub fn place(&self) -> String {
        format!("{} (document {})", self.file.display(), self.index)
    }

    /// This document is not what `--state` takes: `message` says why.
    pub fn invalid(&self, message: impl Into<String>) -> StateError {
        StateError::Doc {
            place: self.place(),
            message: message.into(),
        }
    }

    /// Deserialize into a typed object, naming the file and the field on error.
    pub fn parse<T: for<'de> Deserialize<'de>>(&self) -> Result<T, StateError> {
        T::deserialize(&self.value).map_err(|e| StateError::Doc {
            place: self.place(),
            message: e.to_string(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state folder {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{place}: {message}")]
    Doc { place: String, message: String },
}

/// Every document of every `*.yaml`/`*.yml` file in `dir` (not recursive), in file-name order.
/// `# comments` and empty documents are skipped; a document without `kind` is an error.
pub fn load_dir(dir: &Path) -> Result<Vec<StateDoc>, StateError> {
    let mut docs = Vec::new();
    for_each_doc(dir, |doc| {
        docs.push(doc);
        Ok::<_, StateError>(())
    })?;
    Ok(docs)
}

/// The documents `load_dir` returns, handed to `each` one at a time and dropped after it: a
/// folder of 100,000 Namespaces never holds more than one file's text and one parsed document
/// (holding them all peaked at ~280 MiB, which the allocator then kept; BENCHMARKS.md).
pub fn for_each_doc<E: From<StateError>>(
    dir: &Path,
    mut each: impl FnMut(StateDoc) -> Result<(), E>,
) -> Result<(), E> {
    let io = |source| StateError::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml") | Some("yml")
                )
        })
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|source| StateError::Io {
            path: file.display().to_string(),
            source,
        })?;
        for (i, doc) in crate::yaml::documents(&text) {
            let place = || format!("{} (document {i})", file.display());
            if crate::yaml::is_empty(doc) {
                continue;
            }
            let value: serde_json::Value =
                crate::yaml::from_str(doc).map_err(|e| StateError::Doc {
                    place: place(),
                    message: format!("not valid YAML: {e}"),
                })?;
            if value.is_null() {
                continue;
            }
            let kind = value
                .get("kind")
                .and_then(|k| k.as_str())
                .ok_or_else(|| StateError::Doc {
                    place: place(),
                    message: "field `kind` is missing".into(),
                })?
                .to_string();
            each(StateDoc {
                file: file.clone(),
                index: i,
                kind,
                value,
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_multi_document_files_and_names_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "# c\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("ignored.txt"), "kind: Nope").unwrap();
        let docs = load_dir(dir.path()).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].kind, "Namespace");

        std::fs::write(dir.path().join("b.yaml"), "metadata: {name: x}\n").unwrap();
        let err = load_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("b.yaml (document 1)") && err.contains("`kind`"),
            "{err}"
        );

        std::fs::write(dir.path().join("b.yaml"), "kind: [\n").unwrap();
        let err = load_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("b.yaml") && err.contains("not valid YAML"),
            "{err}"
        );

        let err = load_dir(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
