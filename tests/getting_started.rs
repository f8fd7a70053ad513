//! The book's "Getting started" chapter (`docs/src/getting-started.md`), run as a reader runs
//! it: every ```` ```sh ```` block, in order, as one bash script (`set -euo pipefail`), against
//! the real API server the chapter itself starts with `hack/dev-cluster.sh`.
//!
//! The script runs in a temporary folder holding a copy of what the chapter's relative paths
//! name (`manifests/`, without any `certs/`, and `hack/dev-cluster.sh`), so it writes nothing
//! into the clone. `TMPDIR` points into that folder, so the chapter's `mktemp -d` (the
//! development cluster's folder) is found afterwards and stopped even when the script failed.
//! The handoff binary under test is first on `PATH`, and the chapter's one `cargo build` line is
//! the only line replaced (by a comment saying so): the binary is already built, and cargo must
//! not run inside `cargo test`. Nothing else is skipped or rewritten.
//!
//! The script is its own process group: whatever it left running (`handoff serve` when the
//! chapter's trap did not get to run, etcd and kube-apiserver) is stopped when the test ends,
//! passed or failed.

mod support;

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::apiserver::skip;
use support::book::sh_blocks;

const CHAPTER: &str = "docs/src/getting-started.md";
/// The chapter's build step: the one line of it this test does not run.
const CARGO_BUILD: &str = "cargo build";
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The chapter as one bash script, with the `cargo build` line replaced; and how many lines
/// were replaced.
fn script(text: &str) -> (String, usize) {
    let mut out = String::from("set -euo pipefail\nPS4='+ '\nset -x\n");
    let mut replaced = 0;
    for (at, body) in sh_blocks(CHAPTER, text) {
        out.push_str(&format!("# ---- {CHAPTER}, the block at line {at} ----\n"));
        for line in body.lines() {
            if line.trim() == CARGO_BUILD {
                out.push_str(
                    ": # 'cargo build' replaced by tests/getting_started.rs: the handoff under test is already built and first on PATH\n",
                );
                replaced += 1;
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    (out, replaced)
}

#[test]
fn the_chapter_is_a_script_with_one_build_step() {
    let text = std::fs::read_to_string(root().join(CHAPTER)).expect(CHAPTER);
    let blocks = sh_blocks(CHAPTER, &text);
    assert!(
        blocks.len() >= 8,
        "{CHAPTER}: only {} sh blocks",
        blocks.len()
    );
    let (script, replaced) = script(&text);
    assert!(replaced <= 1, "{CHAPTER}: {replaced} `cargo build` lines");
    // Any other cargo line would run cargo from the test's copy, which has no Cargo.toml.
    let cargo: Vec<&str> = script
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == "cargo"))
        .filter(|l| !l.starts_with(": #"))
        .collect();
    assert!(
        cargo.is_empty(),
        "{CHAPTER} runs cargo beyond its build step, which the test cannot: {cargo:?}"
    );
    for link in [
        "(tasks/install.md)",
        "(tasks/hold-a-namespace.md)",
        "(tasks/move.md)",
        "(operations/runbooks.md)",
    ] {
        assert!(
            text.contains(link),
            "{CHAPTER} no longer links {link} under Next"
        );
    }
}

/// Stops what the script left running, when the test ends however it ends.
struct Leftovers {
    /// The script's process group (its bash's PID).
    group: i32,
    tmp: PathBuf,
    dev_cluster: PathBuf,
}

impl Leftovers {
    /// The development clusters the chapter started (folders under the script's `TMPDIR` with a
    /// PID file in them).
    fn cluster_dirs(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.tmp) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|d| {
                ["kube-apiserver.pid", "etcd.pid", "kubeconfig"]
                    .iter()
                    .any(|f| d.join(f).exists())
            })
            .collect()
    }

    /// The last lines of every log the chapter's processes wrote, for a failure message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for dir in self.cluster_dirs() {
            for log in ["handoff.log", "kube-apiserver.log", "etcd.log"] {
                let path = dir.join(log);
                if path.exists() {
                    out.push_str(&format!(
                        "\n--- {}\n{}\n",
                        path.display(),
                        support::apiserver::tail(&path)
                    ));
                }
            }
        }
        out
    }

    fn kill_group(&self) {
        // SAFETY: kill(2) on the process group this test created; ESRCH (nothing left) is fine.
        unsafe {
            libc::kill(-self.group, libc::SIGKILL);
        }
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for dir in self.cluster_dirs() {
            if dir.join("kube-apiserver.pid").exists() || dir.join("etcd.pid").exists() {
                let _ = Command::new("bash")
                    .arg(&self.dev_cluster)
                    .arg("stop")
                    .arg(&dir)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        self.kill_group();
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            // A reader's generated certificates (git-ignored) are not the chapter's to reuse.
            if e.file_name() != "certs" {
                copy_tree(&e.path(), &target);
            }
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// The lines of `output` that the chapter's `replicas` function printed.
fn replicas_lines(output: &str) -> Vec<&str> {
    output
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("replicas="))
        .collect()
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test --test getting_started"
)]
fn every_command_of_the_getting_started_chapter_runs_against_a_real_api_server() {
    if skip() {
        return;
    }
    // The local overlay registers https://127.0.0.1:8443, so the chapter's handoff listens
    // there; say so plainly rather than fail halfway when something else holds it.
    if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", 8443)) {
        panic!(
            "127.0.0.1:8443 is not free ({e}): the chapter's `handoff serve` listens there (the local overlay's URL)"
        );
    }
    let text = std::fs::read_to_string(root().join(CHAPTER)).expect(CHAPTER);
    let (body, replaced) = script(&text);
    assert_eq!(
        replaced, 1,
        "{CHAPTER}: expected its one `cargo build` line"
    );

    let work = tempfile::Builder::new()
        .prefix("handoff-getting-started-")
        .tempdir()
        .expect("temp dir");
    let w = work.path();
    copy_tree(&root().join("manifests"), &w.join("manifests"));
    std::fs::create_dir_all(w.join("hack")).expect("hack/");
    std::fs::copy(
        root().join("hack/dev-cluster.sh"),
        w.join("hack/dev-cluster.sh"),
    )
    .expect("hack/dev-cluster.sh");
    std::fs::create_dir_all(w.join("tmp")).expect("tmp/");
    let script_path = w.join("getting-started.sh");
    std::fs::File::create(&script_path)
        .and_then(|mut f| f.write_all(body.as_bytes()))
        .expect("script");

    let bin = PathBuf::from(env!("CARGO_BIN_EXE_handoff"));
    let path = format!(
        "{}:{}",
        bin.parent().expect("bin dir").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log_path = w.join("output.log");
    let log = std::fs::File::create(&log_path).expect("output log");
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg(&script_path)
        .current_dir(w)
        .env("PATH", path)
        .env("TMPDIR", w.join("tmp"))
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("bash");
    let leftovers = Leftovers {
        group: child.id() as i32,
        tmp: w.join("tmp"),
        dev_cluster: w.join("hack/dev-cluster.sh"),
    };
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > SCRIPT_TIMEOUT {
            leftovers.kill_group();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = started.elapsed();
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let context = || format!("--- the script's output\n{output}{}", leftovers.logs());
    let _ = writeln!(
        std::io::stderr(),
        "getting-started: the chapter ran in {:.1} s",
        took.as_secs_f64()
    );
    match status {
        None => panic!(
            "the chapter did not finish within {SCRIPT_TIMEOUT:?}\n{}",
            context()
        ),
        Some(s) => assert!(
            s.success(),
            "the chapter's script failed ({s})\n{}",
            context()
        ),
    }

    // The denial, as the reader sees it, and the deletes that pass.
    for expected in [
        r#"Error from server (Forbidden): admission webhook "sync-finalizer.handoff.dev" denied the request: namespace "kcp-33jbiactwhg0" carries the sync finalizer finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g="glbc-migration" for sync target "us-west1" (cluster root:org:ws), so that sync target may not delete configmaps "app-config""#,
        "refused (exit status 1)",
        r#"configmap "app-config" deleted"#,
        r#"configmap "app-cache" deleted"#,
    ] {
        assert!(
            output.contains(expected),
            "the chapter's output lacks {expected:?}\n{}",
            context()
        );
    }
    // The window: 2 before, pinned to 0 with the 2 saved (and still after a scale to 3), 2 after.
    assert_eq!(
        replicas_lines(&output),
        [
            "replicas=2 saved=",
            "replicas=0 saved=2",
            "replicas=0 saved=2",
            "replicas=2 saved="
        ],
        "the Deployment's replicas through the window\n{}",
        context()
    );
    // What the chapter shows as output is what the commands print.
    for line in [
        "ok (sync-finalizer: enforce, move-window: enforce)",
        "cluster: pinned capi-system/capi-controller-manager to 0 replicas (was 2)",
        r#"Warning: MoveWindow "capi-move" pins Deployment capi-system/capi-controller-manager to 0 replicas; it will be restored to 2 when the window closes; the 3 asked for is not recorded (annotate handoff.dev/replicas-before-move to change it)"#,
        "cluster: restored capi-system/capi-controller-manager to 2",
    ] {
        assert!(
            output.lines().any(|l| l.trim() == line),
            "the chapter's output lacks the line {line:?}\n{}",
            context()
        );
        assert!(
            text.contains(line),
            "{CHAPTER} no longer shows the line {line:?} that the commands print"
        );
    }
    // The chapter's own clean-up stopped everything and removed the cluster's folder.
    assert!(
        leftovers.cluster_dirs().is_empty(),
        "the chapter left its development cluster behind: {:?}",
        leftovers.cluster_dirs()
    );
    drop(leftovers);
}
