//! The management API server's audit log (JSON lines, written when [`EnvOptions::audit_policy`]
//! is set): which client made which request. Requests are attributed by their User-Agent;
//! the manager's is `capkr-manager/<version> (<identity>)`.
//!
//! [`AuditLog`] reads the log incrementally, so a long run can be followed without re-reading
//! what was already seen, and [`RequestCounts`] tallies requests by verb and resource.
//!
//! [`EnvOptions::audit_policy`]: crate::EnvOptions::audit_policy

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::env::Env;

/// Every request at Metadata level, without the `RequestReceived` stage: one line per request
/// (two for watches), half the size of [`crate::AUDIT_POLICY_METADATA`]'s log.
pub const AUDIT_POLICY_METADATA_RESPONSES: &str =
    "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

/// The start of the manager's User-Agent.
pub const MANAGER_USER_AGENT_PREFIX: &str = "capkr-manager/";

/// One line of the audit log, the fields the tests read.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    #[serde(rename = "auditID", default)]
    pub audit_id: String,
    /// `RequestReceived`, `ResponseStarted` (long-running requests only), `ResponseComplete`, `Panic`.
    pub stage: String,
    pub verb: String,
    #[serde(rename = "requestURI", default)]
    pub request_uri: String,
    #[serde(default)]
    pub user_agent: String,
    #[serde(default)]
    pub object_ref: Option<AuditObjectRef>,
    #[serde(default)]
    pub response_status: Option<AuditResponseStatus>,
    #[serde(default)]
    pub stage_timestamp: Option<String>,
    /// When the request arrived (RFC 3339, microseconds), the same on every stage's line.
    #[serde(default)]
    pub request_received_timestamp: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditObjectRef {
    #[serde(default)]
    pub resource: Option<String>,
    #[serde(default)]
    pub subresource: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub api_group: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct AuditResponseStatus {
    #[serde(default)]
    pub code: Option<u16>,
}

impl AuditEvent {
    /// Whether the request changes something: create, update, patch, delete, deletecollection.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// Leader-election traffic (Leases), which the write budgets leave out.
    pub fn is_lease(&self) -> bool {
        self.resource().as_deref() == Some("leases") || self.request_uri.contains("/leases/")
    }

    /// Whether this line stands for one request, so that counting such lines counts requests:
    /// the `ResponseStarted` line of a watch (its `ResponseComplete` comes when it ends, maybe
    /// never), the `ResponseComplete` line of anything else.
    pub fn counts_request(&self) -> bool {
        match self.stage.as_str() {
            "ResponseStarted" => true,
            "ResponseComplete" => self.verb != "watch",
            _ => false,
        }
    }

    /// Whether the request came from a client whose User-Agent starts with `prefix` and, if
    /// `identity` is given, ends with `(<identity>)`.
    pub fn from_agent(&self, prefix: &str, identity: Option<&str>) -> bool {
        self.user_agent.starts_with(prefix)
            && identity.is_none_or(|i| {
                self.user_agent
                    .strip_suffix(')')
                    .is_some_and(|u| u.ends_with(&format!("({i}")))
            })
    }

    /// Whether the manager (of `identity`, if given) made the request.
    pub fn from_manager(&self, identity: Option<&str>) -> bool {
        self.from_agent(MANAGER_USER_AGENT_PREFIX, identity)
    }

    /// The resource (`kaironmachines`), `None` for non-resource requests such as `/version`.
    pub fn resource(&self) -> Option<String> {
        self.object_ref.as_ref()?.resource.clone()
    }

    /// `resource[.group][/subresource]` as kubectl names them (`secrets`,
    /// `machines.kairon.zyvor.dev`, `kaironmachines.infrastructure.cluster.x-k8s.io/status`);
    /// the path for non-resource requests.
    pub fn resource_path(&self) -> String {
        let Some(r) = self.object_ref.as_ref().filter(|r| r.resource.is_some()) else {
            return self.request_uri.split('?').next().unwrap_or_default().to_string();
        };
        let mut out = r.resource.clone().unwrap_or_default();
        if let Some(group) = r.api_group.as_deref().filter(|g| !g.is_empty()) {
            out.push('.');
            out.push_str(group);
        }
        if let Some(sub) = r.subresource.as_deref().filter(|s| !s.is_empty()) {
            out.push('/');
            out.push_str(sub);
        }
        out
    }

    /// `verb requestURI`, for messages.
    pub fn describe(&self) -> String {
        format!("{} {}", self.verb, self.request_uri)
    }

    /// When the request arrived.
    pub fn received_time(&self) -> Option<Timestamp> {
        self.request_received_timestamp.as_deref()?.parse().ok()
    }

    /// When the API server wrote this stage.
    pub fn stage_time(&self) -> Option<Timestamp> {
        self.stage_timestamp.as_deref()?.parse().ok()
    }

    /// The HTTP status code of the response, if it got one.
    pub fn code(&self) -> Option<u16> {
        self.response_status.as_ref()?.code
    }
}

/// A reader of the audit log that remembers where it stopped.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    offset: u64,
    /// An incomplete last line, kept until the API server finishes it.
    partial: Vec<u8>,
}

impl AuditLog {
    /// Reads `path` from its beginning.
    pub fn open(path: impl Into<PathBuf>) -> AuditLog {
        AuditLog {
            path: path.into(),
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// Reads `path` from byte `offset` on (a line boundary, e.g. an earlier file length).
    pub fn at(path: impl Into<PathBuf>, offset: u64) -> AuditLog {
        AuditLog {
            path: path.into(),
            offset,
            partial: Vec::new(),
        }
    }

    /// Reads `path` from its current end: only what is written from now on.
    pub fn from_end(path: impl Into<PathBuf>) -> Result<AuditLog> {
        let path = path.into();
        let offset = std::fs::metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        Ok(AuditLog {
            path,
            offset,
            partial: Vec::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How far the log has been read (bytes).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The events written since the last call (complete lines only). Lines that do not parse
    /// are skipped.
    pub fn read_new(&mut self) -> Result<Vec<AuditEvent>> {
        let mut f = std::fs::File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))?;
        f.seek(SeekFrom::Start(self.offset))
            .with_context(|| format!("seeking in {}", self.path.display()))?;
        let mut buf = std::mem::take(&mut self.partial);
        let read = f
            .read_to_end(&mut buf)
            .with_context(|| format!("reading {}", self.path.display()))?;
        self.offset += read as u64;
        let complete = match buf.iter().rposition(|b| *b == b'\n') {
            Some(i) => i + 1,
            None => 0,
        };
        self.partial = buf.split_off(complete);
        Ok(buf
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice::<AuditEvent>(l).ok())
            .collect())
    }
}

impl Env {
    /// A reader of the audit log from its beginning; an error unless the environment was
    /// started with an audit policy.
    pub fn audit_log(&self) -> Result<AuditLog> {
        let path = self
            .audit_log_path()
            .ok_or_else(|| anyhow!("the environment {:?} has no audit policy", self.name()))?;
        Ok(AuditLog::open(path))
    }
}

/// The manager's writes among `events` (of one replica `identity` if given), Lease writes left
/// out, as `verb requestURI`.
pub fn manager_writes(events: &[AuditEvent], identity: Option<&str>) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.from_manager(identity) && e.counts_request() && e.is_write() && !e.is_lease())
        .map(AuditEvent::describe)
        .collect()
}

/// Requests tallied by verb and by `verb resource[/subresource]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub total: u64,
    pub reads: u64,
    pub writes: u64,
    pub by_verb: BTreeMap<String, u64>,
    /// Keyed `verb resource` (see [`AuditEvent::resource_path`]), or `verb /path` for
    /// non-resource requests.
    pub by_resource: BTreeMap<String, u64>,
    /// Requests answered with a status of 400 or more, keyed `verb resource code`.
    #[serde(default)]
    pub failed: BTreeMap<String, u64>,
}

impl RequestCounts {
    /// Adds `e` if it stands for a request (see [`AuditEvent::counts_request`]).
    pub fn add(&mut self, e: &AuditEvent) {
        if !e.counts_request() {
            return;
        }
        self.total += 1;
        if e.is_write() {
            self.writes += 1;
        } else {
            self.reads += 1;
        }
        *self.by_verb.entry(e.verb.clone()).or_default() += 1;
        let key = format!("{} {}", e.verb, e.resource_path());
        if let Some(code) = e.code().filter(|c| *c >= 400) {
            *self.failed.entry(format!("{key} {code}")).or_default() += 1;
        }
        *self.by_resource.entry(key).or_default() += 1;
    }

    /// Counts the requests among `events` that `keep` selects.
    pub fn of<'a>(events: impl IntoIterator<Item = &'a AuditEvent>, keep: impl Fn(&AuditEvent) -> bool) -> Self {
        let mut c = RequestCounts::default();
        for e in events {
            if keep(e) {
                c.add(e);
            }
        }
        c
    }

    pub fn merge(&mut self, other: &RequestCounts) {
        self.total += other.total;
        self.reads += other.reads;
        self.writes += other.writes;
        for (k, v) in &other.by_verb {
            *self.by_verb.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.by_resource {
            *self.by_resource.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.failed {
            *self.failed.entry(k.clone()).or_default() += v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(stage: &str, verb: &str, uri: &str, ua: &str, resource: Option<(&str, Option<&str>)>) -> String {
        let group = if r_is_core(resource) { "" } else { "x" };
        let object_ref = match resource {
            Some((r, Some(s))) => format!(
                r#","objectRef":{{"resource":"{r}","subresource":"{s}","namespace":"ns","apiGroup":"{group}"}}"#
            ),
            Some((r, None)) => format!(r#","objectRef":{{"resource":"{r}","namespace":"ns","apiGroup":"{group}"}}"#),
            None => String::new(),
        };
        format!(
            r#"{{"kind":"Event","auditID":"x","stage":"{stage}","verb":"{verb}","requestURI":"{uri}","userAgent":"{ua}"{object_ref},"responseStatus":{{"code":200}},"stageTimestamp":"2026-01-02T03:04:05.123456Z"}}"#
        )
    }

    const MGR: &str = "capkr-manager/0.1.0 (bench)";

    fn r_is_core(resource: Option<(&str, Option<&str>)>) -> bool {
        matches!(resource, Some(("secrets", _)))
    }

    #[test]
    fn requests_are_counted_once_and_split_into_reads_and_writes() {
        let events: Vec<AuditEvent> = [
            line(
                "ResponseComplete",
                "patch",
                "/apis/x/kaironmachines/a/status",
                MGR,
                Some(("kaironmachines", Some("status"))),
            ),
            line(
                "ResponseComplete",
                "get",
                "/api/v1/namespaces/ns/secrets/s",
                MGR,
                Some(("secrets", None)),
            ),
            line(
                "ResponseStarted",
                "watch",
                "/apis/x/kaironmachines?watch=1",
                MGR,
                Some(("kaironmachines", None)),
            ),
            line(
                "ResponseComplete",
                "watch",
                "/apis/x/kaironmachines?watch=1",
                MGR,
                Some(("kaironmachines", None)),
            ),
            line(
                "RequestReceived",
                "create",
                "/apis/x/machines",
                MGR,
                Some(("machines", None)),
            ),
            line(
                "ResponseComplete",
                "update",
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                MGR,
                Some(("leases", None)),
            ),
            line(
                "ResponseComplete",
                "create",
                "/apis/x/machines",
                "kairon-sim/0.1",
                Some(("machines", None)),
            ),
            line("ResponseComplete", "get", "/version", MGR, None),
            line(
                "ResponseComplete",
                "patch",
                "/apis/x/kaironmachines/b",
                MGR,
                Some(("kaironmachines", None)),
            )
            .replace(r#""code":200"#, r#""code":409"#),
        ]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
        let c = RequestCounts::of(&events, |e| e.from_manager(Some("bench")) && !e.is_lease());
        assert_eq!((c.total, c.reads, c.writes), (5, 3, 2));
        assert_eq!(c.failed.len(), 1);
        assert_eq!(c.failed["patch kaironmachines.x 409"], 1);
        assert_eq!(c.by_verb["watch"], 1);
        assert_eq!(c.by_resource["patch kaironmachines.x/status"], 1);
        assert_eq!(c.by_resource["get secrets"], 1);
        assert_eq!(c.by_resource["get /version"], 1);
        assert_eq!(
            manager_writes(&events, None),
            [
                "patch /apis/x/kaironmachines/a/status",
                "patch /apis/x/kaironmachines/b"
            ]
        );
        assert!(manager_writes(&events, Some("other")).is_empty());
        assert_eq!(events[0].code(), Some(200));
        assert!(events[0].stage_time().is_some());
    }

    #[test]
    fn the_log_is_read_incrementally_and_partial_lines_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let first = line("ResponseComplete", "get", "/a", MGR, None);
        let second = line("ResponseComplete", "get", "/b", MGR, None);
        std::fs::write(&path, format!("{first}\n{}", &second[..10])).unwrap();
        let mut log = AuditLog::open(&path);
        assert_eq!(log.read_new().unwrap().len(), 1);
        assert!(log.read_new().unwrap().is_empty());
        std::fs::write(&path, format!("{first}\n{second}\n")).unwrap();
        let got = log.read_new().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].request_uri, "/b");
        let mut tail = AuditLog::from_end(&path).unwrap();
        assert!(tail.read_new().unwrap().is_empty());
    }
}
