//! `handoff`: serve the webhooks, decide one review offline, make certificates.

use std::io::Read as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};

use handoff::config::ConfigFile;
use handoff::rules::move_window::OwnDeployment;
use handoff::server::metrics::Metrics;
use handoff::server::tls::{CertSource, CertStore};
use handoff::server::{self, App, Limits};
use handoff::state::State;
use handoff::webhook::{self, Webhook};
use handoff::{admission, certs};

mod cli;
use cli::*;

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = parse_cli();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(a) => serve(a).await,
            Command::Review(a) => review(a).await,
            Command::Certs(a) => certs_cmd(a),
            Command::Window(a) => window(a).await,
            Command::Policy(a) => policy(a).await,
            Command::Move(a) => move_cmd(a).await,
            Command::Crd => {
                print!("{}", handoff::resources::move_window::crd_yaml());
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A failed clusterctl: its own error is above; handoff says what is left and exits
        // with clusterctl's code.
        Err(e) => match e.downcast_ref::<handoff::window::WindowError>() {
            Some(handoff::window::WindowError::Clusterctl { code, help }) => {
                eprintln!("error: {help}");
                std::process::ExitCode::from(u8::try_from(*code).unwrap_or(1).max(1))
            }
            _ => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

async fn move_cmd(a: MoveArgs) -> anyhow::Result<()> {
    use handoff::resources::move_window::MoveRole;
    use handoff::window::{self, Cluster, move_plan::ClusterctlFlags};
    let (source, source_server, source_ns) =
        client_and_namespace(a.kubeconfig.as_deref(), a.kubeconfig_context.as_deref())
            .await
            .context("--kubeconfig (the source)")?;
    let (target, target_server, _) =
        client_and_namespace(Some(&a.to_kubeconfig), a.to_kubeconfig_context.as_deref())
            .await
            .context("--to-kubeconfig (the target)")?;
    // The proof that a Scale-stopped source controller is stopped is its pods gone: a move
    // never skips it.
    if a.wait_timeout.is_zero() {
        anyhow::bail!(
            "--wait-timeout must be more than 0 for a move: the source's pinned controllers must be proven gone before clusterctl copies"
        );
    }
    let namespace = a.namespace.unwrap_or(source_ns);
    let name = a.window.unwrap_or_else(|| format!("move-{namespace}"));
    let opts = window::MoveOptions {
        window: name.clone(),
        flags: ClusterctlFlags {
            kubeconfig: a.kubeconfig,
            kubeconfig_context: a.kubeconfig_context,
            to_kubeconfig: a.to_kubeconfig,
            to_kubeconfig_context: a.to_kubeconfig_context,
            namespace,
            dry_run: a.dry_run,
        },
        clusterctl: a.clusterctl,
        abort: a.abort,
        open: window::OpenOptions {
            name: name.clone(),
            selector: None,
            reason: None,
            allow_webhook_outage: a.allow_webhook_outage,
            wait_timeout: a.wait_timeout,
            poll: Duration::from_secs(2),
            own: a.own_deployment,
            stop: a.stop.map(Into::into),
        },
        close: window::CloseOptions {
            name,
            restore_timeout: a.restore_timeout,
            poll: Duration::from_millis(500),
            settle: Duration::from_secs(3),
            lead_timeout: a.lead_timeout,
        },
        poll: Duration::from_secs(1),
    };
    let source = Cluster {
        label: "source".into(),
        client: source,
        role: Some(MoveRole::Source),
    };
    let target = Cluster {
        label: "target".into(),
        client: target,
        role: Some(MoveRole::Target),
    };
    let mut err = std::io::stderr();
    window::move_run(&source, &target, &opts, &mut err)
        .await
        .map_err(|e| {
            let server = match &e {
                window::WindowError::Api { cluster, .. } if cluster == "source" => {
                    Some(format!("API server {source_server} (source)"))
                }
                window::WindowError::Api { cluster, .. } if cluster == "target" => {
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

async fn kube_client(args: &StateArgs) -> anyhow::Result<kube::Client> {
    let (client, _) = client_for(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    Ok(client)
}

/// A client as kubectl would pick its cluster: `--kubeconfig` alone when given, else every
/// file in `$KUBECONFIG` merged (kube's `Kubeconfig::read`: the first file to set an entry or
/// `current-context` wins), else `~/.kube/config`, else in-cluster; `--context` picks the
/// context. Also returns the API server's URL, for error messages.
async fn client_for(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<(kube::Client, String)> {
    let args = KubeArgs {
        kubeconfig: kubeconfig.map(PathBuf::from),
        context: context.map(str::to_string),
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            let opts = kube::config::KubeConfigOptions {
                context: args.context.clone(),
                ..Default::default()
            };
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None if args.context.is_some() => {
            let opts = kube::config::KubeConfigOptions {
                context: args.context.clone(),
                ..Default::default()
            };
            kube::Config::from_kubeconfig(&opts)
                .await
                .context("--context")?
        }
        None => kube::Config::infer()
            .await
            .context("no cluster found (not in a cluster, no kubeconfig); pass --kubeconfig")?,
    };
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
    Ok((client, server))
}

/// `client_for`, and the context's namespace (`default` when it names none), which is the
/// namespace clusterctl moves when it is given none.
async fn client_and_namespace(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<(kube::Client, String, String)> {
    let (client, server) = client_for(kubeconfig, context).await?;
    let ns = client.default_namespace().to_string();
    Ok((client, server, ns))
}

/// Build the state and, for a cluster, the client whose watches must be started.
struct KubeArgs {
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
}

async fn window(a: WindowArgs) -> anyhow::Result<()> {
    use handoff::resources::move_window::MoveRole;
    use handoff::window::{Cluster, WindowError};
    let mut servers = Vec::new();
    let mut connect = async |label: &str,
                             kubeconfig: Option<&std::path::Path>,
                             context: Option<&str>,
                             role: Option<MoveRole>|
           -> anyhow::Result<Cluster> {
        let (client, server) = client_for(kubeconfig, context).await?;
        servers.push((label.to_string(), server));
        Ok(Cluster {
            label: label.into(),
            client,
            role,
        })
    };
    let clusters = match (&a.source, &a.target) {
        (Some(s), Some(t)) => vec![
            connect(
                "source",
                Some(s),
                a.source_context.as_deref(),
                Some(MoveRole::Source),
            )
            .await
            .context("--source")?,
            connect(
                "target",
                Some(t),
                a.target_context.as_deref(),
                Some(MoveRole::Target),
            )
            .await
            .context("--target")?,
        ],
        _ => vec![
            connect(
                "cluster",
                a.kubeconfig.as_deref(),
                a.context.as_deref(),
                None,
            )
            .await?,
        ],
    };
    // An API error names the server it could not reach, so that a user with several
    // kubeconfigs sees which one was used.
    let name_server = |e: anyhow::Error| {
        let server = match e.downcast_ref::<WindowError>() {
            Some(WindowError::Api { cluster, .. }) => servers
                .iter()
                .find(|(label, _)| label == cluster)
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

async fn policy(a: PolicyArgs) -> anyhow::Result<()> {
    use handoff::admission_policy::apply;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = match &a.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let ids = cfg
        .identities()
        .map_err(|e| anyhow::anyhow!("config: {e}"))?;
    let (client, server) = client_for(a.kubeconfig.as_deref(), a.context.as_deref()).await?;
    let inst = apply::Install {
        ids,
        rollout: cfg.rollout(),
        params: a.params.clone(),
        own: a.own_deployment,
    };
    let mut err = std::io::stderr();
    let run = async {
        match a.command {
            PolicyCommand::Install => apply::install(&client, &inst, &mut err).await,
            PolicyCommand::Uninstall => apply::uninstall(&client, &a.params, &mut err).await,
            PolicyCommand::Show => {
                let (objects, notes) = apply::plan(&client, &inst).await?;
                for n in notes {
                    eprintln!("note: {n}");
                }
                print!("{}", apply::render_yaml(&objects)?);
                Ok(())
            }
        }
    };
    run.await.with_context(|| format!("API server {server}"))
}

async fn window_command(
    command: WindowCommand,
    clusters: Vec<handoff::window::Cluster>,
    own_deployment: OwnDeployment,
) -> anyhow::Result<()> {
    use handoff::window as ops;
    let mut out = std::io::stderr();
    match command {
        WindowCommand::Open {
            name,
            selector,
            reason,
            allow_webhook_outage,
            dry_run,
            wait_timeout,
            stop,
        } => {
            let opts = ops::OpenOptions {
                name,
                selector,
                reason,
                allow_webhook_outage,
                wait_timeout,
                poll: Duration::from_secs(2),
                own: own_deployment,
                stop: stop.map(Into::into),
            };
            if dry_run {
                ops::plan_open(&clusters, &opts, &mut std::io::stdout()).await?;
            } else {
                ops::open(&clusters, &opts, &mut out).await?;
            }
        }
        WindowCommand::Close {
            name,
            restore_timeout,
            lead_timeout,
        } => {
            let ordered = ops::plan::close_order(clusters, |c| c.role);
            let opts = ops::CloseOptions {
                name,
                restore_timeout,
                poll: Duration::from_millis(500),
                settle: Duration::from_secs(3),
                lead_timeout,
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

async fn build_state(args: &StateArgs) -> anyhow::Result<(State, Option<kube::Client>)> {
    let cfg = match &args.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let mut ids = cfg
        .identities()
        .map_err(|e| anyhow::anyhow!("config: {e}"))?;
    let kcp = match &args.kcp_kubeconfig {
        None => None,
        Some(path) => {
            ids.set_reads_kcp(true);
            let kcp = handoff::state::kcp::Kcp::from_kubeconfig(
                path,
                ids.clone(),
                args.max_staleness,
                args.api_timeout,
            )
            .await
            .map_err(|e| anyhow::anyhow!("--kcp-kubeconfig {}: {e}", path.display()))?;
            tracing::info!(kcp = %kcp.server, "reading sync finalizers in kcp too");
            Some(Arc::new(kcp))
        }
    };
    let unseen = cfg.usernames_the_webhook_never_sees();
    if !unseen.is_empty() {
        tracing::warn!(
            usernames = ?unseen,
            add = %handoff::config::match_condition_addition(&unseen),
            "config: these sync-target usernames are not kcp-syncer ServiceAccounts, so the manifests' matchCondition kcp-syncers-only never sends their deletes to handoff and their holds are not enforced; append the expression in `add` to that matchCondition"
        );
    }
    if let Some(dir) = &args.state {
        let mut state =
            State::from_dir(dir, ids).with_context(|| format!("--state {}", dir.display()))?;
        state.set_rollout(cfg.rollout());
        state.api_timeout = args.api_timeout;
        state.own = args.own_deployment.clone();
        state.kcp = kcp;
        return Ok((state, None));
    }
    let client = kube_client(args)
        .await
        .context("state comes from a cluster unless --state DIR is given")?;
    let mut state = State::new(ids);
    state.set_rollout(cfg.rollout());
    state.api_timeout = args.api_timeout;
    state.stale_after = args.stale_after;
    state.max_staleness = args.max_staleness;
    state.own = args.own_deployment.clone();
    state.client = Some(client.clone());
    if let Some(k) = &kcp {
        state.telemetry = k.telemetry.clone();
    }
    state.kcp = kcp;
    Ok((state, Some(client)))
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    // Any start-up error below stops the process before the port opens.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let source = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => CertSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => {
            let generated = certs::generate(
                &["localhost".to_string()],
                &[
                    IpAddr::from([127, 0, 0, 1]),
                    IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
                ],
                30,
            )
            .context("cannot generate a serving certificate")?;
            tracing::warn!(
                "no --tls-cert given: serving a generated certificate for localhost, 127.0.0.1 and ::1 (curl -k, or trust the CA below)"
            );
            tracing::info!(ca_bundle = %generated.ca_bundle(), "generated CA");
            CertSource::Generated {
                cert_pem: generated.cert_pem,
                key_pem: generated.key_pem,
            }
        }
    };
    let store = Arc::new(CertStore::load(source)?);
    let tls = server::tls::server_config(store.clone(), a.client_ca.as_deref())?;
    let (mut state, client) = build_state(&a.state).await?;
    state.serving = handoff::state::Serving {
        guard: a.webhooks.contains(&Webhook::SyncFinalizer),
        pin: a.webhooks.contains(&Webhook::MoveWindow),
    };
    let state = Arc::new(state);
    let mut metrics = Metrics::new();
    metrics.register_telemetry(&state.telemetry);
    let metrics = Arc::new(metrics);
    let limits = Limits {
        body_limit: a.body_limit,
        default_timeout: a.default_timeout,
        max_concurrency: a.max_concurrency as usize,
        queue_timeout: a.queue_timeout,
    };
    let app = App::new(state.clone(), metrics.clone(), limits);
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("--listen {}", a.listen))?;
    let plain = match a.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics-listen {addr}"))?,
        ),
        None => None,
    };
    if let Some(kcp) = state.kcp.clone().filter(|_| state.serving.guard) {
        tokio::spawn(kcp.clone().watch());
        if let Some(client) = &client {
            tokio::spawn(handoff::state::kcp::mirror(
                state.clone(),
                kcp,
                client.clone(),
                KCP_MIRROR_EVERY,
            ));
        }
    }
    if let Some(client) = client {
        if state.serving.guard {
            tokio::spawn(handoff::admission_policy::apply::keep_published(
                client.clone(),
                state.clone(),
                a.policy_params.clone(),
                a.policy_publish_interval,
            ));
        }
        handoff::state::cluster::spawn_watches(client, state.clone());
    }
    tokio::spawn(store.clone().watch(a.cert_reload_interval, metrics.clone()));
    metrics.set_rollout(&state.rollout());
    if let Some(path) = a.state.config.clone() {
        tokio::spawn(watch_config(path, state.clone(), metrics.clone()));
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(l) = plain {
        let mut rx = stop_rx.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            if let Err(e) = server::run_plain(l, app, stop).await {
                tracing::error!(error = %e, "metrics listener failed");
            }
        });
    }
    tracing::info!(
        version = VERSION,
        listen = %a.listen,
        metrics_listen = ?a.metrics_listen,
        state = ?a.state.state,
        webhooks = ?a.webhooks.iter().map(|w| w.as_str()).collect::<Vec<_>>(),
        namespaces = state.namespaces.len(),
        "handoff serving"
    );
    let health = app.health.clone();
    let drain_delay = a.drain_delay;
    let shutdown = async move {
        wait_for_signal().await;
        // Fail readiness first, so the endpoint is removed while we still answer.
        health.start_drain();
        tracing::info!(
            ?drain_delay,
            "SIGTERM: readiness now fails; closing the listener after the drain delay"
        );
        tokio::time::sleep(drain_delay).await;
        let _ = stop_tx.send(true);
    };
    let service = server::router(app.clone());
    let health = app.health.clone();
    server::run(
        listener,
        Arc::new(tls),
        service,
        health,
        shutdown,
        a.drain_timeout,
    )
    .await;
    tracing::info!("handoff stopped");
    Ok(())
}

/// How often the kcp mirror compares each located namespace with its kcp namespace.
const KCP_MIRROR_EVERY: Duration = Duration::from_secs(2);

/// Re-read the config file whenever its bytes change (a mounted ConfigMap is swapped by the
/// kubelet like a Secret): the enforcement modes and exemptions take effect at once; a file
/// that does not parse is refused and the settings in force stay. Identities, domains and key
/// schemes are read at start-up only.
async fn watch_config(path: PathBuf, state: Arc<State>, metrics: Arc<Metrics>) {
    let mut applied = std::fs::read(&path).ok();
    // A change is taken only once two reads a second apart agree, and what is parsed is the
    // bytes read: a file caught halfway through a rewrite is never applied.
    let mut seen: Option<Vec<u8>> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                if applied.is_some() {
                    tracing::error!(config = %path.display(), error = %e, "config file unreadable; the settings in force stay");
                    metrics.config_reload_errors.inc();
                    applied = None;
                }
                continue;
            }
        };
        if applied.as_deref() == Some(&now[..]) {
            seen = None;
            continue;
        }
        if seen.as_deref() != Some(&now[..]) {
            seen = Some(now);
            continue;
        }
        applied = seen.take();
        let parsed = std::str::from_utf8(&now)
            .map_err(|e| e.to_string())
            .and_then(ConfigFile::parse);
        match parsed {
            Err(e) => {
                tracing::error!(config = %path.display(), error = %e, "config change refused; the settings in force stay");
                metrics.config_reload_errors.inc();
            }
            Ok(cfg) => {
                let rollout = cfg.rollout();
                tracing::info!(
                    config = %path.display(),
                    sync_finalizer = %rollout.sync_finalizer,
                    move_window = %rollout.move_window,
                    exemptions = rollout.exemptions.len(),
                    "config reloaded: enforcement modes and exemptions in force (identities, domains and key schemes change only on restart)"
                );
                metrics.set_rollout(&rollout);
                metrics.config_reloads.inc();
                state.set_rollout(rollout);
            }
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops handoff");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn review(a: ReviewArgs) -> anyhow::Result<()> {
    let mut body = Vec::new();
    match a.file.as_deref() {
        None => std::io::stdin()
            .read_to_end(&mut body)
            .context("reading stdin")?,
        Some(p) if p.as_os_str() == "-" => std::io::stdin()
            .read_to_end(&mut body)
            .context("reading stdin")?,
        Some(p) => {
            body = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            body.len()
        }
    };
    let req = admission::decode_review(&body)?;
    let (state, client) = build_state(&a.state).await?;
    if let Some(client) = client {
        // What the server's watch would hold: without it the pin would decide as a replica
        // that has not read the MoveWindows yet. Namespaces and a Scale's parent are read on
        // demand, as the server reads a cache miss.
        let api = kube::Api::<handoff::resources::move_window::MoveWindow>::all(client);
        match api.list(&Default::default()).await {
            Ok(list) => state.windows.replace_all(&list.items),
            Err(e) => eprintln!(
                "warning: cannot list MoveWindows ({e}); deciding as a server that has not read them yet"
            ),
        }
    }
    let Some(hook) = a.webhook.or_else(|| Webhook::for_request(&req)) else {
        bail!(
            "no handoff webhook is registered for {} of {}; pass --webhook to force one",
            req.operation.as_str(),
            req.resource_path()
        );
    };
    let decision = webhook::decide(&state, hook, &req).await;
    let out = admission::encode_review(&decision.response);
    let v: serde_json::Value = serde_json::from_slice(&out)?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

fn certs_cmd(a: CertsArgs) -> anyhow::Result<()> {
    let generated = certs::generate(&a.dns, &a.ip, a.days).context("generating certificates")?;
    certs::write_dir(&a.out, &generated).with_context(|| format!("--out {}", a.out.display()))?;
    eprintln!(
        "wrote {0}/ca.crt, {0}/ca.key, {0}/tls.crt, {0}/tls.key for DNS {1:?} and IPs {2:?}, valid {3} days",
        a.out.display(),
        a.dns,
        a.ip,
        a.days
    );
    eprintln!("caBundle for the webhook configurations:");
    println!("{}", generated.ca_bundle());
    Ok(())
}
