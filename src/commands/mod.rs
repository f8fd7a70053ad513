//! The subcommands: each turns its flags (`cli.rs`) into the library's types and runs it.
//! Shared here: how a command finds its cluster, and how `serve` and `review` build the state.

pub mod policy;
pub mod review;
pub mod serve;
pub mod window;

use std::sync::Arc;

use anyhow::Context as _;

use crate::cli::StateArgs;
use handoff::config::ConfigFile;
use handoff::state::State;
use handoff::window::user_agent::StepLabel;

/// A client as kubectl would pick its cluster: `--kubeconfig` alone when given, else every
/// file in `$KUBECONFIG` merged (kube's `Kubeconfig::read`: the first file to set an entry or
/// `current-context` wins), else `~/.kube/config`, else in-cluster; `--context` picks the
/// context. Also returns the API server's URL, for error messages. Its requests say they are
/// handoff's (`User-Agent: handoff/<version>`).
pub async fn client_for(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<(kube::Client, String)> {
    client_with(kubeconfig, context, &StepLabel::default()).await
}

/// `client_for`, its User-Agent naming the step `label` holds when each request is sent.
pub async fn client_with(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
    label: &StepLabel,
) -> anyhow::Result<(kube::Client, String)> {
    let opts = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&opts)
            .await
            .context("--context")?,
        None => kube::Config::infer()
            .await
            .context("no cluster found (not in a cluster, no kubeconfig); pass --kubeconfig")?,
    };
    let server = config.cluster_url.to_string();
    let client = kube::client::ClientBuilder::try_from(config)
        .context("cannot build a Kubernetes client")?
        .with_layer(&label.layer())
        .build();
    Ok((client, server))
}

/// `client_for`, and the context's namespace (`default` when it names none), which is the
/// namespace clusterctl moves when it is given none.
pub async fn client_and_namespace(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
    label: &StepLabel,
) -> anyhow::Result<(kube::Client, String, String)> {
    let (client, server) = client_with(kubeconfig, context, label).await?;
    let ns = client.default_namespace().to_string();
    Ok((client, server, ns))
}

/// The state `serve` and `review` decide on: from `--state DIR`, or from a cluster, with the
/// client whose watches must be started.
pub async fn build_state(args: &StateArgs) -> anyhow::Result<(State, Option<kube::Client>)> {
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
    let (client, _) = client_for(args.kubeconfig.as_deref(), args.context.as_deref())
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
