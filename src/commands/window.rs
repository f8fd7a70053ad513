//! `handoff window` and `handoff move`: the flags become the window's options, and an API
//! error names the API server it could not reach.

use anyhow::Context as _;

use crate::cli::{MoveArgs, Output, WindowArgs, WindowCommand};
use handoff::rules::move_window::OwnDeployment;

use super::{client_and_namespace, client_for};

pub async fn window(a: WindowArgs) -> anyhow::Result<()> {
    use handoff::resources::move_window::MoveRole;
    use handoff::window::{Cluster, WindowError};
    let mut servers = Vec::new();
    let mut connect = async |kubeconfig: Option<&std::path::Path>,
                             context: Option<&str>,
                             role: Option<MoveRole>|
           -> anyhow::Result<Cluster> {
        let (client, server) = client_for(kubeconfig, context).await?;
        let c = Cluster::new(client, role);
        servers.push((c.label, server));
        Ok(c)
    };
    let clusters = match (&a.source, &a.target) {
        (Some(s), Some(t)) => vec![
            connect(Some(s), a.source_context.as_deref(), Some(MoveRole::Source))
                .await
                .context("--source")?,
            connect(Some(t), a.target_context.as_deref(), Some(MoveRole::Target))
                .await
                .context("--target")?,
        ],
        _ => vec![connect(a.kubeconfig.as_deref(), a.context.as_deref(), None).await?],
    };
    // An API error names the server it could not reach, so that a user with several
    // kubeconfigs sees which one was used.
    let name_server = |e: anyhow::Error| {
        let server = match e.downcast_ref::<WindowError>() {
            Some(WindowError::Api { cluster, .. }) => servers
                .iter()
                .find(|(label, _)| cluster.only(*label))
                .map(|(label, url)| format!("API server {url} ({label})")),
            _ => None,
        };
        match server {
            Some(s) => e.context(s),
            None => e,
        }
    };
    window_command(a.command, clusters, a.own_deployment)
        .await
        .map_err(name_server)
}

async fn window_command(
    command: WindowCommand,
    clusters: Vec<handoff::window::Cluster>,
    own_deployment: OwnDeployment,
) -> anyhow::Result<()> {
    use handoff::window as ops;
    match command {
        WindowCommand::Open {
            name,
            selector,
            reason,
            allow_webhook_outage,
            no_standby,
            dry_run,
            wait_timeout,
            stop,
            progress,
        } => {
            let opts = ops::OpenOptions {
                name,
                selector,
                reason,
                allow_webhook_outage,
                wait_timeout,
                poll: handoff::window::OPEN_POLL,
                own: own_deployment,
                stop: stop.map(Into::into),
                standby: !no_standby,
                quiet_preflight: false,
            };
            // The dry run's plan is the command's output: standard output, as text too.
            let mut out = progress.reporter(dry_run);
            if dry_run {
                ops::plan_open(&clusters, &opts, &mut out).await?;
            } else {
                ops::open(&clusters, &opts, &mut out).await?;
            }
        }
        WindowCommand::Close {
            name,
            restore_timeout,
            lead_timeout,
            progress,
        } => {
            let mut out = progress.reporter(false);
            let ordered = ops::plan::stop::close_order(clusters, |c| c.role);
            let opts = ops::CloseOptions {
                name,
                restore_timeout,
                poll: handoff::window::CLOSE_POLL,
                settle: handoff::window::CLOSE_SETTLE,
                lead_timeout,
                wait_leading: true,
                uninstall: true,
            };
            ops::close(&ordered, &opts, &mut out).await?;
        }
        WindowCommand::Status { name, output } => {
            let views = ops::status(&clusters, name.as_deref(), &own_deployment).await?;
            match output {
                Output::Table => print!("{}", ops::render_table(&views)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
            }
        }
    }
    Ok(())
}

pub async fn move_cmd(a: MoveArgs) -> anyhow::Result<()> {
    use handoff::resources::move_window::MoveRole;
    use handoff::window::{self, Cluster, plan::move_plan::ClusterctlFlags};
    if a.to_directory.is_some() || a.from_directory.is_some() {
        return directory_cmd(a).await;
    }
    let to_kubeconfig = a
        .to_kubeconfig
        .clone()
        .context("--to-kubeconfig is required (or --to-directory for a backup)")?;
    // Both clusters' requests name the step performed (the audit log's and the crash suite's).
    let label = handoff::window::user_agent::StepLabel::default();
    let (source, source_server, source_ns) = client_and_namespace(
        a.kubeconfig.as_deref(),
        a.kubeconfig_context.as_deref(),
        &label,
    )
    .await
    .context("--kubeconfig (the source)")?;
    let (target, target_server, _) = client_and_namespace(
        Some(&to_kubeconfig),
        a.to_kubeconfig_context.as_deref(),
        &label,
    )
    .await
    .context("--to-kubeconfig (the target)")?;
    // The proof that a Scale-stopped source controller is stopped is its pods gone: a move
    // never skips it.
    if a.wait_timeout.is_zero() {
        anyhow::bail!(
            "--wait-timeout must be more than 0 for a move: the source's pinned controllers must be proven gone before clusterctl copies"
        );
    }
    let namespace = a.namespace.clone().unwrap_or(source_ns);
    let name = a.window.clone().unwrap_or_else(|| match a.all_namespaces {
        true => "move-all-namespaces".to_string(),
        false => format!("move-{namespace}"),
    });
    let window_options = window_options(&a, name.clone(), None);
    let opts = window::MoveOptions {
        window: name.clone(),
        flags: ClusterctlFlags {
            kubeconfig: a.kubeconfig,
            kubeconfig_context: a.kubeconfig_context,
            to_kubeconfig,
            to_kubeconfig_context: a.to_kubeconfig_context,
            namespace,
            dry_run: a.dry_run,
        },
        clusterctl: a.clusterctl,
        abort: a.abort,
        open: window_options.0,
        close: window_options.1,
        poll: handoff::window::MOVE_POLL,
        step_label: label.clone(),
    };
    let source = Cluster::new(source, Some(MoveRole::Source));
    let target = Cluster::new(target, Some(MoveRole::Target));
    let mut out = a.progress.reporter(false);
    let run = match a.all_namespaces {
        true => window::whole_run(&source, &target, &opts, &mut out).await,
        false => window::move_run(&source, &target, &opts, &mut out).await,
    };
    run.map_err(|e| {
        let server = match &e {
            window::WindowError::Api { cluster, .. } if cluster.only(window::Label::Source) => {
                Some(format!("API server {source_server} (source)"))
            }
            window::WindowError::Api { cluster, .. } if cluster.only(window::Label::Target) => {
                Some(format!("API server {target_server} (target)"))
            }
            _ => None,
        };
        let e = anyhow::Error::new(e);
        match server {
            Some(s) => e.context(s),
            None => e,
        }
    })
}

/// `handoff move --to-directory` (a backup of the `--kubeconfig` cluster) or
/// `--from-directory` (a restore into the `--to-kubeconfig` cluster): one cluster, one window.
async fn directory_cmd(a: MoveArgs) -> anyhow::Result<()> {
    use handoff::resources::move_window::MoveRole;
    use handoff::window::plan::directory_plan::{Direction, DirectoryFlags};
    use handoff::window::{self, Cluster};
    // clusterctl's own checks, said before any cluster is reached.
    for (flag, dir) in [
        ("--to-directory", &a.to_directory),
        ("--from-directory", &a.from_directory),
    ] {
        if let Some(d) = dir.as_ref().filter(|d| !d.is_dir()) {
            anyhow::bail!(
                "{flag} {}: no such folder (clusterctl reads and writes a folder that exists)",
                d.display()
            );
        }
    }
    if a.wait_timeout.is_zero() {
        anyhow::bail!(
            "--wait-timeout must be more than 0: the stopped controllers must be proven stopped before clusterctl runs"
        );
    }
    let label = handoff::window::user_agent::StepLabel::default();
    let (kubeconfig, context, role, flag) = match &a.to_directory {
        Some(_) => (
            a.kubeconfig.clone(),
            a.kubeconfig_context.clone(),
            MoveRole::Source,
            "--kubeconfig (the cluster backed up)",
        ),
        None => (
            a.to_kubeconfig.clone(),
            a.to_kubeconfig_context.clone(),
            MoveRole::Target,
            "--to-kubeconfig (the cluster restored into)",
        ),
    };
    let (client, server, context_ns) =
        client_and_namespace(kubeconfig.as_deref(), context.as_deref(), &label)
            .await
            .context(flag)?;
    let c = Cluster::new(client, Some(role));
    let (direction, directory, default_window) = match (
        a.to_directory.clone(),
        a.from_directory.clone(),
    ) {
        (Some(d), _) if a.all_namespaces => {
            let namespaces = window::whole_namespaces(&c)
                .await
                .with_context(|| format!("API server {server}"))?;
            if namespaces.is_empty() {
                anyhow::bail!(
                    "--all-namespaces: no namespace of the cluster holds a Cluster, a ClusterClass or an object of a kind clusterctl moves: nothing to back up"
                );
            }
            let w = "backup-all-namespaces".to_string();
            (Direction::Backup { namespaces }, d, w)
        }
        (Some(d), _) => {
            let namespace = a.namespace.clone().unwrap_or(context_ns);
            let w = format!("backup-{namespace}");
            let namespaces = vec![namespace];
            (Direction::Backup { namespaces }, d, w)
        }
        (None, Some(d)) => {
            let namespaces = match a.all_namespaces {
                true => namespace_folders(&d)?,
                false => Vec::new(),
            };
            (Direction::Restore { namespaces }, d, "restore".to_string())
        }
        (None, None) => unreachable!("directory_cmd runs for a directory"),
    };
    let name = a.window.clone().unwrap_or(default_window);
    let what = match (&direction, a.all_namespaces) {
        (Direction::Backup { namespaces }, _) => {
            format!(
                "handoff move --to-directory of namespace{} {}",
                if namespaces.len() == 1 { "" } else { "s" },
                namespaces.join(", ")
            )
        }
        (Direction::Restore { .. }, whole) => format!(
            "handoff move --from-directory {}{}",
            directory.display(),
            if whole { " --all-namespaces" } else { "" }
        ),
    };
    let window_options = window_options(&a, name.clone(), Some(what));
    let opts = window::DirectoryOptions {
        window: name.clone(),
        flags: DirectoryFlags {
            direction,
            directory,
            kubeconfig,
            context,
            whole: a.all_namespaces,
        },
        clusterctl: a.clusterctl,
        abort: a.abort,
        open: window_options.0,
        close: window_options.1,
        poll: handoff::window::MOVE_POLL,
        step_label: label.clone(),
    };
    let mut out = a.progress.reporter(false);
    window::directory_run(&c, &opts, &mut out)
        .await
        .map_err(|e| {
            let api = matches!(e, window::WindowError::Api { .. });
            let e = anyhow::Error::new(e);
            match api {
                true => e.context(format!("API server {server}")),
                false => e,
            }
        })
}

/// `-A --from-directory DIR`: the namespaces whose backups DIR holds, a folder each (as
/// `-A --to-directory` writes them), by name.
fn namespace_folders(dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let mut namespaces = Vec::new();
    for entry in
        std::fs::read_dir(dir).with_context(|| format!("--from-directory {}", dir.display()))?
    {
        let entry = entry.with_context(|| format!("--from-directory {}", dir.display()))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            namespaces.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    namespaces.sort();
    if namespaces.is_empty() {
        anyhow::bail!(
            "--from-directory {} --all-namespaces: the folder holds no folder of a namespace (`handoff move -A --to-directory` writes one per namespace); without -A it restores the folder itself",
            dir.display()
        );
    }
    Ok(namespaces)
}

/// How a move's (or a backup's, or a restore's) window is opened and closed, from its flags.
fn window_options(
    a: &MoveArgs,
    name: String,
    reason: Option<String>,
) -> (handoff::window::OpenOptions, handoff::window::CloseOptions) {
    use handoff::window::{CLOSE_POLL, CLOSE_SETTLE, CloseOptions, OPEN_POLL, OpenOptions};
    let open = OpenOptions {
        name: name.clone(),
        selector: None,
        reason,
        allow_webhook_outage: a.allow_webhook_outage,
        wait_timeout: a.wait_timeout,
        poll: OPEN_POLL,
        own: a.own_deployment.clone(),
        stop: a.stop.map(Into::into),
        standby: !a.no_standby,
        quiet_preflight: false,
    };
    let close = CloseOptions {
        name,
        restore_timeout: a.restore_timeout,
        poll: CLOSE_POLL,
        settle: CLOSE_SETTLE,
        lead_timeout: a.lead_timeout,
        wait_leading: true,
        uninstall: false,
    };
    (open, close)
}

impl crate::cli::ProgressArgs {
    /// Where progress goes: JSON on standard output; text on standard error, or on standard
    /// output where it is the command's result (a dry run's plan).
    fn reporter(&self, text_on_stdout: bool) -> handoff::window::progress::Progress {
        use handoff::window::progress::{Format, Progress};
        let (out, format): (Box<dyn std::io::Write>, _) = match self.output {
            crate::cli::ProgressOutput::Json => (Box::new(std::io::stdout()), Format::Json),
            crate::cli::ProgressOutput::Text if text_on_stdout => {
                (Box::new(std::io::stdout()), Format::Text)
            }
            crate::cli::ProgressOutput::Text => (Box::new(std::io::stderr()), Format::Text),
        };
        Progress::new(out, format, self.verbose)
    }
}
