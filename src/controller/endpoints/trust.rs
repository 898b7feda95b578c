//! What a kubeconfig from an identity may name, and the bounds of the client built from it.
//!
//! The kubeconfig is written by a cluster's owner (a Secret of their namespace) or by an
//! operator (a KaironClusterIdentity's Secret), and the manager sends that cluster's bootstrap
//! data (its CA keys among them) wherever it points. So:
//!
//! - nothing that makes the manager run a command or read a file of its own: exec plugins,
//!   auth providers, file paths ([`refusal`]);
//! - only `https://`, with the server's certificate verified: no plain `http://`, no
//!   `insecure-skip-tls-verify`; no `proxy-url` (the manager would connect to the proxy's host
//!   instead); `tls-server-name` is allowed (it only says which name the certificate must
//!   carry);
//! - the server's host among `--identity-allowed-servers` when the operator gives that list
//!   ([`AllowedServers`]);
//! - the client gives up on a server that does not accept a connection within
//!   [`CONNECT_TIMEOUT`] or is silent for [`READ_TIMEOUT`] (kube has no read timeout by
//!   default); its watches ask the server to end them after [`WATCH_TIMEOUT_SECS`], so that a
//!   quiet watch never runs into the read timeout. The same holds for the client of
//!   `--kairon-kubeconfig` ([`bounded_waits`]); the management cluster's client, when it is
//!   also the Kairon API's, keeps kube's defaults (its watches are the management caches'). What the server sends back is bounded too
//!   ([`crate::client::BodyLimits::IDENTITY`], added by the manager's client factory).

use std::net::IpAddr;
use std::time::Duration;

use kube::config::Kubeconfig;

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// kube-apiserver answers every request but a watch within its own request timeout (60 s by
/// default); a server silent for longer is not answering.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const WATCH_TIMEOUT_SECS: u32 = 50;
/// Kairon Machines per page of a list: each may carry bootstrap data up to the manager's
/// limit, and a page must stay under the response limit of `BodyLimits::IDENTITY` (16 MiB).
pub(crate) const LIST_PAGE: u32 = 10;

/// Why a kubeconfig from an identity Secret is refused, if it is: anything that would make the
/// manager run a command or read a file of its own.
pub(crate) fn refusal(kubeconfig: &Kubeconfig) -> Option<&'static str> {
    for auth in kubeconfig.auth_infos.iter().filter_map(|a| a.auth_info.as_ref()) {
        if auth.exec.is_some() || auth.auth_provider.is_some() {
            return Some("exec plugins and auth providers are not allowed");
        }
        if auth.token_file.is_some() || auth.client_certificate.is_some() || auth.client_key.is_some() {
            return Some("file paths are not allowed; embed the data");
        }
    }
    let files = kubeconfig
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref())
        .any(|c| c.certificate_authority.is_some());
    files.then_some("file paths are not allowed; embed the data")
}

/// Why the client configuration of an identity is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ServerRefusal {
    /// Something the kubeconfig names that the manager does not do for tenants.
    Unsafe(&'static str),
    /// The server's host is not among `--identity-allowed-servers`.
    NotAllowed(String),
}

/// Checks the server `config` (from an identity's kubeconfig) points at, and bounds its
/// client's waits.
pub(crate) fn checked(config: kube::Config, allowed: &AllowedServers) -> Result<kube::Config, ServerRefusal> {
    if config.cluster_url.scheme_str() != Some("https") {
        return Err(ServerRefusal::Unsafe("the server must be https://"));
    }
    if config.accept_invalid_certs {
        return Err(ServerRefusal::Unsafe(
            "insecure-skip-tls-verify is not allowed; give certificate-authority-data",
        ));
    }
    if config.proxy_url.is_some() {
        return Err(ServerRefusal::Unsafe("proxy-url is not allowed"));
    }
    let host = config.cluster_url.host().unwrap_or_default();
    if !allowed.allows(host) {
        return Err(ServerRefusal::NotAllowed(crate::text::bounded(host, 253)));
    }
    Ok(bounded_waits(config))
}

/// `config` with [`CONNECT_TIMEOUT`] and [`READ_TIMEOUT`]: for every client of a Kairon API
/// built from a kubeconfig (identities, `--kairon-kubeconfig`), whose watches must then ask for
/// [`WATCH_TIMEOUT_SECS`].
pub(crate) fn bounded_waits(mut config: kube::Config) -> kube::Config {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.write_timeout = Some(READ_TIMEOUT);
    // The read timeout counts from when a request is sent, not from when its pooled
    // connection went idle.
    config.reset_reader_on_write = true;
    config
}

/// The Kairon API servers identities may name (`--identity-allowed-servers`): host names
/// (`kairon.example.com`), every name under a domain (`*.example.com`), IP addresses and
/// networks (`10.0.0.0/8`, `fd00::/8`). Empty: any server.
///
/// The host as the kubeconfig's `server` names it is compared, without a DNS lookup (whose
/// answer could change between the check and the connection): a network matches a server
/// named by an IP address, a name matches a server named by that name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AllowedServers {
    entries: Vec<Allowed>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Allowed {
    Host(String),
    /// `*.example.com`: names ending in `.example.com`.
    Under(String),
    Net(IpAddr, u8),
}

impl AllowedServers {
    /// Parses the flag's entries; empty entries are skipped.
    pub fn parse(entries: &[String]) -> Result<AllowedServers, String> {
        let entries = entries
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
            .map(parse_entry)
            .collect::<Result<_, _>>()?;
        Ok(AllowedServers { entries })
    }

    /// Whether a server whose host is `host` (as in a URL: an IPv6 address in brackets) may
    /// be used.
    pub(crate) fn allows(&self, host: &str) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip = host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        self.entries.iter().any(|e| match (e, ip) {
            (Allowed::Net(net, prefix), Some(ip)) => in_network(ip, *net, *prefix),
            (Allowed::Host(h), None) => *h == name,
            (Allowed::Under(domain), None) => name.strip_suffix(domain.as_str()).is_some_and(|sub| !sub.is_empty()),
            _ => false,
        })
    }
}

fn parse_entry(entry: &str) -> Result<Allowed, String> {
    let bad = |why: &str| format!("{entry:?}: {why}");
    if let Some((addr, prefix)) = entry.split_once('/') {
        let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| bad("not a prefix length"))?;
        return Ok(Allowed::Net(addr.to_canonical(), prefix));
    }
    if let Ok(ip) = entry.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        let ip = ip.to_canonical();
        return Ok(Allowed::Net(ip, if ip.is_ipv4() { 32 } else { 128 }));
    }
    let (under, name) = match entry.strip_prefix("*.") {
        Some(domain) => (true, domain),
        None => (false, entry),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(bad(
            "not a host name, *.domain, IP address or network (a port or a scheme is not part of it)",
        ));
    }
    Ok(if under {
        Allowed::Under(format!(".{name}"))
    } else {
        Allowed::Host(name)
    })
}

fn in_network(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfigs_that_run_commands_or_read_files_are_refused() {
        let kubeconfig = |user: &str, cluster: &str| {
            Kubeconfig::from_yaml(&format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://kairon:6443\n{cluster}\
                 users:\n- name: u\n  user:\n{user}contexts:\n- name: c\n  context: {{cluster: k, user: u}}\ncurrent-context: c\n"
            ))
            .unwrap()
        };
        let cases = [
            ("embedded token", "    token: abc\n", "", None),
            (
                "embedded certificate",
                "    client-certificate-data: YQ==\n    client-key-data: YQ==\n",
                "    certificate-authority-data: YQ==\n",
                None,
            ),
            (
                "exec plugin",
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n",
                "",
                Some("exec"),
            ),
            (
                "token file",
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "",
                Some("file paths"),
            ),
            (
                "certificate file",
                "    client-certificate: /etc/cert\n    client-key: /etc/key\n",
                "",
                Some("file paths"),
            ),
            (
                "CA file",
                "    token: abc\n",
                "    certificate-authority: /etc/ca.crt\n",
                Some("file paths"),
            ),
        ];
        for (name, user, cluster, want) in cases {
            let got = refusal(&kubeconfig(user, cluster));
            match want {
                None => assert_eq!(got, None, "{name}"),
                Some(w) => assert!(got.is_some_and(|g| g.contains(w)), "{name}: {got:?}"),
            }
        }
    }

    /// The client configuration a kubeconfig's current context gives.
    async fn config_of(cluster: &str) -> kube::Config {
        let kubeconfig = Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n{cluster}\
             users:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\ncurrent-context: c\n"
        ))
        .unwrap();
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn an_identity_may_name_only_verified_https_servers_the_operator_allows() {
        let allowed = AllowedServers::parse(&["kairon.example.com".into(), "10.1.0.0/16".into()]).unwrap();
        let any = AllowedServers::default();
        let cases: [(&str, &str, &AllowedServers, Result<(), &str>); 9] = [
            ("https", "    server: https://kairon:6443\n", &any, Ok(())),
            (
                "with a server name for the certificate",
                "    server: https://10.0.0.5:6443\n    tls-server-name: kairon.internal\n",
                &any,
                Ok(()),
            ),
            ("plain http", "    server: http://kairon:6443\n", &any, Err("https://")),
            (
                "no verification",
                "    server: https://kairon:6443\n    insecure-skip-tls-verify: true\n",
                &any,
                Err("insecure-skip-tls-verify"),
            ),
            (
                "through a proxy",
                "    server: https://kairon:6443\n    proxy-url: socks5://elsewhere:1080\n",
                &any,
                Err("proxy-url"),
            ),
            (
                "an allowed name",
                "    server: https://kairon.example.com:6443\n",
                &allowed,
                Ok(()),
            ),
            (
                "in an allowed network",
                "    server: https://10.1.2.3\n",
                &allowed,
                Ok(()),
            ),
            (
                "another server",
                "    server: https://10.2.0.1:6443\n",
                &allowed,
                Err("not allowed: 10.2.0.1"),
            ),
            (
                "a name that resolves anywhere",
                "    server: https://kairon.example.com.evil.test\n",
                &allowed,
                Err("not allowed: kairon.example.com.evil.test"),
            ),
        ];
        for (name, cluster, allowed, want) in cases {
            let got = checked(config_of(cluster).await, allowed);
            match (want, got) {
                (Ok(()), Ok(config)) => {
                    assert_eq!(config.read_timeout, Some(READ_TIMEOUT), "{name}");
                    assert_eq!(config.connect_timeout, Some(CONNECT_TIMEOUT), "{name}");
                }
                (Err(w), Err(ServerRefusal::Unsafe(why))) => assert!(why.contains(w), "{name}: {why}"),
                (Err(w), Err(ServerRefusal::NotAllowed(host))) => {
                    assert_eq!(format!("not allowed: {host}"), w, "{name}")
                }
                (want, got) => panic!("{name}: want {want:?}, got {:?}", got.map(|_| ())),
            }
        }
    }

    #[test]
    fn allowed_servers_match_names_domains_and_networks() {
        let allowed = AllowedServers::parse(&[
            "Kairon.Example.com".into(),
            "*.sites.example.org".into(),
            "192.168.10.0/24".into(),
            "fd00:10::/32".into(),
            "172.16.0.9".into(),
        ])
        .unwrap();
        let cases = [
            ("kairon.example.com", true),
            ("KAIRON.example.com.", true),
            ("other.example.com", false),
            ("a.sites.example.org", true),
            ("b.a.sites.example.org", true),
            ("sites.example.org", false),
            ("evilsites.example.org", false),
            ("192.168.10.77", true),
            ("192.168.11.1", false),
            ("[fd00:10::1]", true),
            ("[fd00:11::1]", false),
            ("[::ffff:192.168.10.5]", true),
            ("172.16.0.9", true),
            ("172.16.0.10", false),
            ("", false),
        ];
        for (host, want) in cases {
            assert_eq!(allowed.allows(host), want, "{host}");
        }
        assert!(AllowedServers::default().allows("anything"), "empty: any server");
        assert!(AllowedServers::parse(&["0.0.0.0/0".into()]).unwrap().allows("8.8.8.8"));
    }
}
