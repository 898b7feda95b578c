//! What CAPI's TLS flags may be — `--tls-min-version`, `--tls-cipher-suites`,
//! `--tls-curve-preferences`, with the values Go's `crypto/tls` (and so every CAPI manager)
//! takes — and the rustls provider they make for every TLS listener of the manager.
//!
//! The manager's TLS is rustls with *ring*: TLS 1.2 and 1.3, ECDHE with AEAD suites only, and
//! the groups X25519, P-256 and P-384. A value Go knows but rustls does not implement (TLS 1.0
//! and 1.1; CBC, RC4, 3DES and RSA key-exchange suites; P-521 and X25519MLKEM768) is refused at
//! start, saying so: never dropped without a word.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{CipherSuite, NamedGroup, ProtocolVersion, SupportedProtocolVersion};

/// The lowest TLS version a listener accepts (`--tls-min-version`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsVersion {
    #[default]
    Tls12,
    Tls13,
}

/// The TLS settings of every TLS listener of the manager.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    pub min_version: TlsVersion,
    /// The suites given (Go's names, parsed); every suite when empty. As in Go, only the TLS
    /// 1.2 suites are chosen by it: the TLS 1.3 ones are always all offered.
    pub cipher_suites: Vec<CipherSuite>,
    /// The key-exchange groups (Go's CurveID numbers, the IANA ones); every group when empty.
    pub curves: Vec<NamedGroup>,
}

/// `--tls-min-version`: Go's names.
pub fn parse_tls_version(s: &str) -> Result<TlsVersion, String> {
    match s.trim() {
        "VersionTLS12" | "" => Ok(TlsVersion::Tls12),
        "VersionTLS13" => Ok(TlsVersion::Tls13),
        old @ ("VersionTLS10" | "VersionTLS11") => Err(format!(
            "{old} is not supported: the manager's TLS (rustls) implements TLS 1.2 and 1.3 only; use VersionTLS12 or VersionTLS13"
        )),
        other => Err(format!(
            "unknown TLS version {other:?}: possible values are VersionTLS12, VersionTLS13"
        )),
    }
}

/// Go's names of the suites rustls implements (with Kubernetes' two legacy names of the
/// ChaCha20 suites, which `--tls-cipher-suites` of every Kubernetes component takes).
const IMPLEMENTED: &[(&str, CipherSuite)] = &[
    ("TLS_AES_128_GCM_SHA256", CipherSuite::TLS13_AES_128_GCM_SHA256),
    ("TLS_AES_256_GCM_SHA384", CipherSuite::TLS13_AES_256_GCM_SHA384),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Go's names of the suites it has and rustls does not (`tls.CipherSuites()` with CBC and
/// `tls.InsecureCipherSuites()`).
const NOT_IMPLEMENTED: &[&str] = &[
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// The TLS 1.2 names `--tls-cipher-suites` takes, for messages and `--help`.
pub fn tls12_suite_names() -> impl Iterator<Item = &'static str> {
    IMPLEMENTED
        .iter()
        .filter(|(name, _)| name.starts_with("TLS_ECDHE_") && (name.ends_with("_SHA256") || name.ends_with("_SHA384")))
        .map(|(name, _)| *name)
}

/// One name of `--tls-cipher-suites`.
pub fn parse_cipher_suite(s: &str) -> Result<CipherSuite, String> {
    let name = s.trim();
    if let Some((_, suite)) = IMPLEMENTED.iter().find(|(n, _)| *n == name) {
        return Ok(*suite);
    }
    let supported = tls12_suite_names().collect::<Vec<_>>().join(", ");
    if NOT_IMPLEMENTED.contains(&name) {
        return Err(format!(
            "cipher suite {name} is not supported: the manager's TLS (rustls) implements no CBC, RC4, 3DES or RSA key-exchange suite; TLS 1.2 suites: {supported}"
        ));
    }
    Err(format!(
        "unknown cipher suite {name:?}: use the IANA names Go's crypto/tls gives; TLS 1.2 suites: {supported}"
    ))
}

/// One number of `--tls-curve-preferences` (Go's `tls.CurveID`, the IANA group number).
pub fn parse_curve(s: &str) -> Result<NamedGroup, String> {
    let supported = "23 (P-256), 24 (P-384), 29 (X25519)";
    match s.trim().parse::<i32>() {
        Ok(23) => Ok(NamedGroup::secp256r1),
        Ok(24) => Ok(NamedGroup::secp384r1),
        Ok(29) => Ok(NamedGroup::X25519),
        Ok(n @ (25 | 4588)) => Err(format!(
            "curve {n} ({}) is not supported by the manager's TLS (rustls with ring); supported: {supported}",
            if n == 25 { "P-521" } else { "X25519MLKEM768" }
        )),
        Ok(n) => Err(format!("unknown curve ID {n}: supported: {supported}")),
        Err(_) => Err(format!(
            "invalid curve ID {s:?}: Go's numeric tls.CurveID values, e.g. {supported}"
        )),
    }
}

/// `--tls-cipher-suites`: Go's names, comma-separated (empty entries skipped, as Go's string
/// slices do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CipherSuites(pub Vec<CipherSuite>);

pub fn parse_cipher_suites(s: &str) -> Result<CipherSuites, String> {
    s.split(',')
        .filter(|n| !n.trim().is_empty())
        .map(parse_cipher_suite)
        .collect::<Result<_, _>>()
        .map(CipherSuites)
}

/// `--tls-curve-preferences`: Go's numeric CurveIDs, comma-separated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Curves(pub Vec<NamedGroup>);

pub fn parse_curves(s: &str) -> Result<Curves, String> {
    s.split(',')
        .filter(|n| !n.trim().is_empty())
        .map(parse_curve)
        .collect::<Result<_, _>>()
        .map(Curves)
}

impl TlsOptions {
    /// The provider (suites and groups allowed) and the protocol versions of a listener.
    pub(crate) fn provider(&self) -> (Arc<CryptoProvider>, Vec<&'static SupportedProtocolVersion>) {
        let mut provider = rustls::crypto::ring::default_provider();
        if !self.cipher_suites.is_empty() {
            provider
                .cipher_suites
                .retain(|s| is_tls13(s.version()) || self.cipher_suites.contains(&s.suite()));
        }
        if !self.curves.is_empty() {
            provider.kx_groups.retain(|g| self.curves.contains(&g.name()));
        }
        // No TLS 1.2 suite left (only TLS 1.3 names given): TLS 1.2 could not be negotiated,
        // as in Go; say it with the versions rather than fail handshakes.
        let tls12 =
            self.min_version == TlsVersion::Tls12 && provider.cipher_suites.iter().any(|s| !is_tls13(s.version()));
        let versions = if tls12 {
            vec![&rustls::version::TLS12, &rustls::version::TLS13]
        } else {
            vec![&rustls::version::TLS13]
        };
        (Arc::new(provider), versions)
    }
}

fn is_tls13(v: &SupportedProtocolVersion) -> bool {
    v.version == ProtocolVersion::TLSv1_3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_take_go_names_and_refuse_what_rustls_lacks() {
        let cases: [(&str, Result<TlsVersion, &str>); 6] = [
            ("VersionTLS12", Ok(TlsVersion::Tls12)),
            ("VersionTLS13", Ok(TlsVersion::Tls13)),
            ("", Ok(TlsVersion::Tls12)),
            ("VersionTLS10", Err("TLS 1.2 and 1.3 only")),
            ("VersionTLS11", Err("TLS 1.2 and 1.3 only")),
            ("TLS13", Err("VersionTLS12, VersionTLS13")),
        ];
        for (value, want) in cases {
            match (parse_tls_version(value), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{value}"),
                (Err(e), Err(part)) => assert!(e.contains(part), "{value}: {e}"),
                (got, _) => panic!("{value}: {got:?}"),
            }
        }
    }

    #[test]
    fn cipher_suites_take_go_names_and_say_why_one_is_refused() {
        let cases: [(&str, Result<CipherSuite, &str>); 7] = [
            (
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                Ok(CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
            ),
            (
                " TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                Ok(CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
            ),
            ("TLS_AES_256_GCM_SHA384", Ok(CipherSuite::TLS13_AES_256_GCM_SHA384)),
            ("TLS_RSA_WITH_AES_128_GCM_SHA256", Err("not supported")),
            ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", Err("no CBC")),
            ("TLS_NOPE", Err("unknown cipher suite \"TLS_NOPE\"")),
            ("tls_ecdhe_rsa_with_aes_128_gcm_sha256", Err("unknown cipher suite")),
        ];
        for (value, want) in cases {
            match (parse_cipher_suite(value), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{value}"),
                (Err(e), Err(part)) => {
                    assert!(e.contains(part), "{value}: {e}");
                    assert!(
                        e.contains("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"),
                        "lists the supported: {e}"
                    );
                }
                (got, _) => panic!("{value}: {got:?}"),
            }
        }
        assert_eq!(tls12_suite_names().count(), 6);
    }

    #[test]
    fn curves_take_go_curve_ids() {
        assert_eq!(parse_curve("29"), Ok(NamedGroup::X25519));
        assert_eq!(parse_curve("23"), Ok(NamedGroup::secp256r1));
        assert_eq!(parse_curve("24"), Ok(NamedGroup::secp384r1));
        for (bad, part) in [
            ("25", "P-521"),
            ("4588", "X25519MLKEM768"),
            ("7", "unknown"),
            ("x", "invalid"),
        ] {
            let e = parse_curve(bad).unwrap_err();
            assert!(e.contains(part) && e.contains("29 (X25519)"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_provider_keeps_what_the_flags_allow() {
        let suites = |o: &TlsOptions| {
            let (p, v) = o.provider();
            (
                p.cipher_suites.iter().map(|s| s.suite()).collect::<Vec<_>>(),
                p.kx_groups.iter().map(|g| g.name()).collect::<Vec<_>>(),
                v.iter().map(|v| v.version).collect::<Vec<_>>(),
            )
        };
        let (all, groups, versions) = suites(&TlsOptions::default());
        assert_eq!(all.len(), 9, "every suite by default");
        assert_eq!(groups.len(), 3);
        assert_eq!(versions, [ProtocolVersion::TLSv1_2, ProtocolVersion::TLSv1_3]);

        let one = TlsOptions {
            cipher_suites: vec![CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256],
            curves: vec![NamedGroup::X25519],
            ..TlsOptions::default()
        };
        let (kept, groups, versions) = suites(&one);
        assert_eq!(
            kept.len(),
            4,
            "the one TLS 1.2 suite and the three of TLS 1.3: {kept:?}"
        );
        assert!(kept.contains(&CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256));
        assert_eq!(groups, [NamedGroup::X25519]);
        assert_eq!(versions.len(), 2);

        let tls13_names_only = TlsOptions {
            cipher_suites: vec![CipherSuite::TLS13_AES_128_GCM_SHA256],
            ..TlsOptions::default()
        };
        assert_eq!(
            suites(&tls13_names_only).2,
            [ProtocolVersion::TLSv1_3],
            "no TLS 1.2 suite left"
        );
        let min13 = TlsOptions {
            min_version: TlsVersion::Tls13,
            ..TlsOptions::default()
        };
        assert_eq!(suites(&min13).2, [ProtocolVersion::TLSv1_3]);
    }
}
