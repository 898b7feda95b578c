//! Throw-away PKI: a CA per environment (and one per workload cluster), serving certificates
//! for 127.0.0.1, and client certificates for `system:masters` users. ECDSA P-256 keys in PKCS#8
//! PEM, which kube-apiserver, Go's `crypto/x509` (CAPI's `util/certs`) and rustls all accept.

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A PEM certificate and its PEM (PKCS#8) private key.
#[derive(Clone, Debug)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate authority that can sign serving and client certificates.
pub struct Ca {
    pub pair: CertPair,
    issuer: Issuer<'static, KeyPair>,
}

fn validity(params: &mut CertificateParams) {
    // A little slack in the past for clock skew; long enough for any test run.
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365);
}

impl Ca {
    pub fn new(common_name: &str) -> Result<Ca> {
        let key = KeyPair::generate().context("generating a CA key")?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let cert = params.self_signed(&key).context("self-signing the CA")?;
        let pair = CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        Ok(Ca {
            pair,
            issuer: Issuer::new(params, key),
        })
    }

    /// A serving certificate for loopback (IP 127.0.0.1, DNS localhost) plus `extra_sans`.
    pub fn serving_cert(&self, common_name: &str, extra_sans: &[&str]) -> Result<CertPair> {
        let mut sans = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        sans.extend(extra_sans.iter().map(|s| s.to_string()));
        let mut params = CertificateParams::new(sans).context("serving certificate SANs")?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params);
        self.sign(params)
    }

    /// A client certificate: Kubernetes reads the user from CN and the groups from O.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<CertPair> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, user);
        for g in groups {
            dn.push(DnType::OrganizationName, *g);
        }
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params);
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<CertPair> {
        let key = KeyPair::generate().context("generating a key")?;
        let cert = params.signed_by(&key, &self.issuer).context("signing a certificate")?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A key pair for service-account token signing: (public key PEM, private key PEM).
pub fn service_account_keys() -> Result<(String, String)> {
    let key = KeyPair::generate().context("generating the service-account signing key")?;
    Ok((key.public_key_pem(), key.serialize_pem()))
}
