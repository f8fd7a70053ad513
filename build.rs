//! Records the git commit the binary is built from, for `handoff --version`, and whether the
//! tests can start a real API server.
//!
//! `HANDOFF_GIT_COMMIT` wins when set (the container build has no `.git`); otherwise
//! `git rev-parse --short HEAD`, and "unknown" when there is no git or no repository. The
//! script reruns only when that variable, `HEAD`, or the ref it points to changes, not on
//! every build.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    // Without any rerun-if line cargo would rerun the script whenever any file changes.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=HANDOFF_GIT_COMMIT");
    let commit = match std::env::var("HANDOFF_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => {
            watch_git();
            git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=HANDOFF_GIT_COMMIT={commit}");
    api_server_cfg();
}

/// `cfg(apiserver)` when the tests can start etcd and kube-apiserver (`KUBEBUILDER_ASSETS`), or
/// must (`HANDOFF_REQUIRE_APISERVER=1`, where a missing binary then fails them). Without it the
/// tests that need one are `#[ignore]`d with the command that runs them, so a local
/// `cargo test` reports them as ignored rather than as passed.
fn api_server_cfg() {
    println!("cargo::rustc-check-cfg=cfg(apiserver)");
    println!("cargo:rerun-if-env-changed=KUBEBUILDER_ASSETS");
    println!("cargo:rerun-if-env-changed=HANDOFF_REQUIRE_APISERVER");
    let assets = std::env::var_os("KUBEBUILDER_ASSETS").is_some_and(|v| !v.is_empty());
    let required = std::env::var("HANDOFF_REQUIRE_APISERVER").is_ok_and(|v| v == "1");
    if assets || required {
        println!("cargo:rustc-cfg=apiserver");
    }
}

/// `HEAD` (which moves on checkout), the branch ref it names (which moves on commit) and
/// `packed-refs` (where that ref may live instead). Paths that do not exist are not listed:
/// cargo would rerun the script on every build for them.
fn watch_git() {
    let mut paths = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        paths.push(PathBuf::from(dir).join("HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        let common = PathBuf::from(common);
        paths.push(common.join("packed-refs"));
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            paths.push(common.join(r));
        }
    }
    for p in paths.into_iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
