//! The book's Reference pages (`docs/src/reference/{cli,movewindow,metrics,config,steps}.md`),
//! generated from the definitions they describe: the clap command (`src/cli.rs`), the CRD the
//! code derives (`handoff crd`), the metrics registry as `handoff serve` builds it, the JSON
//! Schema of the config file's types, and the commands' step declarations. Each test regenerates one page and fails while the file
//! differs; `HANDOFF_BLESS=1 cargo test --bin handoff reference::` rewrites them all.
//!
//! Only tests build this (the CLI is in the binary crate, so the generators live here).

mod cli;
mod config;
mod metrics;
mod movewindow;
mod steps;

use std::path::Path;

/// A page's first line: that it is generated, from what, and how to regenerate it.
fn header(from: &str, generator: &str, test: &str) -> String {
    format!(
        "<!-- Generated from {from} by src/reference/{generator}.rs; do not edit. Regenerate: HANDOFF_BLESS=1 cargo test --bin handoff {test} -->\n"
    )
}

/// Compare `generated` with the file at `path` (from the crate root), or write it when
/// `HANDOFF_BLESS` is set.
fn check(path: &str, test: &str, generated: &str) {
    assert!(
        generated.ends_with('\n') && !generated.ends_with("\n\n"),
        "{path}: a page ends with one newline"
    );
    for (n, line) in generated.lines().enumerate() {
        assert!(
            line == line.trim_end(),
            "{path}:{}: trailing spaces in {line:?}",
            n + 1
        );
    }
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    if std::env::var_os("HANDOFF_BLESS").is_some() {
        std::fs::write(&file, generated).unwrap_or_else(|e| panic!("{path}: {e}"));
        return;
    }
    let current = std::fs::read_to_string(&file).unwrap_or_default();
    if current == generated {
        return;
    }
    let first_difference = current
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| current.lines().count().min(generated.lines().count()));
    panic!(
        "{path} is not what the code generates (first difference at line {}: file has {:?}, the code makes {:?}).\n\
         Run `HANDOFF_BLESS=1 cargo test --bin handoff {test}` to rewrite it, and commit the result.",
        first_difference + 1,
        current
            .lines()
            .nth(first_difference)
            .unwrap_or("<end of file>"),
        generated
            .lines()
            .nth(first_difference)
            .unwrap_or("<end of file>"),
    );
}

/// Prose from a doc comment or a help string, for one table cell or paragraph: lines joined
/// with spaces, and what Markdown would read as markup escaped outside code spans.
fn text(s: &str) -> String {
    let joined = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.matches('`').count() % 2 == 1 {
        // An unpaired backtick: no code spans at all.
        return escape_prose(&joined);
    }
    let mut out = String::new();
    for (i, part) in joined.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(&escape_prose(part));
        } else {
            out.push('`');
            out.push_str(&part.replace('|', "\\|"));
            out.push('`');
        }
    }
    out
}

/// Backslash-escape what CommonMark (and mdBook's tables and strikethrough) would take as
/// markup: an HTML tag such as `<namespace>`, emphasis, a table cell's end.
fn escape_prose(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let word = |j: Option<&char>| j.is_some_and(|c| c.is_alphanumeric());
        let escape = match c {
            '\\' | '<' | '>' | '*' | '~' | '|' | '[' | ']' => true,
            // Intraword `_` (move_window) is no emphasis.
            '_' => !(word(i.checked_sub(1).and_then(|j| chars.get(j))) && word(chars.get(i + 1))),
            _ => false,
        };
        if escape {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `s` as a code span, in a table cell.
fn code(s: &str) -> String {
    assert!(!s.contains('`'), "{s:?} in a code span");
    format!("`{}`", s.replace('|', "\\|"))
}

/// A GitHub-style table: cells are Markdown already; a column empty in every row is left out.
struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[&'static str]) -> Self {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.headers.len(), "{cells:?}");
        for c in &cells {
            assert!(!c.contains('\n'), "a table cell on one line: {c:?}");
        }
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let kept: Vec<usize> = (0..self.headers.len())
            .filter(|&i| self.rows.iter().any(|r| !r[i].is_empty()))
            .collect();
        let line = |cells: Vec<&str>| {
            let mut l = String::from("|");
            for c in cells {
                if c.is_empty() {
                    l.push_str(" |");
                } else {
                    l.push(' ');
                    l.push_str(c);
                    l.push_str(" |");
                }
            }
            l.push('\n');
            l
        };
        let mut out = line(kept.iter().map(|&i| self.headers[i]).collect());
        out.push_str(&line(kept.iter().map(|_| "---").collect()));
        for r in &self.rows {
            out.push_str(&line(kept.iter().map(|&i| r[i].as_str()).collect()));
        }
        out
    }
}

/// Every heading of a page once: mdBook and GitHub number a repeated one, and a link to it
/// would land on the first.
fn assert_unique_headings(path: &str, page: &str) {
    let mut seen = std::collections::BTreeSet::new();
    let mut in_fence = false;
    for line in page.lines() {
        if line.starts_with("```") {
            in_fence = !in_fence;
        }
        if !in_fence && line.starts_with('#') {
            assert!(seen.insert(line), "{path}: the heading {line:?} twice");
        }
    }
}

fn check_page(path: &str, test: &str, page: &str) {
    assert_unique_headings(path, page);
    check(path, test, page);
}

#[test]
fn cli_md_is_current() {
    check_page(
        "docs/src/reference/cli.md",
        "reference::cli_md_is_current",
        &cli::page(),
    );
}

#[test]
fn steps_md_is_current() {
    check_page(
        "docs/src/reference/steps.md",
        "reference::steps_md_is_current",
        &steps::page(),
    );
}

#[test]
fn movewindow_md_is_current() {
    check_page(
        "docs/src/reference/movewindow.md",
        "reference::movewindow_md_is_current",
        &movewindow::page(),
    );
}

#[test]
fn metrics_md_is_current() {
    check_page(
        "docs/src/reference/metrics.md",
        "reference::metrics_md_is_current",
        &metrics::page(),
    );
}

#[test]
fn config_md_is_current() {
    check_page(
        "docs/src/reference/config.md",
        "reference::config_md_is_current",
        &config::page(),
    );
}

#[test]
fn prose_is_escaped_outside_code_spans_only() {
    assert_eq!(
        text("default: move-<namespace>,\n  `a|b` and *x* | y_ move_window"),
        r"default: move-\<namespace\>, `a\|b` and \*x\* \| y\_ move_window"
    );
    assert_eq!(text("an odd ` backtick"), "an odd ` backtick");
    let mut t = Table::new(&["A", "B", "C"]);
    t.row(vec!["1".into(), String::new(), "3".into()]);
    t.row(vec![String::new(), String::new(), "6".into()]);
    assert_eq!(t.render(), "| A | C |\n| --- | --- |\n| 1 | 3 |\n| | 6 |\n");
}
