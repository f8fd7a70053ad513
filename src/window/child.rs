//! clusterctl as a child process, and the signals `handoff move` passes on to it.

use std::path::Path;

use tokio::sync::watch;

pub use crate::window::plan::planner::ExitStatus;

/// Why clusterctl could not be run; the caller says on which cluster's behalf.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error("{0} version -o short did not answer within 30 s")]
    VersionTimeout(String),
    #[error(
        "cannot run {0}: {1} (--clusterctl names the binary; the default is clusterctl on PATH)"
    )]
    CannotRun(String, std::io::Error),
}

/// SIGINT and SIGTERM, caught from the moment a move may write until clusterctl is done, so
/// that they reach clusterctl first and handoff then leaves everything said and recorded.
pub struct Signals {
    rx: watch::Receiver<i32>,
}

impl Signals {
    pub fn catch() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let (tx, rx) = watch::channel(0);
        tokio::spawn(async move {
            loop {
                let sig = tokio::select! {
                    _ = int.recv() => libc::SIGINT,
                    _ = term.recv() => libc::SIGTERM,
                };
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
        Ok(Signals { rx })
    }

    /// A signal caught and not yet handed over by `next` or here.
    pub fn pending(&mut self) -> Option<i32> {
        match self.rx.has_changed() {
            Ok(true) => Some(*self.rx.borrow_and_update()).filter(|s| *s != 0),
            _ => None,
        }
    }

    /// The next signal.
    pub async fn next(&mut self) -> i32 {
        match self.rx.changed().await {
            Ok(()) => *self.rx.borrow_and_update(),
            // The catching task is gone: no signal will come.
            Err(_) => std::future::pending().await,
        }
    }

    /// From here on a signal does what it does by default (ends handoff): what is left (the
    /// restore) is recorded, and the same command finishes it.
    pub fn release(self) {
        // SAFETY: resetting two dispositions to their defaults; no handler runs meanwhile that
        // could observe a half-set state (tokio's only sets a flag).
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
        }
    }
}

/// `clusterctl version -o short`, as `handoff move` would run it: what it printed, or why it
/// could not be run (then the move could not run it either).
pub async fn version(clusterctl: &Path) -> Result<String, ChildError> {
    let run = tokio::process::Command::new(clusterctl)
        .args(["version", "-o", "short"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), run)
        .await
        .map_err(|_| ChildError::VersionTimeout(clusterctl.display().to_string()))?
        .map_err(|e| ChildError::CannotRun(clusterctl.display().to_string(), e))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// clusterctl run to its end for what it prints (a dry run's log: it logs to standard error),
/// both streams together; whether it exited 0.
pub async fn output(
    clusterctl: &Path,
    args: Vec<std::ffi::OsString>,
) -> Result<(bool, String), ChildError> {
    let out = tokio::process::Command::new(clusterctl)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| ChildError::CannotRun(clusterctl.display().to_string(), e))?;
    let mut said = String::from_utf8_lossy(&out.stderr).into_owned();
    said.push_str(&String::from_utf8_lossy(&out.stdout));
    Ok((out.status.success(), said))
}

pub struct Child {
    child: tokio::process::Child,
    pid: Option<i32>,
}

impl Child {
    /// Start `clusterctl move` with handoff's flags, in its own process group (a Ctrl-C in the
    /// terminal reaches handoff, which passes it on once) and bound to die with handoff
    /// (`PR_SET_PDEATHSIG`: a clusterctl left running would copy behind a re-run's back).
    /// `stdout_to_stderr`: clusterctl's output goes to handoff's standard error, where
    /// handoff's standard output is its JSON events.
    pub fn spawn(
        clusterctl: &Path,
        args: Vec<std::ffi::OsString>,
        stdout_to_stderr: bool,
    ) -> Result<Child, ChildError> {
        let mut cmd = tokio::process::Command::new(clusterctl);
        if stdout_to_stderr {
            cmd.stdout(std::io::stderr());
        }
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: getpid before the fork; prctl, getppid and _exit are async-signal-safe and
        // nothing else runs between fork and exec. The getppid check closes the race of
        // handoff dying before prctl took effect.
        unsafe {
            let parent = libc::getpid();
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| ChildError::CannotRun(clusterctl.display().to_string(), e))?;
        let pid = child.id().map(|p| p as i32);
        Ok(Child { child, pid })
    }

    /// A child started otherwise, to be waited on as clusterctl is.
    #[cfg(test)]
    pub fn from_tokio(child: tokio::process::Child) -> Child {
        let pid = child.id().map(|p| p as i32);
        Child { child, pid }
    }

    /// Its process id, while it has one (to signal it from a step while the runner waits on it).
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        use std::os::unix::process::ExitStatusExt as _;
        let status = self.child.wait().await?;
        Ok(ExitStatus {
            code: status.code(),
            signal: status.signal(),
        })
    }
}
