//! Parsers for the command-line values that are more than a number: Go-style durations,
//! fractions and the `--hosts` spec.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::placement::Host;

/// Parses a Go-style duration (`time.ParseDuration`): `0`, `500ms`, `2s`, `1m30s`, `1.5h`.
/// The tests and the demo pass the same strings to Go tools and to us.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return Err(format!("invalid duration {s:?}: expected a number"));
        }
        let value: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("invalid duration {s:?}: bad number"))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("invalid duration {s:?}: missing unit")),
            unit => return Err(format!("invalid duration {s:?}: unknown unit {unit:?}")),
        };
        total += value * seconds_per_unit;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Parses a probability or a relative spread: a number in `[0, 1]`.
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    let value: f64 = s.trim().parse().map_err(|_| format!("invalid fraction {s:?}"))?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("fraction {s:?} must be between 0 and 1"))
    }
}

/// Parses `--hosts`: comma-separated `name[:key=value[;key=value…]]`. A comma after a host's
/// first label that is followed by `key=value` (no `:`) continues that host's labels, so
/// `h1:zone=a,rack=r1,h2` gives h1 two labels and h2 none.
pub fn parse_hosts(s: &str) -> Result<Vec<Host>, String> {
    let mut hosts: Vec<Host> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, labels) = match item.split_once(':') {
            Some((name, labels)) => (Some(name.trim()), labels),
            None if item.contains('=') => (None, item),
            None => (Some(item), ""),
        };
        let host = match name {
            Some(name) => {
                if name.is_empty() {
                    return Err(format!("host without a name in {item:?}"));
                }
                if hosts.iter().any(|h| h.name == name) {
                    return Err(format!("host {name:?} listed twice"));
                }
                hosts.push(Host {
                    name: name.to_string(),
                    labels: BTreeMap::new(),
                });
                hosts.last_mut()
            }
            None => hosts.last_mut(),
        }
        .ok_or_else(|| format!("label {item:?} before any host name"))?;
        for label in labels.split(';').map(str::trim).filter(|l| !l.is_empty()) {
            let (key, value) = label
                .split_once('=')
                .ok_or_else(|| format!("label {label:?} of host {:?} is not key=value", host.name))?;
            host.labels.insert(key.trim().to_string(), value.trim().to_string());
        }
    }
    if hosts.is_empty() {
        return Err("no hosts given".into());
    }
    Ok(hosts)
}

/// `--hosts` as one value (clap would read an `Option<Vec<_>>` as a repeated flag).
#[derive(Clone, Debug)]
pub struct HostList(pub Vec<Host>);

pub fn parse_host_list(s: &str) -> Result<HostList, String> {
    parse_hosts(s).map(HostList)
}

/// Three unlabelled hosts, `kairon-node-1..3`.
pub fn default_hosts() -> Vec<Host> {
    (1..=3)
        .map(|i| Host {
            name: format!("kairon-node-{i}"),
            labels: BTreeMap::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_durations() {
        let cases = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("500ms", Duration::from_millis(500)),
            ("2s", Duration::from_secs(2)),
            ("1m", Duration::from_secs(60)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5s", Duration::from_millis(1500)),
            ("1h", Duration::from_secs(3600)),
            ("250us", Duration::from_micros(250)),
        ];
        for (input, want) in cases {
            let got = parse_duration(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert!(
                got.abs_diff(want) < Duration::from_nanos(10),
                "{input}: got {got:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn rejects_durations_without_units_or_with_unknown_ones() {
        for input in ["", "5", "s", "5x", "-1s", "1s2"] {
            assert!(parse_duration(input).is_err(), "{input:?} should be rejected");
        }
    }

    #[test]
    fn fractions_must_be_between_zero_and_one() {
        assert_eq!(parse_fraction("0.2"), Ok(0.2));
        assert_eq!(parse_fraction("0"), Ok(0.0));
        assert_eq!(parse_fraction("1"), Ok(1.0));
        assert!(parse_fraction("1.5").is_err());
        assert!(parse_fraction("-0.1").is_err());
        assert!(parse_fraction("x").is_err());
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn parses_hosts_with_and_without_labels() {
        let hosts = parse_hosts(
            "kairon-node-1:topology.kairon.zyvor.dev/zone=zone-a,kairon-node-2:topology.kairon.zyvor.dev/zone=zone-b,plain",
        )
        .unwrap();
        assert_eq!(
            hosts,
            vec![
                Host {
                    name: "kairon-node-1".into(),
                    labels: labels(&[("topology.kairon.zyvor.dev/zone", "zone-a")])
                },
                Host {
                    name: "kairon-node-2".into(),
                    labels: labels(&[("topology.kairon.zyvor.dev/zone", "zone-b")])
                },
                Host {
                    name: "plain".into(),
                    labels: BTreeMap::new()
                },
            ]
        );
    }

    #[test]
    fn several_labels_per_host_by_semicolon_or_comma_continuation() {
        let hosts = parse_hosts("h1:zone=a;rack=r1,h2:zone=b,rack=r2").unwrap();
        assert_eq!(hosts[0].labels, labels(&[("zone", "a"), ("rack", "r1")]));
        assert_eq!(hosts[1].labels, labels(&[("zone", "b"), ("rack", "r2")]));
    }

    #[test]
    fn rejects_bad_host_specs() {
        for input in ["", "zone=a,h1", "h1,h1", ":zone=a", "h1:zone"] {
            assert!(parse_hosts(input).is_err(), "{input:?} should be rejected");
        }
    }
}
