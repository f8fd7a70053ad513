//! What the window commands and `handoff move` tell the user, as events: the only way
//! anything in `window/` reaches the terminal. The steps say what they do (`say`), what went
//! wrong without stopping them (`warn`), what only `-v` shows (`detail`), and `handoff move`'s
//! driver names each step it performs (`step`). Text by default, on standard error, as lines;
//! `-o json` prints each event as one JSON object a line on standard output, for CI pipelines
//! and wrappers:
//!
//! ```json
//! {"event":"step","step":"StopTarget","at":"2026-12-05T07:00:01Z"}
//! {"event":"say","level":"info","text":"handoff move: stopping the target's controllers"}
//! ```

use std::io::Write;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use crate::window::plan::declare::{Of, StepName};

/// How events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Lines for a person; `detail` lines only with `verbose`.
    #[default]
    Text,
    /// One JSON object a line, every event, details included.
    Json,
}

/// How much a line matters: JSON's `level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Info,
    Warning,
    Detail,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Detail => "detail",
        }
    }
}

pub struct Progress {
    out: Box<dyn Write>,
    format: Format,
    verbose: bool,
}

impl Progress {
    pub fn new(out: Box<dyn Write>, format: Format, verbose: bool) -> Progress {
        Progress {
            out,
            format,
            verbose,
        }
    }

    /// Text, details included, into a buffer the caller reads back (`Said::text`): for a
    /// library caller that shows the lines its own way, and for tests.
    pub fn captured() -> (Progress, Said) {
        let said = Said::default();
        let p = Progress::new(Box::new(said.clone()), Format::Text, true);
        (p, said)
    }

    /// Nothing said anywhere.
    pub fn quiet() -> Progress {
        Progress::new(Box::new(std::io::sink()), Format::Text, false)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// What a step does or found.
    pub fn say(&mut self, text: impl std::fmt::Display) {
        self.line(Level::Info, &text.to_string());
    }

    /// Something went wrong, and the command goes on.
    pub fn warn(&mut self, text: impl std::fmt::Display) {
        self.line(Level::Warning, &text.to_string());
    }

    /// What only `-v` shows: the pin's policy bindings and their proof, each former leader's
    /// Pod deleted, a wait's countdown.
    pub fn detail(&mut self, text: impl std::fmt::Display) {
        self.line(Level::Detail, &text.to_string());
    }

    /// A driver performs `step` of `of` (a move runs the window drivers inside its steps).
    pub fn step(&mut self, of: Of, step: impl StepName) {
        let (of, step) = (of.as_str(), step.as_str());
        if self.format == Format::Json {
            self.json(
                json!({"event": "step", "of": of, "step": step, "at": Timestamp::now().to_string()}),
            );
        } else if self.verbose {
            let _ = writeln!(self.out, "{of} step: {step}");
        }
    }

    fn line(&mut self, level: Level, text: &str) {
        match self.format {
            Format::Json => {
                self.json(json!({"event": "say", "level": level.as_str(), "text": text}))
            }
            Format::Text => {
                let _ = match level {
                    Level::Warning => writeln!(self.out, "warning: {text}"),
                    Level::Detail if !self.verbose => Ok(()),
                    Level::Info | Level::Detail => writeln!(self.out, "{text}"),
                };
            }
        }
    }

    fn json(&mut self, event: serde_json::Value) {
        let _ = writeln!(self.out, "{event}");
        let _ = self.out.flush();
    }
}

/// What a `captured` Progress was told, to read back.
#[derive(Clone, Default)]
pub struct Said(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Said {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl Write for Said {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(format: Format, verbose: bool) -> String {
        let out = Said::default();
        let mut p = Progress::new(Box::new(out.clone()), format, verbose);
        p.step(
            Of::Move,
            crate::window::plan::move_next::StepName::StopTarget,
        );
        p.say("handoff move: stopping the target's controllers");
        p.detail("target: took Lease capi-system/x");
        p.warn("a read failed; trying again");
        out.text()
    }

    #[test]
    fn text_is_the_lines_of_before_and_details_only_with_v() {
        assert_eq!(
            run(Format::Text, false),
            "handoff move: stopping the target's controllers\nwarning: a read failed; trying again\n"
        );
        assert_eq!(
            run(Format::Text, true),
            "move step: StopTarget\nhandoff move: stopping the target's controllers\ntarget: took Lease capi-system/x\nwarning: a read failed; trying again\n"
        );
    }

    #[test]
    fn json_is_every_event_one_object_a_line() {
        let lines: Vec<serde_json::Value> = run(Format::Json, false)
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0]["event"], "step");
        assert_eq!(lines[0]["step"], "StopTarget");
        assert!(
            lines[0]["at"]
                .as_str()
                .is_some_and(|t| t.parse::<Timestamp>().is_ok())
        );
        let said: Vec<(&str, &str)> = lines[1..]
            .iter()
            .map(|l| (l["level"].as_str().unwrap(), l["text"].as_str().unwrap()))
            .collect();
        assert_eq!(
            said,
            [
                ("info", "handoff move: stopping the target's controllers"),
                ("detail", "target: took Lease capi-system/x"),
                ("warning", "a read failed; trying again"),
            ]
        );
    }
}
