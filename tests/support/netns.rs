//! One test in a network namespace of its own, so that a Service's ClusterIP can exist: the
//! test binary runs that one test again under `unshare --net` (as root), where `lo` is brought
//! up and the test may put ClusterIPs on it (`add_loopback_ip`). Everything the test starts
//! (etcd and kube-apiserver on 127.0.0.1, the provider stand-ins on their ClusterIPs) lives in
//! that namespace and goes with it; nothing is added to the machine's own interfaces.
//!
//! ```ignore
//! #[test]
//! fn webhook_through_its_service() {
//!     if support::apiserver::skip() || !support::netns::in_own_netns("webhook_through_its_service") {
//!         return;
//!     }
//!     // from here on: in the namespace, `lo` up
//! }
//! ```
//!
//! Process clean-up is the harness's usual one: the re-executed binary is spawned through
//! `apiserver::spawn` (it gets `PR_SET_PDEATHSIG`, which `unshare` keeps across its `exec`, so it
//! dies with the outer binary), and what it spawns gets the same from it.
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set (to `1`) in the re-executed test binary, inside the namespace.
pub const IN_NETNS: &str = "HANDOFF_IN_NETNS";
/// The outer binary's network namespace, for the re-executed one to check it left it.
const OUTER_NETNS: &str = "HANDOFF_OUTER_NETNS";

/// How long the re-executed test may run before the outer one kills it and fails: 30 minutes,
/// or `HANDOFF_NETNS_RUN_LIMIT` seconds (a run of every crash case takes hours).
/// A line of a re-executed test's stderr that starts with this is shown in the log of every
/// run, passed or not (libtest shows a passing test's output only with `--nocapture`).
pub const ALWAYS_SHOWN: &str = "[shown] ";

fn run_limit() -> Duration {
    match std::env::var("HANDOFF_NETNS_RUN_LIMIT") {
        Err(_) => Duration::from_secs(30 * 60),
        Ok(v) => Duration::from_secs(v.trim().parse().unwrap_or_else(|_| {
            panic!("HANDOFF_NETNS_RUN_LIMIT={v:?}: give a whole number of seconds")
        })),
    }
}

/// True when the calling test is to go on: it now runs inside a network namespace of its own
/// with `lo` up. False when it must return at once: either the test already ran (and passed)
/// in a namespace of its own, re-executed from here, or namespaces cannot be made here (not
/// root, no `unshare` or `ip`), which skips it with one line on stderr, or fails it under
/// `HANDOFF_REQUIRE_APISERVER=1`.
///
/// `test_name` is the test's full libtest name (`module::test_fn`, just `test_fn` at the top of a
/// test file): the re-executed binary runs exactly that test.
pub fn in_own_netns(test_name: &str) -> bool {
    if std::env::var(IN_NETNS).is_ok_and(|v| v == "1") {
        assert!(
            in_test_netns(),
            "{IN_NETNS}=1 but this process is not in a network namespace the harness made: \
             {IN_NETNS} is for the harness's re-executed test binary only"
        );
        let out = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .output()
            .expect("ip link set lo up");
        assert!(
            out.status.success(),
            "ip link set lo up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        show_panics();
        return true;
    }
    if let Some(why) = cannot_unshare() {
        let required = std::env::var("HANDOFF_REQUIRE_APISERVER").is_ok_and(|v| v == "1");
        if required {
            panic!("HANDOFF_REQUIRE_APISERVER=1 but {test_name} needs a network namespace: {why}");
        }
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test_name}: it needs a network namespace of its own ({why}); run as root with unshare and ip on PATH"
        );
        return false;
    }
    run_in_netns(test_name);
    false
}

/// A panic in the re-executed test, shown in every run's log too: CI keeps only the head and the
/// tail of a long log, and a failed crash case's message sat in the cut-out middle.
fn show_panics() {
    let before = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let line = format!("{info}").replace('\n', " / ");
        let _ = writeln!(
            std::io::stderr(),
            "{ALWAYS_SHOWN}thread {:?} {line}",
            thread.name().unwrap_or("<unnamed>")
        );
        before(info);
    }));
}

/// Put `ip` (a ClusterIP, say) on `lo` of this test's namespace; adding it twice is fine.
/// Only inside `in_own_netns`: never on the machine's own loopback.
pub fn add_loopback_ip(ip: &str) {
    assert!(
        in_test_netns(),
        "add_loopback_ip({ip}) outside a test network namespace: call support::netns::in_own_netns first"
    );
    // `replace` rather than `add`: `add` of an address already there fails ("File exists").
    let out = Command::new("ip")
        .args(["addr", "replace", &format!("{ip}/32"), "dev", "lo"])
        .output()
        .expect("ip addr replace");
    assert!(
        out.status.success(),
        "ip addr replace {ip}/32 dev lo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The network namespace this process is in (`net:[<inode>]`).
fn own_netns() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .expect("/proc/self/ns/net")
}

/// Whether this is the harness's re-executed test binary in a namespace of its own: `IN_NETNS`
/// set, and a network namespace other than the one the outer binary recorded in `OUTER_NETNS`.
/// (PID 1's namespace is no reference: its `/proc/1/ns/net` may be unreadable even to root.)
fn in_test_netns() -> bool {
    std::env::var(IN_NETNS).is_ok_and(|v| v == "1")
        && std::env::var(OUTER_NETNS).is_ok_and(|outer| outer != own_netns())
}

/// Why this process cannot make a network namespace, if it cannot.
fn cannot_unshare() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    for tool in ["unshare", "ip"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{tool}` is not on PATH"));
        }
    }
    // Root without CAP_SYS_ADMIN (an unprivileged container) cannot unshare.
    match Command::new("unshare")
        .args(["--net", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`unshare --net true` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("unshare: {e}")),
    }
}

/// Run `test_name` alone in this binary again, inside a new network namespace; print what it
/// printed; fail unless exactly that one test ran and passed.
fn run_in_netns(test_name: &str) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new("unshare");
    cmd.arg("--net")
        .arg("--")
        .arg(&exe)
        // `--include-ignored`: an `#[ignore]`d test asked for by name (`-- --ignored NAME`) runs too.
        .args([
            "--exact",
            test_name,
            "--include-ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(IN_NETNS, "1")
        .env(OUTER_NETNS, own_netns())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = super::apiserver::spawn(cmd).expect("unshare --net (the test binary again)");
    let (tx, rx) = mpsc::channel::<(bool, String)>();
    let readers = [
        forward(child.stdout.take().expect("stdout"), false, tx.clone()),
        forward(child.stderr.take().expect("stderr"), true, tx),
    ];
    let mut stdout = String::new();
    let limit = run_limit();
    let deadline = started + limit;
    let mut exited_at: Option<Instant> = None;
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            // A line meant for every run's log (a crash case and its outcome), past libtest's
            // capture as well as in it.
            Ok((true, line)) if line.starts_with(ALWAYS_SHOWN) => {
                let _ = writeln!(std::io::stderr(), "{line}");
            }
            // Through the print macros, so that libtest captures it as the test's own output.
            Ok((true, line)) => eprintln!("{line}"),
            Ok((false, line)) => {
                println!("{line}");
                stdout.push_str(&line);
                stdout.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{test_name} in its own network namespace ran past {limit:?} (HANDOFF_NETNS_RUN_LIMIT): killed"
                );
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Exited, but something it started still holds its stdout or stderr open:
                // what was printed by then is enough.
                if let Ok(Some(_)) = child.try_wait() {
                    let exited = *exited_at.get_or_insert_with(Instant::now);
                    if exited.elapsed() > Duration::from_secs(5) {
                        break;
                    }
                }
            }
        }
    }
    if exited_at.is_none() {
        for r in readers {
            let _ = r.join();
        }
    }
    let status = child.wait().expect("wait for the namespaced test binary");
    eprintln!(
        "{test_name}: ran in its own network namespace in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "{test_name} failed in its own network namespace ({status}); its output is above"
    );
    let ran_one = stdout
        .lines()
        .any(|l| l.starts_with("test result: ok. 1 passed;"));
    assert!(
        ran_one,
        "the namespaced run of {test_name} did not report exactly one passed test (is {test_name:?} the test's full name, as `--exact` wants it?)"
    );
}

fn forward(
    from: impl Read + Send + 'static,
    is_stderr: bool,
    to: mpsc::Sender<(bool, String)>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            if to.send((is_stderr, line)).is_err() {
                return;
            }
        }
    })
}
