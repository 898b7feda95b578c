//! What the Kairon APIs of all identities together may make the manager hold. Each endpoint is
//! bounded on its own ([`crate::controller::endpoints::budget`]), but a tenant names as many identities as it
//! creates Secrets: forty, each just under its endpoint's budget, would be many times the
//! manager's memory limit — killed, restarted, the same endpoints opened again, a crash loop for
//! every tenant. So a namespace opens at most so many endpoints ([`EndpointCaps::refuses_another`]),
//! and every endpoint reports what it keeps to one [`Ledger`] ([`Claim::hold`]), which holds it
//! against a budget per namespace and one over all namespaces: the endpoint whose report would
//! go over either is cut off, as one over its own budget is, and what it held is released, as
//! it is when an endpoint stops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const MIB: usize = 1024 * 1024;

/// Endpoints open at once for one namespace, by default (`--identity-endpoints-per-namespace`).
pub const ENDPOINTS_PER_NAMESPACE: usize = 8;
/// Bytes (as kept) of the endpoints of one namespace together, by default
/// (`--identity-cache-bytes-per-namespace`): what one endpoint may keep
/// ([`crate::controller::endpoints::budget::MAX_BYTES`]), however many identities the namespace names; an
/// eighth of [`BYTES`].
///
/// Measured (`tests/e2e/e2e_hostile_endpoint.rs`, a debug build): a namespace whose 8 endpoints all
/// send just under their own budget at once costs the manager 18 MiB of resident memory at its
/// peak, over 34 MiB before: about 1.5 times what is kept, and 0.75 MiB per endpoint for the
/// answers being parsed and the allocator's slack. At 16 MiB it cost 28–31 MiB.
pub const BYTES_PER_NAMESPACE: usize = 8 * MIB;
/// Bytes (as kept) of all endpoints together, by default (`--identity-cache-bytes`).
///
/// The manager's shipped memory limit is 256 MiB (`config/manager/manager.yaml`, the chart's
/// `resources`). Its own state at the largest scale benchmarked peaks at 61 MiB (5000 machines,
/// `docs/benchmarks.md`); the endpoints' caches, at 1.5 times what they keep (as measured for
/// [`BYTES_PER_NAMESPACE`]), add at most 96 MiB: 61 + 96 = 157 MiB. That leaves 99 MiB, over a
/// third of the limit, for what is in flight and not kept — 0.75 MiB per endpoint streaming at
/// once, more while one is sent a big list page (the client bounds a page at 16 MiB, a watch
/// event at 4 MiB) — and for the endpoints open but keeping nothing (a client and a connection
/// each).
pub const BYTES: usize = 64 * MIB;

/// How many endpoints a namespace may open, and how much all of them may keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointCaps {
    /// Endpoints open at once for one namespace (`--identity-endpoints-per-namespace`).
    pub endpoints_per_namespace: usize,
    /// Bytes kept by the endpoints of one namespace together
    /// (`--identity-cache-bytes-per-namespace`).
    pub bytes_per_namespace: usize,
    /// Bytes kept by all endpoints together (`--identity-cache-bytes`).
    pub bytes: usize,
}

impl Default for EndpointCaps {
    fn default() -> Self {
        EndpointCaps {
            endpoints_per_namespace: ENDPOINTS_PER_NAMESPACE,
            bytes_per_namespace: BYTES_PER_NAMESPACE,
            bytes: BYTES,
        }
    }
}

impl EndpointCaps {
    /// Whether a namespace that has `open` endpoints may not open another.
    pub(crate) fn refuses_another(&self, open: usize) -> bool {
        open >= self.endpoints_per_namespace
    }

    /// The cap that holding `in_namespace` bytes for one namespace and `total` bytes in all goes
    /// over, if one is (the namespace's first: it is the tenant's own doing).
    fn over(&self, in_namespace: usize, total: usize) -> Option<Cap> {
        if in_namespace > self.bytes_per_namespace {
            Some(Cap::Namespace)
        } else if total > self.bytes {
            Some(Cap::All)
        } else {
            None
        }
    }

    /// Why the endpoint whose report went over `cap` of `namespace` is cut off: which cap, its
    /// value and the flag that sets it.
    fn why(&self, cap: Cap, namespace: &str) -> String {
        let (whose, value, flag) = match cap {
            Cap::Namespace => (
                format!("of namespace {namespace} together sent more than the manager holds for one namespace"),
                self.bytes_per_namespace,
                "--identity-cache-bytes-per-namespace",
            ),
            Cap::All => (
                "of all identities together sent more than the manager holds for them".to_string(),
                self.bytes,
                "--identity-cache-bytes",
            ),
        };
        format!(
            "the Kairon APIs {whose} ({}, {flag}={value}): this one is cut off, and its clusters \
             are not served until the identity changes",
            size(value)
        )
    }
}

/// A number of bytes as an operator reads it.
fn size(bytes: usize) -> String {
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// Which budget over all of an identity's endpoints was gone over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cap {
    Namespace,
    All,
}

/// What the endpoints keep, by namespace and in all, held against [`EndpointCaps`].
#[derive(Debug)]
pub(crate) struct Ledger {
    caps: EndpointCaps,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    by_namespace: HashMap<String, usize>,
    total: usize,
}

impl Ledger {
    pub(crate) fn new(caps: EndpointCaps) -> Arc<Ledger> {
        Arc::new(Ledger {
            caps,
            held: Mutex::default(),
        })
    }

    pub(crate) fn caps(&self) -> EndpointCaps {
        self.caps
    }

    /// What a new endpoint of `namespace` holds: nothing yet.
    pub(crate) fn claim(self: &Arc<Self>, namespace: &str) -> Claim {
        Claim {
            ledger: self.clone(),
            namespace: namespace.to_string(),
            bytes: 0,
        }
    }

    /// Bytes held for `namespace`, and in all.
    #[cfg(test)]
    fn held(&self, namespace: &str) -> (usize, usize) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        (held.by_namespace.get(namespace).copied().unwrap_or(0), held.total)
    }

    /// A claim of `namespace` goes from `from` bytes to `to`; one that grows over a cap is not
    /// let: it goes to nothing instead, and the cap is returned.
    fn change(&self, namespace: &str, from: usize, to: usize) -> Result<(), Cap> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let in_namespace = held.by_namespace.get(namespace).copied().unwrap_or(0) - from;
        let others = held.total - from;
        let refused = (to > from)
            .then(|| self.caps.over(in_namespace + to, others + to))
            .flatten();
        let to = if refused.is_some() { 0 } else { to };
        held.total = others + to;
        if in_namespace + to == 0 {
            held.by_namespace.remove(namespace);
        } else {
            held.by_namespace.insert(namespace.to_string(), in_namespace + to);
        }
        refused.map_or(Ok(()), Err)
    }
}

/// What one endpoint keeps, as held in the [`Ledger`]; released when dropped (the endpoint's
/// watch stopped).
#[derive(Debug)]
pub(crate) struct Claim {
    ledger: Arc<Ledger>,
    namespace: String,
    bytes: usize,
}

impl Claim {
    /// The endpoint keeps `bytes` now. `Err` with why (which cap, its value, its flag) when that
    /// would take its namespace's endpoints, or all endpoints, over their budget: then it holds
    /// nothing, and is to be cut off.
    pub(crate) fn hold(&mut self, bytes: usize) -> Result<(), String> {
        let result = self.ledger.change(&self.namespace, self.bytes, bytes);
        self.bytes = if result.is_ok() { bytes } else { 0 };
        result.map_err(|cap| self.ledger.caps.why(cap, &self.namespace))
    }

    /// The endpoint keeps nothing any more (it is cut off).
    pub(crate) fn release(&mut self) {
        let _ = self.hold(0);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: EndpointCaps = EndpointCaps {
        endpoints_per_namespace: 3,
        bytes_per_namespace: 100,
        bytes: 250,
    };

    #[test]
    fn a_namespace_opens_endpoints_up_to_its_cap() {
        for (open, refused) in [(0, false), (2, false), (3, true), (4, true)] {
            assert_eq!(CAPS.refuses_another(open), refused, "{open} open");
        }
    }

    #[test]
    fn the_endpoint_that_goes_over_a_cap_holds_nothing_and_is_told_which() {
        // (case, reports in order: (endpoint, namespace, bytes kept, the flag of the cap gone
        // over, if one is), then what is held for namespace a and in all)
        type Report = (usize, &'static str, usize, Option<&'static str>);
        let cases: [(&str, &[Report], (usize, usize)); 9] = [
            (
                "within both",
                &[(0, "a", 60), (1, "a", 40), (2, "b", 100)].map(ok),
                (100, 200),
            ),
            (
                "the namespace's: the one that grew is refused, the others kept",
                &[
                    (0, "a", 60, None),
                    (1, "a", 41, Some("--identity-cache-bytes-per-namespace=100")),
                ],
                (60, 60),
            ),
            (
                "growing over it later",
                &[
                    (0, "a", 50, None),
                    (1, "a", 50, None),
                    (0, "a", 51, Some("--identity-cache-bytes-per-namespace=100")),
                ],
                (50, 50),
            ),
            (
                "all namespaces': the one that grew is refused, whichever namespace",
                &[
                    (0, "b", 100, None),
                    (1, "c", 100, None),
                    (2, "a", 60, Some("--identity-cache-bytes=250")),
                ],
                (0, 200),
            ),
            (
                "over both: the namespace's is named",
                &[
                    (0, "b", 100, None),
                    (1, "c", 100, None),
                    (2, "a", 101, Some("--identity-cache-bytes-per-namespace=100")),
                ],
                (0, 200),
            ),
            (
                "shrinking is always let",
                &[(0, "a", 100), (0, "a", 30), (1, "a", 70)].map(ok),
                (100, 100),
            ),
            (
                "a list under way and the cache it replaces, held together",
                &[(0, "a", 40), (0, "a", 80), (0, "a", 40)].map(ok),
                (40, 40),
            ),
            (
                "one refused frees room for the others",
                &[
                    (0, "a", 90, None),
                    (1, "a", 20, Some("--identity-cache-bytes-per-namespace")),
                    (2, "a", 10, None),
                ],
                (100, 100),
            ),
            (
                "exactly at the caps is within them",
                &[(0, "a", 100), (1, "b", 100), (2, "c", 50)].map(ok),
                (100, 250),
            ),
        ];
        fn ok((i, ns, bytes): (usize, &'static str, usize)) -> Report {
            (i, ns, bytes, None)
        }
        for (case, reports, held) in cases {
            let ledger = Ledger::new(CAPS);
            let mut claims: Vec<Option<Claim>> = (0..3).map(|_| None).collect();
            for (step, &(i, ns, bytes, refused)) in reports.iter().enumerate() {
                let claim = claims[i].get_or_insert_with(|| ledger.claim(ns));
                let result = claim.hold(bytes);
                match (result, refused) {
                    (Ok(()), None) => {}
                    (Err(why), Some(flag)) => {
                        assert!(why.contains(flag) && why.contains("cut off"), "{case}, {step}: {why}");
                        assert_eq!(claim.bytes, 0, "{case}, {step}: a refused claim holds nothing");
                    }
                    (got, _) => panic!("{case}, report {step}: {got:?}"),
                }
            }
            assert_eq!(ledger.held("a"), held, "{case}");
            drop(claims);
            assert_eq!(ledger.held("a"), (0, 0), "{case}: all released with the endpoints");
            assert!(ledger.held.lock().unwrap().by_namespace.is_empty(), "{case}");
        }
    }

    #[test]
    fn a_released_claim_frees_its_namespace_and_all() {
        let ledger = Ledger::new(CAPS);
        let mut a = ledger.claim("a");
        a.hold(100).unwrap();
        let mut b = ledger.claim("a");
        assert!(b.hold(1).is_err());
        a.release();
        b.hold(100).unwrap();
        assert_eq!(ledger.held("a"), (100, 100));
        drop(b);
        assert_eq!(ledger.held("a"), (0, 0));
    }

    #[test]
    fn why_names_the_cap_its_value_and_its_flag_and_nothing_else() {
        let caps = EndpointCaps::default();
        assert_eq!(
            caps.why(Cap::Namespace, "team-a"),
            "the Kairon APIs of namespace team-a together sent more than the manager holds for one \
             namespace (8 MiB, --identity-cache-bytes-per-namespace=8388608): this one is cut off, \
             and its clusters are not served until the identity changes"
        );
        let odd = EndpointCaps { bytes: 1000, ..caps };
        assert_eq!(
            odd.why(Cap::All, "team-a"),
            "the Kairon APIs of all identities together sent more than the manager holds for them \
             (1000 bytes, --identity-cache-bytes=1000): this one is cut off, and its clusters are \
             not served until the identity changes"
        );
    }
}
