//! The offline commands: `handoff review` decides one AdmissionReview as the server would,
//! `handoff certs` writes a CA and a serving certificate.

use std::io::Read as _;

use anyhow::{Context as _, bail};

use crate::cli::{CertsArgs, ReviewArgs};
use handoff::webhook::{self, Webhook};
use handoff::{admission, certs};

pub async fn review(a: ReviewArgs) -> anyhow::Result<()> {
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
    let (state, client) = super::build_state(&a.state).await?;
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

pub fn certs_cmd(a: CertsArgs) -> anyhow::Result<()> {
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
