//! A CA and a serving certificate for the webhook, made with rcgen: for `handoff certs`, for
//! `handoff serve` without `--tls-cert`, and for tests.

use std::net::IpAddr;
use std::path::Path;

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// PEM text of a generated CA and a serving certificate signed by it.
#[derive(Debug, Clone)]
pub struct GeneratedCerts {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl GeneratedCerts {
    /// The `caBundle` a webhook configuration wants: base64 of the CA's PEM.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca_cert_pem.as_bytes())
    }
}

fn ca_params(common_name: &str, days: u32) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    validity(&mut params, days);
    Ok(params)
}

fn validity(params: &mut CertificateParams, days: u32) {
    // An hour of slack for clocks that disagree with the API server's.
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// A certificate authority made here, able to sign serving and client certificates.
pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    pub fn new(common_name: &str, days: u32) -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let params = ca_params(common_name, days)?;
        let cert = params.self_signed(&key)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            params,
            key,
        })
    }

    /// A serving certificate for `dns_names` and `ips`: `(cert PEM, key PEM)`.
    pub fn serving_cert(
        &self,
        dns_names: &[String],
        ips: &[IpAddr],
        days: u32,
    ) -> Result<(String, String), rcgen::Error> {
        let mut params = CertificateParams::new(dns_names.to_vec())?;
        for ip in ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        let cn = dns_names
            .first()
            .cloned()
            .or_else(|| ips.first().map(|i| i.to_string()))
            .unwrap_or_else(|| "handoff".to_string());
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, days)
    }

    /// A client certificate (for `--client-ca` set-ups): `(cert PEM, key PEM)`.
    pub fn client_cert(
        &self,
        common_name: &str,
        days: u32,
    ) -> Result<(String, String), rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, days)
    }

    fn sign(
        &self,
        mut params: CertificateParams,
        days: u32,
    ) -> Result<(String, String), rcgen::Error> {
        validity(&mut params, days);
        let key = KeyPair::generate()?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// The names `handoff certs` puts on the serving certificate by default: both Services as the
/// manifests deploy them (short and cluster-local), and localhost.
pub fn default_dns_names() -> Vec<String> {
    use crate::rules::move_window::{GUARD_DEPLOYMENT, HANDOFF_NAMESPACE, PIN_DEPLOYMENT};
    let svc = |name: &str, suffix: &str| format!("{name}.{HANDOFF_NAMESPACE}.svc{suffix}");
    vec![
        svc(GUARD_DEPLOYMENT, ""),
        svc(PIN_DEPLOYMENT, ""),
        svc(GUARD_DEPLOYMENT, ".cluster.local"),
        svc(PIN_DEPLOYMENT, ".cluster.local"),
        "localhost".into(),
    ]
}

/// A CA valid for `days`, and a serving certificate for `dns_names` and `ips` signed by it.
pub fn generate(
    dns_names: &[String],
    ips: &[IpAddr],
    days: u32,
) -> Result<GeneratedCerts, rcgen::Error> {
    let ca = Ca::new("handoff webhook CA", days)?;
    let (cert_pem, key_pem) = ca.serving_cert(dns_names, ips, days)?;
    Ok(GeneratedCerts {
        ca_cert_pem: ca.cert_pem,
        ca_key_pem: ca.key_pem,
        cert_pem,
        key_pem,
    })
}

/// Write `ca.crt`, `ca.key`, `tls.crt`, `tls.key` into `dir` (created if needed); keys get
/// mode 0600.
pub fn write_dir(dir: &Path, certs: &GeneratedCerts) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    write_file(&dir.join("ca.crt"), &certs.ca_cert_pem, false)?;
    write_file(&dir.join("ca.key"), &certs.ca_key_pem, true)?;
    write_file(&dir.join("tls.crt"), &certs.cert_pem, false)?;
    write_file(&dir.join("tls.key"), &certs.key_pem, true)?;
    Ok(())
}

fn write_file(path: &Path, text: &str, private: bool) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    if private {
        opts.mode(0o600);
    }
    opts.open(path)?.write_all(text.as_bytes())
}
