//! `handoff`: serve the webhooks, open and close move windows, wrap `clusterctl move`, render
//! the admission policies, decide one review offline, make certificates. Each subcommand is in
//! `commands/`; its flags are in `cli.rs`.

mod cli;
mod commands;
#[cfg(test)]
mod reference;

use cli::{Command, LogFormat, parse_cli};
use commands::{policy, review, serve, window};

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
    // Every command that talks TLS (serve, and the kube clients) uses ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
            Command::Serve(a) => serve::serve(a).await,
            Command::Review(a) => review::review(a).await,
            Command::Certs(a) => review::certs_cmd(a),
            Command::Window(a) => window::window(a).await,
            Command::Policy(a) => policy::policy(a).await,
            Command::Move(a) => window::move_cmd(a).await,
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
                eprintln!("error: {}", one_message(&e));
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// The error and its causes on one line, each said once. Most of the library's errors name
/// their cause in their own message and also keep it as `source()` for callers that branch
/// on it; anyhow's `{:#}` would print such a cause twice.
fn one_message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
