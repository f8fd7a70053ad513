//! `docs/src/reference/cli.md`: every command of `handoff` and its flags, from clap's
//! `Cli::command()`, as `--help` would print them (hidden commands and flags left out).

use clap::{ArgAction, Command, CommandFactory as _};

use super::{Table, code, header, text};
use crate::cli::Cli;

/// A command, with the global flags its ancestors pass down to it.
struct Section {
    path: String,
    about: String,
    usage: String,
    flags: Table,
    inherited_from: Vec<String>,
}

pub fn page() -> String {
    let mut cmd = Cli::command().bin_name("handoff");
    // Names the subcommands `handoff window open`, and gives each the global flags of its
    // ancestors (left out of its own table below, where they are only named).
    cmd.build();
    let mut sections = Vec::new();
    walk(&mut cmd, &[], &mut sections);

    let mut out = header("src/cli.rs", "cli", "reference::cli_md_is_current");
    out.push_str("# Commands and flags\n\n");
    out.push_str(
        "Every command of `handoff` and each of its flags, as `handoff <command> --help` \
         prints them. Every command also takes `-h` (`--help`). Installed as a kubectl plugin, \
         the same commands run as `kubectl handoff <command>`. Durations are written as Go \
         writes them: `500ms`, `3s`, `1m`; the config file that `--config` names is described \
         in [The config file](config.md).\n\n",
    );
    let mut index = Table::new(&["Command", "What it does"]);
    for s in &sections {
        index.row(vec![
            format!("[`{}`](#{})", s.path, s.path.replace(' ', "-")),
            first_sentence(&s.about),
        ]);
    }
    out.push_str(&index.render());
    for s in &sections {
        out.push_str(&format!("\n## {}\n\n", s.path));
        if !s.about.is_empty() {
            out.push_str(&s.about);
            out.push_str("\n\n");
        }
        out.push_str(&format!("```text\n{}\n```\n\n", s.usage));
        if s.flags.rows.is_empty() {
            out.push_str("No flags of its own.\n");
        } else {
            out.push_str(&s.flags.render());
        }
        if !s.inherited_from.is_empty() {
            let names: Vec<String> = s.inherited_from.iter().map(|p| code(p)).collect();
            out.push_str(&format!(
                "\nAlso takes the global flags of {}.\n",
                names.join(" and ")
            ));
        }
    }
    out
}

/// Depth first, in the order `src/cli.rs` declares them.
fn walk(cmd: &mut Command, ancestors: &[(String, Vec<String>)], out: &mut Vec<Section>) {
    let path = cmd
        .get_bin_name()
        .expect("built commands have their bin name")
        .to_string();
    let about = cmd
        .get_long_about()
        .or(cmd.get_about())
        .map(|s| text(&s.to_string()))
        .unwrap_or_default();
    let usage = cmd.render_usage().to_string();
    let usage = usage
        .strip_prefix("Usage: ")
        .unwrap_or(&usage)
        .trim_end()
        .to_string();
    let inherited: Vec<&String> = ancestors.iter().flat_map(|(_, ids)| ids).collect();
    let mut flags = Table::new(&["Flag", "Default", "Values", "Description"]);
    let mut globals = Vec::new();
    // Positionals first, as clap's help shows them; otherwise as declared.
    let mut ordered: Vec<&clap::Arg> = cmd.get_arguments().collect();
    ordered.sort_by_key(|a| !a.is_positional());
    for arg in ordered {
        let id = arg.get_id().to_string();
        if arg.is_hide_set()
            || matches!(
                arg.get_action(),
                ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong
            )
            || inherited.contains(&&id)
        {
            continue;
        }
        if arg.is_global_set() {
            globals.push(id);
        }
        flags.row(flag_row(&path, arg));
    }
    let inherited_from = ancestors
        .iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(p, _)| p.clone())
        .rev()
        .collect();
    out.push(Section {
        path: path.clone(),
        about,
        usage,
        flags,
        inherited_from,
    });
    let mut below = ancestors.to_vec();
    below.push((path, globals));
    for sub in cmd.get_subcommands_mut() {
        // clap's own `help` subcommand: every command takes `--help` instead.
        if sub.is_hide_set()
            || sub.get_name() == "help" && sub.get_about().is_some_and(is_clap_help)
        {
            continue;
        }
        walk(sub, &below, out);
    }
}

fn is_clap_help(about: &clap::builder::StyledStr) -> bool {
    about
        .to_string()
        .starts_with("Print this message or the help of")
}

fn flag_row(command: &str, arg: &clap::Arg) -> Vec<String> {
    let takes_values = arg.get_action().takes_values();
    let value_name = arg
        .get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| arg.get_id().to_string().to_uppercase());
    let mut name = if arg.is_positional() {
        if arg.is_required_set() {
            format!("<{value_name}>")
        } else {
            format!("[{value_name}]")
        }
    } else {
        let mut n = String::new();
        if let Some(s) = arg.get_short() {
            n.push_str(&format!("-{s}, "));
        }
        n.push_str(&format!(
            "--{}",
            arg.get_long().expect("every option has a long name")
        ));
        if takes_values {
            n.push_str(&format!(" <{value_name}>"));
        }
        n
    };
    name = code(&name);
    if arg.is_global_set() {
        name.push_str(" (global)");
    }
    let default = if arg.is_required_set() {
        "required".to_string()
    } else if takes_values {
        arg.get_default_values()
            .iter()
            .map(|v| code(&v.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        String::new()
    };
    let mut values = String::new();
    if takes_values {
        let possible: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| match p.get_help() {
                Some(h) => format!("{} ({})", code(p.get_name()), text(&h.to_string())),
                None => code(p.get_name()),
            })
            .collect();
        values = possible.join(", ");
        if arg.get_value_delimiter().is_some() {
            values.push_str(if values.is_empty() {
                "a comma-separated list"
            } else {
                "; a comma-separated list"
            });
        }
    }
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| text(&h.to_string()))
        .unwrap_or_else(|| {
            panic!(
                "src/cli.rs: {name} of `{command}` has no doc comment, and the reference would say nothing of it"
            )
        });
    vec![name, default, values, help]
}

/// The index's summary of a command: its about up to the first full stop.
fn first_sentence(about: &str) -> String {
    match about.find(". ") {
        Some(i) if about[..i].matches('`').count().is_multiple_of(2) => about[..=i].to_string(),
        _ => about.to_string(),
    }
}
