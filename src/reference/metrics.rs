//! `docs/src/reference/metrics.md`: every metric `/metrics` serves, read back from the text
//! exposition of the registry as `handoff serve` builds it (`Metrics::new`, then
//! `register_telemetry`, `set_rollout` and, at each scrape, `observe`).
//!
//! prometheus-client leaves a family that has no series out of the exposition entirely (no
//! `# HELP`, no `# TYPE`), so the page is read from a registry in which every family has been
//! given one series; which families a fresh server shows is read from one that has not. A
//! family added to `src/server/metrics.rs` without a series here fails
//! `every_registered_metric_is_on_the_page`.

use std::collections::BTreeMap;

use handoff::server::metrics::{
    DenialLabels, Metrics, ModeLabels, RequestLabels, WatchLabels, WebhookLabels, WindowLabels,
};
use handoff::state::State;

use super::{Table, code, header, text};

/// What the exposition says of one metric family.
#[derive(Debug, Default)]
struct Family {
    help: String,
    kind: String,
    /// Sample names after the family's (`_total`, `_bucket`, ...), in the order they came.
    suffixes: Vec<String>,
    labels: Vec<String>,
    buckets: Vec<String>,
}

/// The registry as `handoff serve` has it on its first scrape: serving both webhooks, without
/// kcp, the config file's rollout (every default) published.
fn as_served() -> Metrics {
    let state = State::new(Default::default());
    let mut metrics = Metrics::new();
    metrics.register_telemetry(&state.telemetry);
    metrics.set_rollout(&state.rollout());
    metrics.observe(&state);
    metrics
}

/// The same, with a series in every family that traffic or an open window would create (its
/// label values are made up: only the label names are read).
fn with_every_family() -> Metrics {
    let m = as_served();
    let _ = m.requests.get_or_create(&RequestLabels {
        webhook: "sync-finalizer",
        operation: "DELETE",
        verdict: "allow",
        code: 200,
    });
    let _ = m.latency.get_or_create(&WebhookLabels {
        webhook: "sync-finalizer",
    });
    let _ = m.exempt.get_or_create(&WebhookLabels {
        webhook: "sync-finalizer",
    });
    let _ = m.denials.get_or_create(&DenialLabels {
        webhook: "sync-finalizer",
        reason: "held",
    });
    let _ = m.enforcement.get_or_create(&ModeLabels {
        webhook: "sync-finalizer",
        mode: "enforce",
    });
    let _ = m.watch_failing.get_or_create(&WatchLabels {
        watch: "namespaces",
    });
    let window = WindowLabels {
        window: "move-default".into(),
    };
    let _ = m.window_opened.get_or_create(&window);
    let _ = m.window_held_leases.get_or_create(&window);
    m
}

/// `# HELP`, `# TYPE` and the samples of an OpenMetrics text exposition, by family name.
fn parse(exposition: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut current = String::new();
    for line in exposition.lines() {
        if line == "# EOF" {
            break;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            current = name.to_string();
            families.entry(current.clone()).or_default().help = help.replace("\\n", " ");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            assert_eq!(name, current, "# TYPE after its # HELP");
            families.get_mut(name).expect("described").kind = kind.to_string();
        } else if line.starts_with("# UNIT ") {
            continue;
        } else if !line.is_empty() {
            let family = families
                .get_mut(&current)
                .expect("a sample after its # TYPE");
            let (sample, labels) = match line.split_once('{') {
                Some((s, rest)) => (s, rest.rsplit_once('}').expect("labels end with }").0),
                None => (line.split_whitespace().next().unwrap_or(""), ""),
            };
            let suffix = sample
                .strip_prefix(current.as_str())
                .expect("a sample is named after its family")
                .to_string();
            if !family.suffixes.contains(&suffix) {
                family.suffixes.push(suffix);
            }
            for pair in split_labels(labels) {
                let (label, value) = pair.split_once('=').expect("label=\"value\"");
                let value = value.trim_matches('"');
                if label == "le" && family.kind == "histogram" {
                    if !family.buckets.iter().any(|b| b == value) {
                        family.buckets.push(value.to_string());
                    }
                } else if !family.labels.iter().any(|l| l == label) {
                    family.labels.push(label.to_string());
                }
            }
        }
    }
    families
}

/// `a="x",b="y, z"` as `a="x"`, `b="y, z"`.
fn split_labels(labels: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in labels.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&labels[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < labels.len() {
        out.push(&labels[start..]);
    }
    out
}

pub fn page() -> String {
    let all = parse(&with_every_family().encode());
    let fresh = parse(&as_served().encode());
    let mut out = header(
        "the registry of src/server/metrics.rs, as `handoff serve` builds it,",
        "metrics",
        "reference::metrics_md_is_current",
    );
    out.push_str("# Metrics\n\n");
    out.push_str(
        "Every metric `GET /metrics` serves (OpenMetrics text, on the HTTPS listener and on \
         `--metrics-listen`), as the registry encodes it. A metric with labels has no lines at \
         all, not even its `# HELP`, until its first series exists. *At start-up* says whether \
         the first scrape of a server that serves both webhooks, without kcp, shows it: an \
         alert on one marked no must allow for its absence (`absent()`, `or vector(0)`).\n\n",
    );
    let mut t = Table::new(&["Metric", "Type", "Labels", "At start-up", "Help"]);
    for (name, f) in &all {
        // `_bucket` first, as a histogram's are read.
        let mut suffixes = f.suffixes.clone();
        suffixes.sort_by_key(|s| s != "_bucket");
        let samples: Vec<String> = suffixes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i == 0 {
                    code(&format!("{name}{s}"))
                } else {
                    code(s)
                }
            })
            .collect();
        let mut kind = f.kind.clone();
        if let (Some(first), Some(last)) = (
            f.buckets.first(),
            f.buckets.iter().rev().find(|b| *b != "+Inf"),
        ) {
            kind.push_str(&format!(
                ", {} buckets from {first} to {last}",
                f.buckets.iter().filter(|b| *b != "+Inf").count()
            ));
        }
        t.row(vec![
            samples.join(", "),
            kind,
            f.labels
                .iter()
                .map(|l| code(l))
                .collect::<Vec<_>>()
                .join(", "),
            if fresh.contains_key(name) {
                "yes"
            } else {
                "no"
            }
            .into(),
            text(&f.help),
        ]);
    }
    out.push_str(&t.render());
    out
}

/// The names `src/server/metrics.rs` registers (the only file that holds the registry),
/// read from its source: `register(` followed by a string literal.
fn registered_in_source() -> Vec<String> {
    let source = include_str!("../server/metrics.rs");
    let calls =
        source.matches(".register(").count() + source.matches(".register_with_unit(").count();
    let names: Vec<String> = source
        .split(".register")
        .skip(1)
        .filter_map(|after| {
            let after = after
                .strip_prefix('(')
                .or(after.strip_prefix("_with_unit("))?;
            let literal = after.trim_start().strip_prefix('"')?;
            Some(format!("handoff_{}", &literal[..literal.find('"')?]))
        })
        .collect();
    assert_eq!(
        names.len(),
        calls,
        "every registration in src/server/metrics.rs names its metric with a string literal"
    );
    names
}

#[test]
fn every_registered_metric_is_on_the_page() {
    let registered = registered_in_source();
    assert!(registered.len() > 20, "{registered:?}");
    let exposed = parse(&with_every_family().encode());
    let mut missing: Vec<&String> = registered
        .iter()
        .filter(|n| !exposed.contains_key(*n))
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "registered but without a series in src/reference/metrics.rs `with_every_family`, so \
         the reference would not list them: {missing:?}"
    );
    assert_eq!(exposed.len(), registered.len(), "{:?}", exposed.keys());
    for (name, f) in &exposed {
        assert!(!f.help.is_empty() && !f.kind.is_empty(), "{name}: {f:?}");
    }
}

#[test]
fn a_family_without_series_is_left_out_of_the_exposition() {
    // What the page says of prometheus-client: true of the version this builds with.
    let fresh = parse(&as_served().encode());
    assert!(!fresh.contains_key("handoff_denials"), "{:?}", fresh.keys());
    assert!(fresh.contains_key("handoff_enforcement_mode"));
    assert!(fresh.contains_key("handoff_handler_panics"));
}
