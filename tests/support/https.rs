//! Start the real server on a loopback port with a certificate made for the test, and talk to
//! it over HTTPS as the API server does: HTTP/1.1 or h2, chosen by ALPN.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use handoff::certs::Ca;
use handoff::server::tls::CertSource;
use handoff::server::{self, App, Limits, Server, ServingTls};
use handoff::state::State;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("HANDOFF_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

pub fn fixture(name: &str) -> Vec<u8> {
    let p = fixtures_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

pub fn fixture_state() -> State {
    State::from_dir(&fixtures_dir().join("state"), Default::default()).expect("fixture state loads")
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub ca: Ca,
    pub app: App,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<()>>,
}

pub struct Options {
    pub limits: Limits,
    pub client_ca: Option<PathBuf>,
    /// Serve certificate files from here instead of an in-memory pair.
    pub cert_files: Option<(PathBuf, PathBuf)>,
    pub drain_timeout: Duration,
    /// Extra routes served behind the same request-path stack (e.g. one that panics).
    pub extra_routes: Option<axum::Router<App>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits::default(),
            client_ca: None,
            cert_files: None,
            drain_timeout: Duration::from_secs(5),
            extra_routes: None,
        }
    }
}

impl TestServer {
    pub async fn start(state: State) -> Self {
        Self::start_with(Arc::new(state), Options::default()).await
    }

    /// `handoff serve` as `main` starts it (`handoff::server::Server`), on a loopback port with a
    /// certificate from the test's own CA, no cluster, and no drain delay: `stop` closes at once.
    pub async fn start_with(state: Arc<State>, opts: Options) -> Self {
        let ca = Ca::new("test CA", 1).unwrap();
        let certificate = match opts.cert_files {
            Some((cert, key)) => CertSource::Files { cert, key },
            None => {
                let (cert_pem, key_pem) = ca
                    .serving_cert(&["localhost".into()], &["127.0.0.1".parse().unwrap()], 1)
                    .unwrap();
                CertSource::Generated { cert_pem, key_pem }
            }
        };
        let tls = ServingTls::load(certificate, opts.client_ca.as_deref()).unwrap();
        let server = Server::bind(
            state,
            None,
            server::Options {
                listen: "127.0.0.1:0".parse().unwrap(),
                metrics_listen: None,
                tls,
                cert_reload_interval: Duration::from_millis(50),
                limits: opts.limits,
                drain_delay: Duration::ZERO,
                drain_timeout: opts.drain_timeout,
                config_file: None,
                policy_params: Default::default(),
                policy_publish_interval: Duration::from_secs(10),
                extra_routes: opts.extra_routes,
            },
        )
        .await
        .unwrap();
        let addr = server.local_addr();
        let app = server.app().clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let join = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            ca,
            app,
            stop: Some(tx),
            join: Some(join),
        }
    }

    pub async fn connect(&self, proto: Proto) -> Client {
        Client::connect(self.addr, &self.ca.cert_pem, proto, None)
            .await
            .expect("connect")
    }

    /// Begin the drain and wait until the server has finished.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(j) = self.join.take() {
            j.await.unwrap();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2,
}

pub const BOTH: [Proto; 2] = [Proto::H1, Proto::H2];

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

pub struct Client {
    sender: Sender,
    pub alpn: Option<Vec<u8>>,
    /// The server's certificate (DER) this connection's handshake was given.
    pub peer: Option<Vec<u8>>,
}

pub struct Reply {
    pub status: u16,
    pub content_type: String,
    /// The `Connection` header, if any (HTTP/1.1).
    pub connection: Option<String>,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn tls_client_config(
    ca_pem: &str,
    proto: Proto,
    client_cert: Option<(&str, &str)>,
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut cfg = match client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    cfg.alpn_protocols = match proto {
        Proto::H1 => vec![b"http/1.1".to_vec()],
        Proto::H2 => vec![b"h2".to_vec()],
    };
    cfg
}

/// A CA and a serving certificate it signed for localhost and 127.0.0.1, written as
/// `dir/tls.crt` and `dir/tls.key`, for the real binary's `--tls-cert`/`--tls-key`.
pub fn write_loopback_cert(dir: &std::path::Path, name: &str) -> Ca {
    let ca = Ca::new(name, 1).unwrap();
    let (cert, key) = ca
        .serving_cert(&["localhost".into()], &["127.0.0.1".parse().unwrap()], 1)
        .unwrap();
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.join("tls.key"), key).unwrap();
    ca
}

impl Client {
    /// Connect once a server just started listens on `addr` (up to 5 s); `None` if it never does.
    pub async fn connect_when_listening(
        addr: SocketAddr,
        ca_pem: &str,
        proto: Proto,
    ) -> Option<Client> {
        for _ in 0..200 {
            if let Ok(c) = Client::connect(addr, ca_pem, proto, None).await {
                return Some(c);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        None
    }

    pub async fn connect(
        addr: SocketAddr,
        ca_pem: &str,
        proto: Proto,
        client_cert: Option<(&str, &str)>,
    ) -> Result<Client, String> {
        let cfg = tls_client_config(ca_pem, proto, client_cert);
        let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| e.to_string())?;
        let alpn = tls.get_ref().1.alpn_protocol().map(|p| p.to_vec());
        let peer = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec());
        let io = TokioIo::new(tls);
        let sender = match proto {
            Proto::H1 => {
                let (s, conn) = http1::handshake(io).await.map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                Sender::H1(s)
            }
            Proto::H2 => {
                let (s, conn) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                Sender::H2(s)
            }
        };
        Ok(Client { sender, alpn, peer })
    }

    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Reply, String> {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(format!("https://localhost{path}"))
            .header("user-agent", "kube-apiserver-admission");
        if let Some(ct) = content_type {
            b = b.header("content-type", ct);
        }
        let req = b.body(Full::new(Bytes::from(body))).unwrap();
        let resp = match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let connection = resp
            .headers()
            .get("connection")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply {
            status,
            content_type,
            connection,
            body,
        })
    }

    /// Whether the connection is gone (closed by the server, or a GOAWAY received).
    pub fn is_closed(&self) -> bool {
        match &self.sender {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// POST an AdmissionReview as the API server does.
    pub async fn review(&mut self, path: &str, body: Vec<u8>) -> Reply {
        self.send("POST", path, Some("application/json"), body)
            .await
            .expect("request")
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        self.send("GET", path, None, vec![]).await.expect("request")
    }
}
