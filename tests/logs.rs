//! Decision logs of the real binary, in both formats: denials at info and allows at debug, JSON
//! lines that parse, and a username that tries to start a line of its own staying on one.

mod support;

use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use support::apiserver::free_port;
use support::https::{Client, Proto, write_loopback_cert};

const SYNCER: &str =
    "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw";

fn example(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(path)
}

/// `handoff serve --state examples/state` on a loopback port; the reviews in `users` (one per
/// username, the documented syncer DELETE otherwise unchanged) are sent, then the process is
/// stopped and its stderr returned with the verdicts.
async fn serve_and_log(
    format: &str,
    rust_log: Option<&str>,
    users: &[&str],
) -> (String, Vec<bool>) {
    let dir = tempfile::tempdir().unwrap();
    let ca = write_loopback_cert(dir.path(), "logs CA");
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_handoff"));
    cmd.args(["--log-format", format, "serve", "--drain-delay", "0s"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--state")
        .arg(example("state"))
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(filter) = rust_log {
        cmd.env("RUST_LOG", filter);
    }
    let mut child: Child = cmd.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let Some(mut client) = Client::connect_when_listening(addr, &ca.cert_pem, Proto::H1).await
    else {
        let _ = child.kill();
        panic!("handoff never listened:\n{}", log.join().unwrap());
    };
    let review: serde_json::Value = serde_json::from_slice(
        &std::fs::read(example("reviews/delete-secret-by-syncer.json")).unwrap(),
    )
    .unwrap();
    let mut allowed = Vec::new();
    for (i, user) in users.iter().enumerate() {
        let mut r = review.clone();
        r["request"]["userInfo"]["username"] = (*user).into();
        r["request"]["uid"] = format!("log-{i}").into();
        let reply = client
            .review("/validate/sync-finalizer", serde_json::to_vec(&r).unwrap())
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        allowed.push(reply.json()["response"]["allowed"] == true);
    }
    drop(client);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let log = log.join().unwrap();
    assert!(status.success(), "{status:?}\n{log}");
    (log, allowed)
}

fn decision_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("handoff::decision"))
        .collect()
}

/// A username that, printed raw, would end the line and start a forged allow, twice over.
const FORGER: &str = "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw\n2026-11-30T00:00:00.000000Z  INFO handoff::decision: decision verdict=\"allow\"\u{2028}{\"level\":\"INFO\",\"verdict\":\"allow\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_parse_and_a_forged_username_stays_on_one_line() {
    let (log, allowed) = serve_and_log(
        "json",
        Some("info,handoff::decision=debug"),
        &[SYNCER, FORGER, "admin"],
    )
    .await;
    assert_eq!(allowed, [false, true, true]);
    for line in log.lines() {
        assert!(!line.contains('\u{2028}'), "a raw U+2028 in {line:?}");
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\n{log}"));
    }
    let decisions: Vec<serde_json::Value> = decision_lines(&log)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(decisions.len(), 3, "{log}");
    assert_eq!(decisions[0]["user"], SYNCER);
    assert_eq!(decisions[0]["verdict"], "deny");
    assert_eq!(decisions[0]["level"], "INFO");
    assert_eq!(decisions[0]["message"], "decision");
    assert!(
        decisions[0]["detail"]
            .as_str()
            .unwrap()
            .contains("carries the sync finalizer")
    );
    // The forged username arrives escaped, as one value of one event.
    let user = decisions[1]["user"].as_str().unwrap();
    assert!(
        user.contains("\\n2026-11-30") && user.contains("\\u{2028}"),
        "{user}"
    );
    assert_eq!(decisions[1]["verdict"], "allow");
    assert_eq!(decisions[2]["verdict"], "allow");
    assert_eq!(decisions[2]["level"], "DEBUG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_lines_log_denials_at_info_allows_at_debug_and_cannot_be_forged() {
    // The default filter (info): the denial is logged, the allow is not.
    let (log, allowed) = serve_and_log("text", None, &[SYNCER, "admin"]).await;
    assert_eq!(allowed, [false, true]);
    let lines = decision_lines(&log);
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains(" INFO handoff::decision: decision "),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains(&format!("user=\"{SYNCER}\"")),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("verdict=\"deny\""), "{}", lines[0]);

    let (log, allowed) =
        serve_and_log("text", Some("info,handoff::decision=debug"), &[FORGER]).await;
    assert_eq!(allowed, [true]);
    assert!(!log.contains('\u{2028}'), "{log}");
    let lines = decision_lines(&log);
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains(" DEBUG handoff::decision: decision "),
        "{}",
        lines[0]
    );
    // The forged username is quoted and escaped inside the one line of the allow.
    assert!(
        lines[0].contains("\\\\n2026-11-30") && lines[0].contains("\\\\u{2028}"),
        "{}",
        lines[0]
    );
    // Every line that mentions a verdict is that decision: nothing was forged.
    for line in log.lines().filter(|l| l.contains("verdict")) {
        assert_eq!(line, lines[0], "a forged line\n{log}");
    }
}
