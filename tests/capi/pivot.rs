//! The book's "Pivot from a bootstrap cluster" page (`docs/src/tasks/pivot.md`), run as a
//! reader runs it: every ```` ```sh ```` block, in order, as one bash script
//! (`set -euo pipefail`), on the real Cluster API of the rig.
//!
//! The rig has no kind and no internet, so the page's lines that make, fill and delete clusters
//! are run by the rig's equivalents, each named in `RIG_LINES` and each replaced exactly once:
//! a management cluster of the rig (`up.sh`, which installs the providers as `clusterctl init`
//! does) stands in for each kind cluster, `workload.sh` (the real `clusterctl generate
//! cluster` with the rig's template, applied) for the page's own `generate | apply`, and the
//! second management cluster's kubeconfig for `clusterctl get kubeconfig` (the new cluster's
//! Machines are CAPD's in-memory fakes). Every other line runs as written, `handoff move`
//! (the binary under test, first on `PATH`, with the rig's clusterctl next) among them.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support;
use support::apiserver::{eventually, skip, text};
use support::book::sh_blocks;
use support::capi::{Mgmt, Rig};

const PAGE: &str = "docs/src/tasks/pivot.md";

/// The page's lines the rig runs its own way (see the module's comment).
const RIG_LINES: [&str; 6] = [
    "kind create cluster --name bootstrap --kubeconfig bootstrap.kubeconfig",
    "clusterctl init --kubeconfig bootstrap.kubeconfig --infrastructure docker",
    "clusterctl generate cluster mgmt --kubeconfig bootstrap.kubeconfig --namespace mgmt --flavor development --control-plane-machine-count 1 --worker-machine-count 1 | kubectl --kubeconfig bootstrap.kubeconfig apply -f -",
    "clusterctl get kubeconfig mgmt --kubeconfig bootstrap.kubeconfig --namespace mgmt > mgmt.kubeconfig",
    "clusterctl init --kubeconfig mgmt.kubeconfig --infrastructure docker",
    "kind delete cluster --name bootstrap",
];

/// What the rig runs for `RIG_LINES[i]`.
fn rig_line(i: usize, rig: &Rig, bootstrap: &Mgmt, mgmt: &Mgmt) -> String {
    let q = |p: &Path| format!("'{}'", p.display());
    match i {
        0 => format!("cp {} bootstrap.kubeconfig", q(&bootstrap.kubeconfig)),
        1 | 4 => ": # up.sh installed the providers as clusterctl init does".to_string(),
        2 => format!(
            "{} bootstrap.kubeconfig mgmt mgmt 1",
            q(&rig.scripts.join("workload.sh"))
        ),
        3 => format!("cp {} mgmt.kubeconfig", q(&mgmt.kubeconfig)),
        5 => format!("{} {}", q(&rig.scripts.join("down.sh")), q(&bootstrap.dir)),
        _ => unreachable!("{i}"),
    }
}

/// The page as one bash script, each of `RIG_LINES` replaced; how often each was found.
fn script(text: &str, replace: impl Fn(usize) -> String) -> (String, [usize; 6]) {
    let mut out = String::from("set -euo pipefail\nPS4='+ '\nset -x\n");
    let mut found = [0; 6];
    for (at, body) in sh_blocks(PAGE, text) {
        out.push_str(&format!("# ---- {PAGE}, the block at line {at} ----\n"));
        for line in body.lines() {
            match RIG_LINES.iter().position(|l| *l == line.trim()) {
                Some(i) => {
                    found[i] += 1;
                    out.push_str(&format!(
                        "# the rig's way of: {}\n{}\n",
                        line.trim(),
                        replace(i)
                    ));
                }
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
    }
    (out, found)
}

#[test]
fn the_page_is_a_script_whose_rig_lines_are_each_there_once() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE)).expect(PAGE);
    let (script, found) = script(&text, |i| format!("rig line {i}"));
    assert_eq!(found, [1; 6], "{PAGE}: each of {RIG_LINES:#?} once");
    // Whatever the rig cannot run must be among the replaced lines.
    for line in script.lines().filter(|l| !l.starts_with('#')) {
        let first = line.split_whitespace().next().unwrap_or("");
        assert!(
            first != "kind",
            "{PAGE}: a kind line the rig cannot run: {line}"
        );
        assert!(
            !line.contains("clusterctl init") && !line.contains("clusterctl generate"),
            "{PAGE}: a clusterctl line the rig cannot run: {line}"
        );
    }
    assert!(script.contains("handoff move --kubeconfig bootstrap.kubeconfig --to-kubeconfig mgmt.kubeconfig --namespace mgmt"));
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn every_command_of_the_pivot_page_runs_on_the_real_cluster_api() {
    if skip()
        || !support::netns::in_own_netns(
            "pivot::every_command_of_the_pivot_page_runs_on_the_real_cluster_api",
        )
    {
        return;
    }
    let Some(rig) = Rig::find() else {
        return;
    };
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    // Nothing of handoff in either: the page installs none of it.
    let mut clusters = rig.up(dir.path(), &["bootstrap", "mgmt"], &[]);
    let mgmt = clusters.pop().unwrap();
    let bootstrap = clusters.pop().unwrap();
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE)).expect(PAGE);
    let (body, found) = script(&page, |i| rig_line(i, &rig, &bootstrap, &mgmt));
    assert_eq!(found, [1; 6], "{PAGE}");

    let work = dir.path().join("reader");
    std::fs::create_dir_all(&work).expect("reader's folder");
    let handoff = Path::new(env!("CARGO_BIN_EXE_handoff"));
    let path = format!(
        "{}:{}:{}",
        handoff.parent().expect("bin dir").display(),
        rig.root.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&body)
        .current_dir(&work)
        .env("PATH", path)
        .env("CAPI_ROOT", &rig.root)
        .env_remove("KUBECONFIG");
    for (k, v) in rig.clusterctl_env() {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("bash");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!(
        "the page's script ({:.1}s):\n{stdout}\n{stderr}",
        t0.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "{PAGE} failed:\n{stdout}\n{stderr}");
    assert!(stderr.contains("namespace mgmt moved"), "{stderr}");
    for c in ["bootstrap", "mgmt"] {
        assert!(
            stdout.contains(&format!("nothing of handoff in {c}")),
            "{PAGE}: handoff left something in {c}:\n{stdout}"
        );
    }
    // The new cluster holds its own Cluster, re-provisioned by its own controllers, and nothing
    // of handoff; the bootstrap cluster is gone.
    mgmt.nothing_of_handoff_at_all();
    let said = eventually(
        "mgmt/mgmt re-provisioned in the new management cluster",
        Duration::from_secs(240),
        || mgmt.provisioned("mgmt", "mgmt", 2),
    );
    eprintln!("{said}");
    assert!(
        !bootstrap.kubectl(&["get", "namespaces"]).status.success(),
        "the bootstrap cluster still answers after the page deleted it"
    );
}
