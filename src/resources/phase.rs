//! The phases a MoveWindow records: where a window stands (`status.phase`) and where a
//! `handoff move` stands (`status.move.phase`). The only place their names are written.
//!
//! Serialised as the strings every earlier version wrote, so the CRD (a string field) and the
//! records already in clusters do not change. A phase this version does not know is kept as
//! written (`Unknown`): the pin's MoveWindow watch must never fail to parse a window a newer
//! handoff wrote, and the commands refuse to act on it with its name (`UnknownPhase`).

use std::fmt;

/// A phase this handoff does not know: written by another version, or by hand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "MoveWindow {window} records {what} {phase:?}, which this handoff does not know (written by another version of handoff, or by hand): finish it with the handoff that wrote it; this one changes nothing"
)]
pub struct UnknownPhase {
    pub window: String,
    /// `phase` or `move phase`.
    pub what: &'static str,
    pub phase: String,
}

macro_rules! phases {
    ($(#[$doc:meta])* $name:ident ($what:literal) { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
            /// A phase this version does not know, as written.
            Unknown(String),
        }

        impl $name {
            /// Every phase this version knows, in the order a run goes through them.
            pub const ALL: &[$name] = &[$($name::$variant,)*];

            /// As recorded.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $text,)*
                    $name::Unknown(s) => s,
                }
            }

            /// `Ok` for a phase this version knows; `window` names the record, for the error.
            pub fn known(&self, window: &str) -> Result<&Self, UnknownPhase> {
                match self {
                    $name::Unknown(s) => Err(UnknownPhase {
                        window: window.to_string(),
                        what: $what,
                        phase: s.clone(),
                    }),
                    _ => Ok(self),
                }
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                match s.as_str() {
                    $($text => $name::$variant,)*
                    _ => $name::Unknown(s),
                }
            }
        }

        impl From<$name> for String {
            fn from(p: $name) -> String {
                p.as_str().to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

phases! {
    /// Where a window stands.
    WindowPhase("phase") {
        /// `open` is stopping what the window selects.
        Opening = "Opening",
        /// Every selected controller is proven stopped.
        Open = "Open",
        /// `close` is restoring them.
        Closing = "Closing",
        /// Every one restored.
        Closed = "Closed",
    }
}

phases! {
    /// Where a `handoff move` stands, as the target's window records it.
    MovePhase("move phase") {
        /// An `--abort` of a move that had recorded nothing left a record of no move: as good
        /// as none.
        Unrecorded = "",
        /// The target's controllers are being stopped.
        StoppingTarget = "Stopping target",
        /// clusterctl runs, and waits for the source's block-moves.
        Moving = "Moving",
        /// The source's controllers are being stopped (every source Cluster paused).
        StoppingSource = "Stopping source",
        /// Both clusters are proven stopped: clusterctl copies.
        Copying = "Copying",
        /// clusterctl finished: the controllers come back, the target's first.
        Restoring = "Restoring",
        /// clusterctl failed; a re-run resumes, `--abort` undoes.
        Failed = "Failed",
        /// The move finished and every controller runs again.
        Done = "Done",
        /// An `--abort` is under way.
        Aborting = "Aborting",
        /// An `--abort` finished: everything as it was before the move.
        Aborted = "Aborted",
    }
}

// Derivable only by marking a variant inside the macro that writes both enums.
#[allow(clippy::derivable_impls)]
impl Default for MovePhase {
    fn default() -> Self {
        MovePhase::Unrecorded
    }
}

impl MovePhase {
    /// Whether no move is under way: a new one may start.
    pub fn is_over(&self) -> bool {
        matches!(
            self,
            MovePhase::Done | MovePhase::Aborted | MovePhase::Unrecorded
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_reads_back_as_written_and_an_unknown_one_is_kept() {
        for p in WindowPhase::ALL {
            let json = serde_json::to_string(p).unwrap();
            assert_eq!(&serde_json::from_str::<WindowPhase>(&json).unwrap(), p);
        }
        for p in MovePhase::ALL {
            let json = serde_json::to_string(p).unwrap();
            assert_eq!(&serde_json::from_str::<MovePhase>(&json).unwrap(), p);
        }
        // The strings earlier versions wrote.
        assert_eq!(
            serde_json::from_str::<MovePhase>(r#""Stopping source""#).unwrap(),
            MovePhase::StoppingSource
        );
        let later = serde_json::from_str::<MovePhase>(r#""Verifying""#).unwrap();
        assert_eq!(later, MovePhase::Unknown("Verifying".into()));
        assert_eq!(serde_json::to_string(&later).unwrap(), r#""Verifying""#);
        let e = later.known("move-ns1").unwrap_err();
        assert!(
            e.to_string().contains("records move phase \"Verifying\"")
                && e.to_string().contains("move-ns1")
                && e.to_string().contains("changes nothing"),
            "{e}"
        );
        assert!(MovePhase::Copying.known("w").is_ok());
    }

    /// The book's "If a move stops" table names each phase a killed `handoff move` can leave
    /// recorded, as this enum spells it: a row the enum does not know, or a phase of the run
    /// with no row, fails here.
    #[test]
    fn the_books_table_of_phases_is_the_enums() {
        let page = include_str!("../../docs/src/tasks/move.md");
        let table = page
            .split("<!-- crash-points: checked by tests/capi/crash.rs -->")
            .nth(1)
            .expect("the crash-points table");
        let rows: Vec<&str> = table
            .lines()
            .skip(3)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.trim_matches('|').split('|').next().unwrap_or("").trim())
            .map(|cell| cell.split('`').nth(1).unwrap_or(cell))
            .filter(|p| *p != "none")
            .collect();
        for row in &rows {
            let phase = MovePhase::from(row.to_string());
            assert!(
                phase.known("-").is_ok(),
                "the book's row {row:?} is no MovePhase"
            );
        }
        let run = [
            MovePhase::StoppingTarget,
            MovePhase::Moving,
            MovePhase::StoppingSource,
            MovePhase::Copying,
            MovePhase::Restoring,
            // Where a window brought along what it needed, the move removes it after it
            // recorded itself done.
            MovePhase::Done,
            // A re-run's or an --abort's stop: clusterctl failed (or died alone) and handoff
            // recorded it; an --abort under way.
            MovePhase::Failed,
            MovePhase::Aborting,
        ];
        assert_eq!(rows, run.iter().map(MovePhase::as_str).collect::<Vec<_>>());
    }
}
