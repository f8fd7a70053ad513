//! `handoff move`: `clusterctl move` as a child process, with both clusters' controllers
//! stopped around it in the order clusterctl needs, and a way back. `move_next` decides each
//! step; this file is the driver (read, ask, perform, come back) and `steps` performs them, one
//! function each; `clusterctl` runs clusterctl, `restore` brings the controllers back.

mod cluster_api;
mod clusterctl;
mod directory;
mod pause_watch;
mod restore;
mod steps;
mod whole;
mod whole_dry_run;

pub use directory::{DirectoryOptions, run as directory_run};
pub use whole::{namespaces as whole_namespaces, run as whole_run};

use crate::window::progress::Progress;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::window::close::{CloseOptions, Restored};
use crate::window::cluster::{Cluster, Result, WindowError, read_window, record};

use crate::resources::move_window::{MoveRecord, MoveRole, WindowState};
use crate::window::child::Child;
use crate::window::open::{OpenOptions, Taken};
use crate::window::plan::move_next::{
    self, Asked, Found, MovePlanner, Observed, Reached, Read, Reads, Seen, Step,
};
use crate::window::plan::move_plan::ClusterctlFlags;
use crate::window::runner::{self, Performer, Publish};
use crate::window::user_agent::StepLabel;
use cluster_api::{clusters_in, scan, scope, secrets_in};
use clusterctl::dry_run;
use pause_watch::PauseWatch;

/// How often the source is read while clusterctl waits on handoff's block-move.
pub const MOVE_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct MoveOptions {
    pub window: String,
    pub flags: ClusterctlFlags,
    pub clusterctl: PathBuf,
    pub abort: bool,
    /// How each cluster's window is opened (its name is `window`).
    pub open: OpenOptions,
    pub close: CloseOptions,
    /// How often the source is read while clusterctl waits.
    pub poll: Duration,
    /// Set to each step as it is performed: the clients' User-Agent says it.
    pub step_label: StepLabel,
}

async fn read_record(c: &Cluster, window: &str) -> Result<Option<MoveRecord>> {
    Ok(read_window(c, window)
        .await?
        .and_then(|w| w.status)
        .and_then(|s| s.move_record))
}

/// Change the move's record on the target's window, where there is one: an `--abort` of a
/// move that died before it recorded anything must leave none (a record of no namespace would
/// refuse the next move).
async fn note(c: &Cluster, window: &str, f: impl Fn(&mut MoveRecord)) -> Result<()> {
    write_record(c, window, false, f).await
}

/// Begin the move's record (or a re-run's, over the one there).
async fn begin(c: &Cluster, window: &str, f: impl Fn(&mut MoveRecord)) -> Result<()> {
    write_record(c, window, true, f).await
}

/// Nothing to record where there is no window yet (an `--abort` of a move that never started).
async fn write_record(
    c: &Cluster,
    window: &str,
    create: bool,
    f: impl Fn(&mut MoveRecord),
) -> Result<()> {
    match record(c, window, |s| match (&mut s.move_record, create) {
        (Some(m), _) => f(m),
        (r @ None, true) => f(r.get_or_insert_with(MoveRecord::default)),
        (None, false) => {}
    })
    .await
    {
        Err(WindowError::Api {
            source: kube::Error::Api(e),
            ..
        }) if e.code == 404 => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Whether clusterctl had begun deleting from the source. It deletes only once it has created
/// everything in the target: an object marked or being deleted in the source, or one the
/// target holds and the source no longer does, says the deletes have begun.
async fn deleting(
    source: &Cluster,
    target: &Cluster,
    ns: &str,
    out: &mut Progress,
) -> Result<bool> {
    let (mut s, mut t) = (scan(source, ns).await?, scan(target, ns).await?);
    match (secrets_in(source, ns).await?, secrets_in(target, ns).await?) {
        (Some(ss), Some(ts)) => {
            s.objects.extend(ss.objects);
            s.deleting.extend(ss.deleting);
            t.objects.extend(ts.objects);
        }
        _ => {
            out.warn(format!("cannot list the Secrets of namespace {ns} (forbidden), so whether clusterctl had begun deleting them from the source is judged by its other objects alone; clusterctl itself needs them: run handoff move as the user who runs clusterctl move"));
        }
    }
    Ok(!s.deleting.is_empty() || t.objects.iter().any(|o| !s.objects.contains(o)))
}

/// A phase: its name on a line, its duration when it ends.
struct Phase {
    started: Instant,
}

fn phase(out: &mut Progress, what: &str) -> Phase {
    out.say(format!("handoff move: {what}"));
    Phase {
        started: Instant::now(),
    }
}

impl Phase {
    fn done(self, out: &mut Progress, what: &str) {
        out.say(format!(
            "handoff move: {what} ({:.1}s)",
            self.started.elapsed().as_secs_f64()
        ));
    }
}

/// One run of `handoff move` (or its `--abort`): the clusters, what the steps hand on to
/// each other, and where output goes.
struct Mover<'a> {
    source: &'a Cluster,
    target: &'a Cluster,
    opts: &'a MoveOptions,
    /// How each cluster's window is opened (its reason names the move).
    source_opts: OpenOptions,
    target_opts: OpenOptions,
    /// clusterctl, from its start until the runner takes it to wait on; its pid, to pass a
    /// signal on; the timed line its start opened.
    clusterctl: Option<Child>,
    clusterctl_pid: Option<i32>,
    clusterctl_started: Option<Phase>,
    /// The source's Clusters, watched from before clusterctl starts, for its pause.
    pauses: Option<PauseWatch>,
    waited: clusterctl::Waited,
    /// The controllers taken and not yet proven: the target's, then the source's
    /// (`ProveStopped` proves them together).
    taken: Vec<Taken>,
    restored: Vec<Restored>,
    started: Instant,
    out: &'a mut Progress,
}

impl Mover<'_> {
    fn cluster(&self, role: MoveRole) -> &Cluster {
        match role {
            MoveRole::Source => self.source,
            MoveRole::Target => self.target,
        }
    }

    fn refused(&self, role: MoveRole, message: impl Into<String>) -> WindowError {
        WindowError::Refused {
            cluster: self.cluster(role).label.into(),
            message: message.into(),
        }
    }

    /// What `next` needs read, beside the record, and nothing it does not.
    async fn observe(&mut self, reads: &Reads, r: Option<&MoveRecord>) -> Result<Observed> {
        let (source, target, ns) = (self.source, self.target, reads.namespace.as_str());
        let mut seen = Observed::default();
        let recorded = r.map(|r| r.cluster_classes.as_slice()).unwrap_or_default();
        // `reads` asks for the classes wherever it asks for the Clusters.
        if reads.clusters || reads.classes {
            let scope = scope(source, ns, recorded, reads.clusters).await?;
            seen.classes = Seen::Read(scope.classes);
            if reads.clusters {
                seen.source = Seen::Read(scope.clusters);
                seen.class_users = Seen::Read(scope.class_users);
                seen.target = Seen::Read(clusters_in(target, ns).await?);
            }
        }
        if reads.deletes {
            seen.deleting = Seen::Read(deleting(source, target, ns, self.out).await?);
        }
        if reads.source_window {
            let w = read_window(source, &self.opts.window).await?;
            seen.source_open = Seen::Read(w.is_some_and(|w| w.spec.state == WindowState::Open));
        }
        if reads.version {
            let said = crate::window::child::version(&self.opts.clusterctl)
                .await
                .map_err(|e| self.refused(MoveRole::Source, e.to_string()))?;
            seen.version = Seen::Read(said);
        }
        Ok(seen)
    }
}

impl Performer<MovePlanner> for Mover<'_> {
    type Error = WindowError;

    /// The target's record, then what `move_next::reads` asks for given it.
    async fn read(&mut self, p: &MovePlanner, reached: &Reached) -> Result<Read> {
        let record = match move_next::reads_record(reached) {
            true => Seen::Read(read_record(self.target, &self.opts.window).await?),
            false => Seen::NotRead,
        };
        let known = match &record {
            Seen::Read(r) => r.as_ref(),
            Seen::NotRead => None,
        };
        let reads = move_next::reads(&p.asked, known, reached);
        let seen = self.observe(&reads, known).await?;
        Ok(Read {
            record,
            reads,
            seen,
        })
    }

    async fn perform(&mut self, step: &Step, read: &Read) -> Result<Found> {
        let Read {
            record,
            reads,
            seen,
        } = read;
        let record = match record {
            Seen::Read(r) => r.as_ref(),
            // While clusterctl runs: no step there acts on it.
            Seen::NotRead => None,
        };
        Mover::perform(self, step, record, seen, &reads.namespace).await
    }

    fn progress(&mut self) -> &mut Progress {
        self.out
    }

    fn started(&mut self) -> Option<Child> {
        self.clusterctl.take()
    }
}

/// Run the whole move, or resume it, or abort it: read, ask `move_next::next`, perform the
/// one step, and again, until it says done.
pub async fn run(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    out: &mut Progress,
) -> Result<()> {
    if opts.flags.dry_run {
        return dry_run(source, target, opts, out).await;
    }
    let asked = Asked {
        window: opts.window.clone(),
        namespace: opts.flags.namespace.clone(),
        abort: opts.abort,
    };
    let reason = |role: &str| {
        let mut o = opts.open.clone();
        o.reason.get_or_insert_with(|| {
            format!("handoff move of namespace {}: {role}", asked.namespace)
        });
        o
    };
    let mut m = Mover {
        source,
        target,
        opts,
        source_opts: reason("source"),
        target_opts: reason("target"),
        clusterctl: None,
        clusterctl_pid: None,
        clusterctl_started: None,
        pauses: None,
        waited: Default::default(),
        taken: Vec::new(),
        restored: Vec::new(),
        started: Instant::now(),
        out,
    };
    runner::run(
        &MovePlanner { asked },
        &mut m,
        Publish::Top(&opts.step_label),
    )
    .await
    .map(|_| ())
}
