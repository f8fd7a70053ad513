//! Serving TLS: rustls with the ring provider, TLS 1.2 and 1.3, ALPN h2 and http/1.1, and a
//! certificate that is re-read from its files whenever they change.
//!
//! The files are polled rather than watched: a kubelet Secret update swaps the `..data`
//! symlink, which inotify-based watchers lose after the first rotation (the Kubewarden bug in
//! STYLE.md). Reading two small files once a second and comparing bytes survives every form
//! of replacement and costs nothing measurable.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use crate::server::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path}: not a PEM private key (PKCS#8, PKCS#1 or SEC1): {message}")]
    Key { path: String, message: String },
    #[error("{cert} and {key} do not form a usable pair: {message}")]
    Pair {
        cert: String,
        key: String,
        message: String,
    },
    #[error("client CA {path}: {message}")]
    ClientCa { path: String, message: String },
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parse a PEM chain and key into a `CertifiedKey`, checking that the key matches the leaf.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_name: &str,
    key_name: &str,
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_name.to_string(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key {
        path: key_name.to_string(),
        message: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| TlsError::Pair {
        cert: cert_name.to_string(),
        key: key_name.to_string(),
        message: e.to_string(),
    })
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// Generated at start-up (the embedded default); never changes.
    Generated {
        cert_pem: String,
        key_pem: String,
    },
}

/// The certificate being served, swapped atomically when the files change.
pub struct CertStore {
    current: RwLock<Arc<CertifiedKey>>,
    source: CertSource,
    /// The bytes last seen on disk, good or bad, so a bad pair is reported once per change.
    last_seen: RwLock<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("source", &self.source)
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

impl CertStore {
    /// Load the first certificate; an error here stops start-up.
    pub fn load(source: CertSource) -> Result<Self, TlsError> {
        let (cert, key, cn, kn) = match &source {
            CertSource::Files { cert, key } => (
                read(cert)?,
                read(key)?,
                cert.display().to_string(),
                key.display().to_string(),
            ),
            CertSource::Generated { cert_pem, key_pem } => (
                cert_pem.clone().into_bytes(),
                key_pem.clone().into_bytes(),
                "generated certificate".into(),
                "generated key".into(),
            ),
        };
        let ck = certified_key(&cert, &key, &cn, &kn)?;
        Ok(CertStore {
            current: RwLock::new(Arc::new(ck)),
            source,
            last_seen: RwLock::new((cert, key)),
        })
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-read the files. `Ok(true)` when a new pair is now served, `Ok(false)` when nothing
    /// changed, `Err` when the files changed to something unusable (the old pair stays).
    pub fn reload(&self) -> Result<bool, TlsError> {
        let CertSource::Files { cert, key } = &self.source else {
            return Ok(false);
        };
        let cert_bytes = read(cert)?;
        let key_bytes = read(key)?;
        {
            let seen = self.last_seen.read().unwrap_or_else(|e| e.into_inner());
            if seen.0 == cert_bytes && seen.1 == key_bytes {
                return Ok(false);
            }
        }
        let result = certified_key(
            &cert_bytes,
            &key_bytes,
            &cert.display().to_string(),
            &key.display().to_string(),
        );
        *self.last_seen.write().unwrap_or_else(|e| e.into_inner()) = (cert_bytes, key_bytes);
        let ck = result?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(ck);
        Ok(true)
    }

    /// The served certificate's `notAfter` (Unix seconds).
    pub fn not_after(&self) -> Option<i64> {
        self.current().cert.first().and_then(|c| not_after(c))
    }

    fn publish(&self, metrics: &Metrics) {
        if let Some(t) = self.not_after() {
            metrics.cert_expiry.set(t as f64);
        }
        metrics
            .cert_last_reload
            .set(crate::state::telemetry::unix_now());
    }

    /// Poll the files every `interval` until the process ends.
    pub async fn watch(self: Arc<Self>, interval: Duration, metrics: Arc<Metrics>) {
        self.publish(&metrics);
        if !matches!(self.source, CertSource::Files { .. }) {
            return;
        }
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let store = self.clone();
            // File reads and parsing stay off the request-serving threads.
            let outcome = tokio::task::spawn_blocking(move || store.reload()).await;
            match outcome {
                Ok(Ok(true)) => {
                    metrics.cert_reloads.inc();
                    metrics.cert_reload_failing.set(0);
                    self.publish(&metrics);
                    tracing::info!("serving certificate reloaded");
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    metrics.cert_reload_errors.inc();
                    metrics.cert_reload_failing.set(1);
                    tracing::error!(error = %e, "new serving certificate rejected; still serving the last good one");
                }
                Err(e) => tracing::error!(error = %e, "certificate reload task failed"),
            }
        }
    }
}

/// The `notAfter` of a DER certificate, as Unix seconds: `Certificate ::= SEQUENCE {
/// tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer, validity
/// SEQUENCE { notBefore, notAfter }, … } … }` (RFC 5280 §4.1), the times as UTCTime or
/// GeneralizedTime. `None` for anything else: the metric then keeps its last value (0 before
/// any), which the alerts ignore.
pub fn not_after(der: &[u8]) -> Option<i64> {
    // One TLV: (tag, contents, rest).
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, b) = b.split_first()?;
        let (&first, mut b) = b.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || b.len() < n {
                return None;
            }
            let (l, rest) = b.split_at(n);
            b = rest;
            l.iter().fold(0usize, |acc, x| (acc << 8) | usize::from(*x))
        };
        (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
    }
    let (0x30, cert, _) = tlv(der)? else {
        return None;
    };
    let (0x30, tbs, _) = tlv(cert)? else {
        return None;
    };
    let mut rest = tbs;
    let (tag, _, r) = tlv(rest)?;
    if tag == 0xa0 {
        rest = r; // version
    }
    for _ in 0..3 {
        rest = tlv(rest)?.2; // serialNumber, signature, issuer
    }
    let (0x30, validity, _) = tlv(rest)? else {
        return None;
    };
    let (_, _, r) = tlv(validity)?;
    let (tag, time, _) = tlv(r)?;
    let text = std::str::from_utf8(time).ok()?.strip_suffix('Z')?;
    // Digits only, so that the slicing below is on character boundaries.
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = |s: &str| s.parse::<i16>().ok();
    let (year, rest) = match tag {
        // UTCTime: YY, 50–99 meaning 19YY (RFC 5280 §4.1.2.5.1).
        0x17 if text.len() == 12 => {
            let yy = digits(&text[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        0x18 if text.len() == 14 => (digits(&text[..4])?, &text[4..]),
        _ => return None,
    };
    let field = |i: usize| rest.get(i..i + 2).and_then(|s| s.parse::<i8>().ok());
    let dt = k8s_openapi::jiff::civil::DateTime::new(
        year,
        field(0)?,
        field(2)?,
        field(4)?,
        field(6)?,
        field(8)?,
        0,
    )
    .ok()?;
    Some(
        dt.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
            .ok()?
            .timestamp()
            .as_second(),
    )
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The rustls server configuration: TLS 1.2/1.3, ALPN h2 then http/1.1, and client certificate
/// verification when `client_ca` is given.
pub fn server_config(
    store: Arc<CertStore>,
    client_ca: Option<&Path>,
) -> Result<rustls::ServerConfig, TlsError> {
    let provider = provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let name = path.display().to_string();
            let pem = read(path)?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| TlsError::ClientCa {
                    path: name.clone(),
                    message: e.to_string(),
                })?;
                roots.add(cert).map_err(|e| TlsError::ClientCa {
                    path: name.clone(),
                    message: e.to_string(),
                })?;
            }
            if roots.is_empty() {
                return Err(TlsError::ClientCa {
                    path: name,
                    message: "holds no PEM certificate".into(),
                });
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: name,
                    message: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_after_reads_the_validity_of_a_real_certificate() {
        let ca = crate::certs::Ca::new("expiry test", 30).unwrap();
        let (pem, _) = ca
            .serving_cert(&["handoff-pin.handoff-system.svc".into()], &[], 10)
            .unwrap();
        let der = CertificateDer::pem_slice_iter(pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let t = not_after(&der).expect("a notAfter");
        let now = crate::state::telemetry::unix_now() as i64;
        let days = (t - now) as f64 / 86400.0;
        assert!((9.0..=11.0).contains(&days), "{days} days");
        // Not a certificate: no answer, no panic.
        for bad in [
            &b""[..],
            b"\x30",
            b"\x30\x82\xff\xff",
            &der[..der.len() / 2],
        ] {
            assert_eq!(not_after(bad), None);
        }
    }
}
