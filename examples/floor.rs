//! The load test's floor: the same TLS listener, accept loop, rustls configuration, hyper
//! connection builder and axum router type as `handoff serve` (it calls
//! `handoff::server::run`), answering every POST with one constant AdmissionReview. It reads
//! the request body only as hyper must to keep the connection alive, and parses nothing, so
//! handoff's distance from it is the cost of deciding: decode, state lookup, decision,
//! encode, logging and metrics.
//!
//! `cargo run --release --example floor -- --listen 127.0.0.1:9443 --tls-cert C --tls-key K`
//! (without the two files it serves a generated certificate for localhost/127.0.0.1).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use handoff::server::tls::{CertSource, CertStore, server_config};
use handoff::server::{self, Health};

/// What handoff answers an allowed review with: same shape, same size; the uid is the
/// request's (a real API server refuses an answer for another uid).
const ANSWER: (&str, &str) = (
    r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":""#,
    r#"","allowed":true}}"#,
);

async fn constant(body: Body) -> impl IntoResponse {
    // Read, do not parse: the uid is copied from the first `"uid":` of the body (the
    // request's own comes before any object's), which is all a real API server checks.
    let bytes = axum::body::to_bytes(body, 8 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let uid = bytes
        .windows(6)
        .position(|w| w == br#""uid":"#)
        .map(|i| bytes[i + 6..].trim_ascii_start())
        .and_then(|rest| rest.strip_prefix(b"\""))
        .and_then(|rest| rest.iter().position(|b| *b == b'"').map(|end| &rest[..end]))
        .unwrap_or_default();
    let mut answer = Vec::with_capacity(ANSWER.0.len() + uid.len() + ANSWER.1.len());
    answer.extend_from_slice(ANSWER.0.as_bytes());
    answer.extend_from_slice(uid);
    answer.extend_from_slice(ANSWER.1.as_bytes());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        answer,
    )
}

fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = arg(&args, "--listen")
        .unwrap_or_else(|| "127.0.0.1:9443".into())
        .parse()?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let source = match (arg(&args, "--tls-cert"), arg(&args, "--tls-key")) {
        (Some(cert), Some(key)) => CertSource::Files {
            cert: PathBuf::from(cert),
            key: PathBuf::from(key),
        },
        _ => {
            let g = handoff::certs::generate(
                &["localhost".to_string()],
                &[std::net::IpAddr::from([127, 0, 0, 1])],
                30,
            )?;
            CertSource::Generated {
                cert_pem: g.cert_pem,
                key_pem: g.key_pem,
            }
        }
    };
    let store = Arc::new(CertStore::load(source)?);
    let tls = server_config(store, None)?;
    let health = Arc::new(Health::default());
    let ready = health.clone();
    let router = Router::new()
        .route("/validate/sync-finalizer", post(constant))
        .route("/mutate/move-window", post(constant))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                if ready.listener_answers.load(Ordering::Acquire) {
                    (StatusCode::OK, "ok\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("floor serving on https://{listen}");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    server::run(
        listener,
        Arc::new(tls),
        router,
        health,
        &server::Limits::default(),
        shutdown,
        Duration::from_secs(1),
    )
    .await;
    Ok(())
}
