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

/// What handoff answers an allowed review with, for a recorded uid: same shape, same size.
const ANSWER: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"6e85bb16-2464-4ebb-a694-e67c44bacb81","allowed":true}}"#;

async fn constant(body: Body) -> impl IntoResponse {
    // Drain, do not parse: an HTTP/1.1 connection is reused only once its request body has
    // been read, and hyper reads it either way.
    let _ = axum::body::to_bytes(body, 8 * 1024 * 1024).await;
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        ANSWER,
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
        shutdown,
        Duration::from_secs(1),
    )
    .await;
    Ok(())
}
