//! The documentation a user reads: the README and the book (docs/src, built by `hack/book.sh`).
//! Every relative link names a file of the clone and every anchor a heading of its page, as
//! mdBook and GitHub make them; every page is in the book's SUMMARY.md; every
//! `docs/ARCHITECTURE.md §n` the code cites is a numbered section of that file, and no comment
//! names a design file the clone does not have.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir` whose name ends with one of `exts`, recursively.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("target") && !path.ends_with("book") {
                files(&path, exts, out);
            }
        } else if exts
            .iter()
            .any(|e| path.to_string_lossy().ends_with(&format!(".{e}")))
        {
            out.push(path);
        }
    }
    out.sort();
}

/// The lines of a Markdown file outside its fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = if t.starts_with("```") {
            Some("```")
        } else if t.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// A heading's anchor as mdBook (`normalize_id`) and GitHub make it: the text without its
/// Markdown, lowercased, whitespace to `-`, only alphanumerics, `-` and `_` kept.
fn slug(heading: &str) -> String {
    let text = links_to_text(heading).replace('`', "");
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            c if c.is_whitespace() => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// `[text](target)` as `text`.
fn links_to_text(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// A page as the book renders it: `{{#include FILE}}` replaced by that file.
fn rendered(path: &Path) -> String {
    let text = read(path);
    let mut out = String::new();
    for line in text.lines() {
        match line
            .trim()
            .strip_prefix("{{#include ")
            .and_then(|l| l.strip_suffix("}}"))
        {
            Some(included) => out.push_str(&read(&path.parent().unwrap().join(included.trim()))),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The anchors of a page: each heading's slug, a repeated one with `-1`, `-2` as mdBook and
/// GitHub number them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(heading) = line[hashes..].strip_prefix(' ').filter(|_| hashes > 0) else {
            continue;
        };
        let s = slug(heading);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the links on one line: inline `[text](target)` and reference definitions
/// `[name]: target`, with inline code left out.
fn link_targets(line: &str) -> Vec<String> {
    let no_code: String = line
        .split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, s)| s)
        .collect::<Vec<_>>()
        .join("");
    let mut out = Vec::new();
    if let Some(def) = no_code
        .trim_start()
        .strip_prefix('[')
        .and_then(|r| r.split_once("]: "))
    {
        out.push(def.1.split_whitespace().next().unwrap_or("").to_string());
    }
    let mut rest = no_code.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        // `[text](target "title")`
        out.push(
            after[..end]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string(),
        );
        rest = &after[end..];
    }
    out
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// This repository on GitHub, as the book links to the files outside it.
const GITHUB: &str = "https://github.com/handoff-dev/handoff/blob/main/";

/// What is wrong with the links of `text`, read as a file in `dir` (`name` in messages). A page
/// of the book (`book`: its folder) links relatively only inside it: mdBook turns those links
/// into the pages it renders, and a relative link to any other file of the clone would break.
fn broken_links(
    name: &str,
    text: &str,
    dir: &Path,
    own_anchors: &BTreeSet<String>,
    book: Option<&Path>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (n, line) in prose(text) {
        for target in link_targets(line) {
            if target.is_empty() {
                problems.push(format!("{name}:{n}: a link without a target"));
                continue;
            }
            // This repository's files on GitHub (what a book page links to outside the book)
            // are files of the clone.
            let (local, dir) = match target.strip_prefix(GITHUB) {
                Some(path) => (path, root()),
                None if target.contains("://") || target.starts_with("mailto:") => continue,
                None => (target.as_str(), dir),
            };
            let (file, anchor) = match local.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (local, None),
            };
            let page_anchors = if file.is_empty() {
                own_anchors.clone()
            } else {
                let path = normalize(&dir.join(file));
                if let Some(book) = book.filter(|b| !path.starts_with(b) && local == target) {
                    problems.push(format!(
                        "{name}:{n}: {target} leaves the book ({}): link to {GITHUB}{} instead",
                        book.display(),
                        path.strip_prefix(root()).unwrap_or(&path).display()
                    ));
                    continue;
                }
                if !path.exists() {
                    problems.push(format!("{name}:{n}: {target}: no file {}", path.display()));
                    continue;
                }
                if !path.starts_with(root()) {
                    problems.push(format!("{name}:{n}: {target} leaves the clone"));
                    continue;
                }
                if anchor.is_none() {
                    continue;
                }
                if !file.ends_with(".md") {
                    problems.push(format!(
                        "{name}:{n}: {target}: an anchor into a non-Markdown file"
                    ));
                    continue;
                }
                anchors(&rendered(&path))
            };
            if let Some(anchor) = anchor.filter(|a| !page_anchors.contains(*a)) {
                problems.push(format!(
                    "{name}:{n}: {target}: no heading with the anchor #{anchor}"
                ));
            }
        }
    }
    problems
}

#[test]
fn every_link_and_anchor_of_the_readme_and_the_book_resolves() {
    let mut pages = vec![
        root().join("README.md"),
        root().join("BENCHMARKS.md"),
        root().join("docs/ARCHITECTURE.md"),
    ];
    let book = root().join("docs/src");
    files(&book, &["md"], &mut pages);
    let mut problems = Vec::new();
    for page in &pages {
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        let text = rendered(page);
        let in_book = page.starts_with(&book).then_some(book.as_path());
        problems.extend(broken_links(
            &name,
            &text,
            page.parent().unwrap(),
            &anchors(&text),
            in_book,
        ));
        // An included file is read in two places: at its own path (GitHub) and inside the
        // page that includes it (the book); its links must resolve in both.
        if text != read(page) {
            let own = read(page);
            problems.extend(broken_links(
                &name,
                &own,
                page.parent().unwrap(),
                &anchors(&own),
                None,
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_slugs_are_the_ones_mdbook_and_github_make() {
    assert_eq!(
        slug("`handoff move`: clusterctl move with both clusters stopped"),
        "handoff-move-clusterctl-move-with-both-clusters-stopped"
    );
    assert_eq!(
        slug("Holds set in kcp (`--kcp-kubeconfig`)"),
        "holds-set-in-kcp---kcp-kubeconfig"
    );
    assert_eq!(slug("HandoffWebhookDown"), "handoffwebhookdown");
    assert_eq!(slug("See [the rule](x.md#y), again"), "see-the-rule-again");
    let a = anchors("# A\n```sh\n# not a heading\n```\n## A\n### B.1 c\n");
    assert_eq!(a, BTreeSet::from(["a".into(), "a-1".into(), "b1-c".into()]));
    let problems = broken_links(
        "x.md",
        "[ok](#a) [bad](#nope) `[code](nowhere.md)` [gone](nowhere.md) [web](https://x.y/#z)\n# A\n",
        root(),
        &anchors("# A\n"),
        None,
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    let book = root().join("docs/src");
    let problems = broken_links(
        "docs/src/x.md",
        "[in](introduction.md) [out](../../README.md) [gh](https://github.com/handoff-dev/handoff/blob/main/README.md) [gone](https://github.com/handoff-dev/handoff/blob/main/NOPE.md)",
        &book,
        &BTreeSet::new(),
        Some(&book),
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("leaves the book"), "{problems:?}");
}

#[test]
fn every_page_is_in_the_summary_and_every_summary_entry_is_a_page() {
    let src = root().join("docs/src");
    let summary = read(&src.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = prose(&summary)
        .iter()
        .flat_map(|(_, l)| link_targets(l))
        .map(|t| src.join(t))
        .collect();
    let mut pages = Vec::new();
    files(&src, &["md"], &mut pages);
    let pages: BTreeSet<PathBuf> = pages
        .into_iter()
        .filter(|p| !p.ends_with("SUMMARY.md"))
        .collect();
    assert_eq!(
        listed.difference(&pages).collect::<Vec<_>>(),
        Vec::<&PathBuf>::new(),
        "SUMMARY.md lists pages that do not exist"
    );
    assert_eq!(
        pages.difference(&listed).collect::<Vec<_>>(),
        Vec::<&PathBuf>::new(),
        "pages missing from SUMMARY.md (the book would not show them)"
    );
}

/// `## 2. The server` and `### 1.2 The move window` are sections `2` and `1.2`.
fn architecture_sections() -> BTreeSet<String> {
    prose(&read(&root().join("docs/ARCHITECTURE.md")))
        .iter()
        .filter(|(_, l)| l.starts_with('#'))
        .filter_map(|(_, l)| l.trim_start_matches('#').split_whitespace().next())
        .map(|n| n.trim_end_matches('.').to_string())
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .collect()
}

#[test]
fn every_architecture_citation_names_a_section_and_no_comment_names_a_missing_design_file() {
    let sections = architecture_sections();
    assert!(sections.contains("1.3"), "{sections:?}");
    let mut sources = Vec::new();
    for dir in [
        "src",
        "tests",
        "benches",
        "fuzz",
        "manifests",
        "charts",
        "hack",
        "docs",
        "plugins",
    ] {
        files(
            &root().join(dir),
            &["rs", "yaml", "yml", "tpl", "sh", "md", "txt", "json"],
            &mut sources,
        );
    }
    sources.extend(
        [
            "README.md",
            "BENCHMARKS.md",
            "Cargo.toml",
            "build.rs",
            "Dockerfile",
            ".ci/run",
        ]
        .iter()
        .map(|f| root().join(f))
        .filter(|p| p.exists()),
    );
    let this = root().join("tests/docs.rs");
    let cite = "ARCHITECTURE.md §";
    let mut problems = Vec::new();
    for file in sources.iter().filter(|f| **f != this) {
        let text = read(file);
        let name = file.strip_prefix(root()).unwrap().display();
        for (n, line) in text.lines().enumerate() {
            let n = n + 1;
            for (at, _) in line.match_indices(cite) {
                let section: String = line[at + cite.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect();
                let section = section.trim_end_matches('.');
                // `docs/ARCHITECTURE.md §n`: the convention named, not a citation.
                if section.is_empty() && line[at + cite.len()..].starts_with('n') {
                    continue;
                }
                if !sections.contains(section) {
                    problems.push(format!(
                        "{name}:{n}: §{section} is no section of docs/ARCHITECTURE.md"
                    ));
                }
            }
            for stale in ["DESIGN §", "DESIGN.md"] {
                if line.contains(stale) {
                    problems.push(format!(
                        "{name}:{n}: names {stale:?}, a file the clone does not have (cite docs/ARCHITECTURE.md §n)"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
