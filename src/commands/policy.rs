//! `handoff policy`: render, install or remove the admission policies.

use anyhow::Context as _;

use crate::cli::{PolicyArgs, PolicyCommand};
use handoff::config::ConfigFile;

use super::client_for;

pub async fn policy(a: PolicyArgs) -> anyhow::Result<()> {
    use handoff::admission_policy::apply;
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
