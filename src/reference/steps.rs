//! `docs/src/reference/steps.md`: each command's steps, as `-o json`'s step events, `-v`'s
//! lines and the User-Agent of every request name them, read from their declarations
//! (`handoff::window::plan::declare`): the name is the variant's, the text its doc comment.

use handoff::window::plan::all_next::WholeStepName;
use handoff::window::plan::declare::{Of, StepName};
use handoff::window::plan::directory_plan::DirectoryStep;
use handoff::window::plan::move_next::StepName as MoveStep;
use handoff::window::plan::window_next::{CloseStepName, OpenStepName};

use super::{Table, code, header, text};

fn table<N: StepName>() -> String {
    let mut t = Table::new(&["step", "what it does"]);
    for step in N::ALL {
        t.row(vec![code(step.as_str()), text(step.doc())]);
    }
    t.render()
}

pub fn page() -> String {
    let of = |o: Of| code(o.as_str());
    let mut page = header(
        "the step declarations (src/window/plan/move_next.rs, all_next.rs, window_next.rs, directory_plan.rs)",
        "steps",
        "reference::steps_md_is_current",
    );
    page.push_str(&format!(
        "# Steps\n\n\
         What `handoff move` (and its backup and restore) and `handoff window` say they do, step by \
         step: `-o json` gives each as `{{\"event\":\"step\",\"of\":…,\"step\":…}}`, `-v` as a line \
         `<of> step: <step>`, and every request a step sends names it in its User-Agent, \
         `handoff/<version> (<of> step <step>)`, which the API server's audit log keeps. In which \
         order a run takes them, and where a re-run or an `--abort` begins, is in [Moving a \
         namespace](../tasks/move.md#progress-for-people-and-for-pipelines).\n\n\
         ## A move\n\n`of`: {}. A move runs the window steps inside its own: `StopTarget` and \
         `Hold` open the windows, `RestoreTarget` and `RestoreSource` close them.\n\n{}\n\
         ## A whole management cluster's move\n\n`of`: {} (`handoff move --all-namespaces`). \
         `Stop` opens both windows, `RestoreTarget` and `RestoreSource` close them.\n\n{}\n\
         ## A backup or a restore\n\n`of`: {} or {}.\n\n{}\n\
         ## `window open`\n\n`of`: {}.\n\n{}\n\
         ## `window close`\n\n`of`: {}.\n\n{}",
        of(Of::Move),
        table::<MoveStep>(),
        of(Of::WholeMove),
        table::<WholeStepName>(),
        of(Of::Backup),
        of(Of::Restore),
        table::<DirectoryStep>(),
        of(Of::WindowOpen),
        table::<OpenStepName>(),
        of(Of::WindowClose),
        table::<CloseStepName>(),
    ));
    page
}

/// The code spans of the book's list that begins with `from`, up to its ": a new move".
fn names_in(page: &str, from: &str) -> std::collections::BTreeSet<String> {
    let joined = page.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = joined
        .find(from)
        .unwrap_or_else(|| panic!("docs/src/tasks/move.md no longer says {from:?}"));
    let rest = &joined[start..];
    let sentence = &rest[..rest.find(": a new move").unwrap_or(rest.len())];
    sentence
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_books_list_of_a_moves_steps_is_the_declared_one() {
    let book = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/tasks/move.md"),
    )
    .expect("docs/src/tasks/move.md");
    let declared: std::collections::BTreeSet<String> = MoveStep::ALL
        .iter()
        .map(|s| s.as_str().to_string())
        .collect();
    assert_eq!(names_in(&book, "A move's step is one of"), declared);
}
