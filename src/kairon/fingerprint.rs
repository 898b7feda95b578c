//! Which Kairon API a client speaks to, as recorded in `status.instance.endpoint` of the
//! KaironMachines whose VMs it holds: an identity whose Secret is changed to name another
//! server must not make those VMs read as gone.

use ring::digest::{Context, SHA256};

/// Bytes of the SHA-256 kept: enough to tell servers apart, short in a status.
const KEPT: usize = 16;

/// The fingerprint of the Kairon API `config` reaches: its server URL, the name its TLS
/// certificate is checked against and the CA it is checked with. New credentials for the same
/// server (a rotation) leave it unchanged.
pub(crate) fn endpoint_fingerprint(config: &kube::Config) -> String {
    let mut h = Context::new(&SHA256);
    let mut field = |bytes: &[u8]| {
        // Length-prefixed, so that no two sets of fields hash alike.
        h.update(&(bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(config.cluster_url.to_string().as_bytes());
    field(config.tls_server_name.as_deref().unwrap_or_default().as_bytes());
    for cert in config.root_cert.iter().flatten() {
        field(cert);
    }
    let digest = h.finish();
    let hex: String = digest.as_ref()[..KEPT].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str, ca: Option<&[u8]>, token: &str) -> kube::Config {
        let mut c = kube::Config::new(url.parse().unwrap());
        c.root_cert = ca.map(|ca| vec![ca.to_vec()]);
        c.auth_info.token = Some(token.to_string().into());
        c
    }

    #[test]
    fn the_same_server_and_ca_are_the_same_endpoint_whatever_the_credentials() {
        let a = config("https://kairon-a:6443", Some(b"ca-a"), "t1");
        let fp = endpoint_fingerprint(&a);
        assert!(fp.starts_with("sha256:") && fp.len() == 7 + 2 * KEPT, "{fp}");
        let cases = [
            (
                "credentials rotated",
                config("https://kairon-a:6443", Some(b"ca-a"), "t2"),
                true,
            ),
            (
                "another server",
                config("https://kairon-b:6443", Some(b"ca-a"), "t1"),
                false,
            ),
            (
                "another port",
                config("https://kairon-a:7443", Some(b"ca-a"), "t1"),
                false,
            ),
            (
                "another CA",
                config("https://kairon-a:6443", Some(b"ca-b"), "t1"),
                false,
            ),
            ("no CA", config("https://kairon-a:6443", None, "t1"), false),
        ];
        for (name, c, same) in cases {
            assert_eq!(endpoint_fingerprint(&c) == fp, same, "{name}");
        }
        let mut named = config("https://10.0.0.1:6443", Some(b"ca-a"), "t1");
        let plain = endpoint_fingerprint(&named);
        named.tls_server_name = Some("kairon-a".into());
        assert_ne!(endpoint_fingerprint(&named), plain, "another TLS server name");
    }
}
