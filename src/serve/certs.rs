//! The admission webhook's serving certificate: a private CA and a certificate it signs, made
//! with rcgen, kept in a Secret so every replica serves the same one and a restart reuses it,
//! and renewed before it runs out. Generation and the renewal decision are pure; the engine-side
//! task that stores them lives in [`crate::serve::admission`].

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// Secret keys (the `kubernetes.io/tls` layout plus the CA's key).
pub const CA_CERT_KEY: &str = "ca.crt";
pub const CA_KEY_KEY: &str = "ca.key";
pub const CERT_KEY: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";
/// Secret annotations that describe the bundle, so renewal needs no certificate parsing.
pub const CA_NOT_AFTER_ANNOTATION: &str = "reloader.rs/ca-not-after";
pub const CERT_NOT_AFTER_ANNOTATION: &str = "reloader.rs/cert-not-after";
pub const CERT_HOSTS_ANNOTATION: &str = "reloader.rs/cert-hosts";

const DAY: i64 = 86_400;
/// The CA lives ten years and is replaced in its last year.
pub const CA_LIFETIME: i64 = 3650 * DAY;
pub const CA_RENEW_BEFORE: i64 = 365 * DAY;
/// The serving certificate lives one year and is replaced in its last 90 days.
pub const CERT_LIFETIME: i64 = 365 * DAY;
pub const CERT_RENEW_BEFORE: i64 = 90 * DAY;
/// Certificates are valid from a little before they are made (clock skew between nodes).
const BACKDATE: i64 = 3600;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("time out of range: {0}")]
    Time(#[from] time::error::ComponentRange),
}

/// A CA and a serving certificate it signed (PEM), with what renewal needs to know.
#[derive(Clone, PartialEq, Eq)]
pub struct Bundle {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    /// Seconds since the epoch.
    pub ca_not_after: i64,
    pub cert_not_after: i64,
    /// The names (DNS or IP) the serving certificate is valid for.
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for Bundle {
    // Private keys never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundle")
            .field("ca_not_after", &self.ca_not_after)
            .field("cert_not_after", &self.cert_not_after)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// What has to be made new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Everything is valid long enough and names the right hosts.
    Keep,
    /// A new serving certificate from the same CA (the `caBundle` stays valid).
    Certificate,
    /// A new CA and certificate (none yet, unreadable, or the CA runs out).
    Everything,
}

/// Decides what to renew at `now` for a certificate that must name `hosts`.
pub fn renewal(bundle: Option<&Bundle>, hosts: &[String], now: i64) -> Renewal {
    let Some(b) = bundle else { return Renewal::Everything };
    if b.ca_not_after - now < CA_RENEW_BEFORE {
        return Renewal::Everything;
    }
    let mut want: Vec<&String> = hosts.iter().collect();
    let mut have: Vec<&String> = b.hosts.iter().collect();
    want.sort();
    have.sort();
    if b.cert_not_after - now < CERT_RENEW_BEFORE || want != have {
        return Renewal::Certificate;
    }
    Renewal::Keep
}

fn at(seconds: i64) -> Result<time::OffsetDateTime, CertError> {
    Ok(time::OffsetDateTime::from_unix_timestamp(seconds)?)
}

/// The CA's parameters: fixed, so a certificate can be signed again from the stored CA key.
fn ca_params(not_before: i64, not_after: i64) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "reloader-webhook-ca");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = at(not_before)?;
    params.not_after = at(not_after)?;
    Ok(params)
}

/// A new CA and a serving certificate for `hosts`.
pub fn generate(hosts: &[String], now: i64) -> Result<Bundle, CertError> {
    let ca_key = KeyPair::generate()?;
    let ca_not_after = now + CA_LIFETIME;
    let ca_cert = ca_params(now - BACKDATE, ca_not_after)?.self_signed(&ca_key)?;
    let partial = Bundle {
        ca_cert: ca_cert.pem(),
        ca_key: ca_key.serialize_pem(),
        cert: String::new(),
        key: String::new(),
        ca_not_after,
        cert_not_after: 0,
        hosts: vec![],
    };
    reissue(&partial, hosts, now)
}

/// A new serving certificate for `hosts`, signed by the bundle's CA.
pub fn reissue(bundle: &Bundle, hosts: &[String], now: i64) -> Result<Bundle, CertError> {
    let ca_key = KeyPair::from_pem(&bundle.ca_key)?;
    let issuer = Issuer::new(ca_params(now - BACKDATE, bundle.ca_not_after)?, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(hosts.to_vec())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, hosts.first().map(String::as_str).unwrap_or("reloader-webhook"));
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // Never outlives its CA.
    let cert_not_after = (now + CERT_LIFETIME).min(bundle.ca_not_after);
    params.not_before = at(now - BACKDATE)?;
    params.not_after = at(cert_not_after)?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Bundle {
        cert: cert.pem(),
        key: key.serialize_pem(),
        cert_not_after,
        hosts: hosts.to_vec(),
        ..bundle.clone()
    })
}

/// Reads a bundle from a Secret's data and annotations; `None` when anything is missing.
pub fn from_secret(
    data: &BTreeMap<String, ByteString>,
    annotations: &BTreeMap<String, String>,
) -> Option<Bundle> {
    let text = |k: &str| data.get(k).and_then(|v| String::from_utf8(v.0.clone()).ok());
    let number = |k: &str| annotations.get(k).and_then(|v| v.parse::<i64>().ok());
    Some(Bundle {
        ca_cert: text(CA_CERT_KEY)?,
        ca_key: text(CA_KEY_KEY)?,
        cert: text(CERT_KEY)?,
        key: text(KEY_KEY)?,
        ca_not_after: number(CA_NOT_AFTER_ANNOTATION)?,
        cert_not_after: number(CERT_NOT_AFTER_ANNOTATION)?,
        hosts: annotations
            .get(CERT_HOSTS_ANNOTATION)?
            .split(',')
            .filter(|h| !h.is_empty())
            .map(String::from)
            .collect(),
    })
}

/// The Secret data and annotations that hold `bundle`.
pub fn to_secret(bundle: &Bundle) -> (BTreeMap<String, ByteString>, BTreeMap<String, String>) {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let data = [
        (CA_CERT_KEY, bytes(&bundle.ca_cert)),
        (CA_KEY_KEY, bytes(&bundle.ca_key)),
        (CERT_KEY, bytes(&bundle.cert)),
        (KEY_KEY, bytes(&bundle.key)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let annotations = [
        (CA_NOT_AFTER_ANNOTATION, bundle.ca_not_after.to_string()),
        (CERT_NOT_AFTER_ANNOTATION, bundle.cert_not_after.to_string()),
        (CERT_HOSTS_ANNOTATION, bundle.hosts.join(",")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    (data, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn hosts() -> Vec<String> {
        vec!["reloader.reloader.svc".into(), "127.0.0.1".into()]
    }

    #[test]
    fn renewal_follows_lifetimes_and_hosts() {
        assert_eq!(renewal(None, &hosts(), NOW), Renewal::Everything);
        let b = Bundle {
            ca_cert: String::new(),
            ca_key: String::new(),
            cert: String::new(),
            key: String::new(),
            ca_not_after: NOW + CA_LIFETIME,
            cert_not_after: NOW + CERT_LIFETIME,
            hosts: hosts().into_iter().rev().collect(),
        };
        assert_eq!(renewal(Some(&b), &hosts(), NOW), Renewal::Keep, "host order does not matter");
        let late = NOW + CERT_LIFETIME - CERT_RENEW_BEFORE + 1;
        assert_eq!(renewal(Some(&b), &hosts(), late), Renewal::Certificate);
        assert_eq!(renewal(Some(&b), &["other.svc".to_string()], NOW), Renewal::Certificate);
        let ca_ending = NOW + CA_LIFETIME - CA_RENEW_BEFORE + 1;
        assert_eq!(renewal(Some(&b), &hosts(), ca_ending), Renewal::Everything);
    }

    #[test]
    fn generated_bundles_round_trip_through_a_secret_and_reissue_from_the_same_ca() {
        let b = generate(&hosts(), NOW).unwrap();
        assert!(b.ca_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(b.key.contains("PRIVATE KEY"));
        assert_eq!(b.cert_not_after, NOW + CERT_LIFETIME);
        assert_eq!(renewal(Some(&b), &hosts(), NOW), Renewal::Keep);
        let (data, annotations) = to_secret(&b);
        assert_eq!(from_secret(&data, &annotations), Some(b.clone()));
        let mut partial = data.clone();
        partial.remove(KEY_KEY);
        assert_eq!(from_secret(&partial, &annotations), None);
        // Debug output never carries a key.
        assert!(!format!("{b:?}").contains("PRIVATE"));

        let renewed = reissue(&b, &["other.svc".to_string()], NOW + DAY).unwrap();
        assert_eq!(renewed.ca_cert, b.ca_cert, "same CA: the caBundle stays valid");
        assert_ne!(renewed.cert, b.cert);
        assert_eq!(renewed.hosts, vec!["other.svc".to_string()]);
    }

    #[test]
    fn the_certificate_is_trusted_through_the_ca_for_its_hosts() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let b = generate(&hosts(), time::OffsetDateTime::now_utc().unix_timestamp()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(b.ca_cert.as_bytes()).unwrap()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        let cert = CertificateDer::from_pem_slice(b.cert.as_bytes()).unwrap();
        let now = rustls::pki_types::UnixTime::now();
        for host in ["reloader.reloader.svc", "127.0.0.1"] {
            let name = ServerName::try_from(host.to_string()).unwrap();
            verifier
                .verify_server_cert(&cert, &[], &name, &[], now)
                .unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        let wrong = ServerName::try_from("elsewhere.svc".to_string()).unwrap();
        assert!(verifier.verify_server_cert(&cert, &[], &wrong, &[], now).is_err());
        assert!(PrivateKeyDer::from_pem_slice(b.key.as_bytes()).is_ok());
    }
}
