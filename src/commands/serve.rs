//! `handoff serve`: the flags become `server::Options`, and `server::Server` runs until
//! SIGTERM or Ctrl-C.

use std::net::IpAddr;
use std::sync::Arc;

use anyhow::Context as _;

use crate::cli::{ServeArgs, VERSION};
use handoff::certs;
use handoff::server::tls::CertSource;
use handoff::server::{self, Limits, Server, ServingTls};
use handoff::webhook::Webhook;

pub async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    // Any start-up error below stops the process before the port opens; the certificate is
    // checked first.
    let tls = ServingTls::load(certificate(&a)?, a.client_ca.as_deref())?;
    let (mut state, client) = super::build_state(&a.state).await?;
    state.serving = handoff::state::Serving {
        guard: a.webhooks.contains(&Webhook::SyncFinalizer),
        pin: a.webhooks.contains(&Webhook::MoveWindow),
    };
    let opts = server::Options {
        listen: a.listen,
        metrics_listen: a.metrics_listen,
        tls,
        cert_reload_interval: a.cert_reload_interval,
        limits: Limits {
            body_limit: a.body_limit,
            default_timeout: a.default_timeout,
            max_concurrency: a.max_concurrency as usize,
            queue_timeout: a.queue_timeout,
            ..Limits::default()
        },
        drain_delay: a.drain_delay,
        drain_timeout: a.drain_timeout,
        config_file: a.state.config.clone(),
        policy_params: a.policy_params,
        policy_publish_interval: a.policy_publish_interval,
        extra_routes: None,
    };
    let server = Server::bind(Arc::new(state), client, opts).await?;
    tracing::info!(
        version = VERSION,
        listen = %a.listen,
        metrics_listen = ?a.metrics_listen,
        state = ?a.state.state,
        webhooks = ?a.webhooks.iter().map(|w| w.as_str()).collect::<Vec<_>>(),
        namespaces = server.app().state.namespaces.len(),
        "handoff serving"
    );
    server.run(wait_for_signal()).await;
    tracing::info!("handoff stopped");
    Ok(())
}

/// `--tls-cert`/`--tls-key`, or a certificate generated for this machine's loopback names.
fn certificate(a: &ServeArgs) -> anyhow::Result<CertSource> {
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        return Ok(CertSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        });
    }
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
    Ok(CertSource::Generated {
        cert_pem: generated.cert_pem,
        key_pem: generated.key_pem,
    })
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
