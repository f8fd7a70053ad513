//! `window open`'s driver: read each cluster's window, ask `window_next::next_open`, perform
//! the one step, and again. What one step finds that a later one needs (the choices, who takes
//! the Leases, what is stopped) is kept here; the order is the planner's.

use tokio::time::Instant;

use super::choose::Stop;
use super::{
    Choice, Chosen, OpenOptions, Taken, add_standbys, checked, ensure_open, leased_record,
    pin_scaled, prove, take_leases,
};
use crate::resources::move_window::{MoveWindow, MoveWindowStatus, PinnedDeployment};
use crate::window::cluster::lease;
use crate::window::cluster::{Cluster, Result, WindowError, read_windows, record};
use crate::window::plan::stop;
use crate::window::plan::window_next::{OpenPlanner, OpenStep, Seen};
use crate::window::progress::Progress;
use crate::window::runner::{self, Performer, Publish};

/// Open a window on every cluster: choose and preflight all, then create the windows, stop
/// every selected Deployment (Lease or Scale, source first), and wait until each is proven
/// stopped: the former leaders' `leaseDurationSeconds` after the take-over for a Lease, the
/// pods gone for a Scale.
pub async fn open(clusters: &[Cluster], opts: &OpenOptions, out: &mut Progress) -> Result<()> {
    drive(clusters, opts, true, out).await.map(|_| ())
}

/// The first half of `open`: everything but the waits. Each selected Deployment is pinned to
/// 0 or has its Leases taken (after a standby of a single-replica one is Ready); `prove` waits
/// until they are proven stopped. `handoff move` runs other steps in between.
pub async fn take(
    clusters: &[Cluster],
    opts: &OpenOptions,
    out: &mut Progress,
) -> Result<Vec<Taken>> {
    drive(clusters, opts, false, out).await
}

/// One run of `open` or `take`.
struct Opener<'a> {
    clusters: &'a [Cluster],
    opts: &'a OpenOptions,
    /// Each cluster's window as read before the first step.
    windows: Vec<Option<MoveWindow>>,
    /// Each cluster's choices and the webhook Services its Lease-stopped Deployments back.
    chosen: Vec<(Chosen, Vec<String>)>,
    /// Who takes the Leases, where any is taken.
    operators: Vec<Option<String>>,
    /// Whether the pin's policies are bound, and the status as recorded open.
    opened: Vec<(bool, MoveWindowStatus)>,
    taken: Vec<Taken>,
    started: Instant,
}

async fn drive(
    clusters: &[Cluster],
    opts: &OpenOptions,
    proves: bool,
    out: &mut Progress,
) -> Result<Vec<Taken>> {
    let o = Opener {
        clusters,
        opts,
        windows: read_windows(clusters, &opts.name).await?,
        chosen: Vec::new(),
        operators: Vec::new(),
        opened: Vec::new(),
        taken: Vec::new(),
        started: Instant::now(),
    };
    let planner = OpenPlanner {
        prove: proves,
        window: opts.name.clone(),
        seen: o.windows.iter().map(|w| Seen::of(w.as_ref())).collect(),
    };
    let mut x = OpenRun { o, out };
    // A window is opened by hand or inside one of `handoff move`'s steps, whose name its
    // requests keep.
    runner::run(&planner, &mut x, Publish::Nested).await?;
    Ok(x.o.taken)
}

/// An `Opener` with where it says what it does, for the runner.
struct OpenRun<'a, 'o> {
    o: Opener<'a>,
    out: &'o mut Progress,
}

impl Performer<OpenPlanner> for OpenRun<'_, '_> {
    type Error = WindowError;

    async fn read(&mut self, _: &OpenPlanner, _: &Vec<OpenStep>) -> Result<()> {
        Ok(())
    }

    async fn perform(&mut self, step: &OpenStep, _: &()) -> Result<()> {
        let (o, out) = (&mut self.o, &mut *self.out);
        match step {
            OpenStep::Refuse { cluster, why } => Err(WindowError::WindowRefused {
                cluster: o.clusters[*cluster].label.into(),
                why: why.clone(),
            }),
            OpenStep::Check => o.check(out).await,
            OpenStep::Record { cluster, fresh } => o.record(*cluster, *fresh, out).await,
            OpenStep::Stop(i) => o.stop(*i, out).await,
            OpenStep::Prove => prove(&o.taken, out).await,
            OpenStep::Done => Ok(()),
        }
    }

    fn progress(&mut self) -> &mut Progress {
        self.out
    }
}

impl Opener<'_> {
    async fn check(&mut self, out: &mut Progress) -> Result<()> {
        self.chosen = checked(self.clusters, self.opts, out).await?;
        self.operators = operators(self.clusters, &self.chosen, self.opts).await?;
        Ok(())
    }

    async fn record(&mut self, i: usize, fresh: bool, out: &mut Progress) -> Result<()> {
        let c = &self.clusters[i];
        let ((_, _, choices), _) = &self.chosen[i];
        let leased: Vec<PinnedDeployment> = choices.iter().filter_map(leased_record).collect();
        let scaled: Vec<(String, String)> = choices
            .iter()
            .filter(|ch| matches!(ch.plan, Stop::Scale(_)))
            .map(|ch| (ch.namespace.clone(), ch.name.clone()))
            .collect();
        let window = self.windows[i].take();
        let opened = ensure_open(c, self.opts, window, fresh, &leased, &scaled, out).await?;
        if let Some(op) = &self.operators[i] {
            record(c, &self.opts.name, |s| {
                s.operator = Some(op.clone());
            })
            .await?;
        }
        self.opened.push(opened);
        Ok(())
    }

    async fn stop(&mut self, i: usize, out: &mut Progress) -> Result<()> {
        let (c, opts) = (&self.clusters[i], self.opts);
        let ((_, _, choices), services) = &self.chosen[i];
        let (bound, status) = &self.opened[i];
        let mut t = Taken {
            cluster: c.clone(),
            opts: opts.clone(),
            leased: Vec::new(),
            scaled: Vec::new(),
            services: services.clone(),
            started: self.started,
        };
        if choices.is_empty() {
            out.say(format!("{}: no Deployment is selected", c.label));
        }
        t.scaled = pin_scaled(c, opts, choices, *bound, out).await?;
        let leased: Vec<&Choice> = choices
            .iter()
            .filter(|ch| matches!(ch.plan, Stop::Lease(_)))
            .collect();
        if opts.standby {
            add_standbys(c, opts, &leased, status, true, out).await?;
        }
        for ch in leased {
            let op = self.operators[i]
                .as_deref()
                .expect("asked where a Lease is taken");
            let held = take_leases(c, opts, ch, op, out).await?;
            t.leased.push((ch.clone(), held));
        }
        self.taken.push(t);
        Ok(())
    }
}

/// Who holds the Leases, asked once and only where a Lease will be taken; refused where a
/// Lease to take is another window's.
async fn operators(
    clusters: &[Cluster],
    chosen: &[(Chosen, Vec<String>)],
    opts: &OpenOptions,
) -> Result<Vec<Option<String>>> {
    let mut operators = Vec::new();
    for (c, ((_, _, choices), _)) in clusters.iter().zip(chosen) {
        if !choices.iter().any(|ch| matches!(ch.plan, Stop::Lease(_))) {
            operators.push(None);
            continue;
        }
        let me = lease::whoami(c).await?;
        for ch in choices {
            let Stop::Lease(leases) = &ch.plan else {
                continue;
            };
            if let Some(why) = leases
                .iter()
                .find_map(|l| stop::held_for_another(l, &opts.name, &me))
            {
                return Err(WindowError::StopRefused {
                    cluster: c.label.into(),
                    deployment: Some(ch.what()),
                    why: Box::new(why),
                });
            }
        }
        operators.push(Some(me));
    }
    Ok(operators)
}
