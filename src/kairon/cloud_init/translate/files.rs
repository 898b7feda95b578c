//! `write_files` as Kairon can write them.
//!
//! Kairon's `writeFiles` write text files as root, before the commands; cloud-init's
//! `write_files` also decode content, set owners, append, and defer files to the final stage.
//! What Kairon cannot do itself becomes a command at the head of `runCmd`, which is faithful
//! because cloud-init writes every file (its `write_files` module, and `write_files_deferred`
//! later) before it runs `runcmd` (the last of its final-stage scripts):
//!
//! - `owner` other than root: `chown` of the written file;
//! - `append: true`, `defer: true`, content that is not UTF-8 text, and any entry for a path
//!   one of those already wrote ("staged" entries): the content goes to a root-only file under
//!   [`STAGING_DIR`], and a command writes it to the path (`cat`, or `base64 -d` for binary
//!   content; `>>` to append), sets mode and owner as cloud-init would (which for a staged
//!   entry without `owner` is `root:root`), and removes the staged copy.
//!
//! Operations keep cloud-init's order: first the entries without `defer`, in order, then the
//! deferred ones. A path's direct writes all precede its staged ones (once a path is staged,
//! later entries for it are too), so Kairon writing the direct entries first changes nothing;
//! of a path's direct writes only the last one's owner matters, and its `chown` comes before
//! the path's staged operations. Deferred entries are staged rather than written directly:
//! cloud-init writes them after installing packages and creating users, and so does the head
//! of `runcmd` (FluxVM's `packages` install before it).
//!
//! What differs is when, not what: staged entries and owners are in place from `runcmd` on,
//! not from cloud-init's init stage (a service started in between sees root's file or none;
//! CABPK's own files and kubeadm come after either way); a `chown` to a user the cloud-config
//! creates succeeds where cloud-init's own, run before users exist, would fail; and
//! cloud-init 23+ also gives the parent directories it creates for a file the file's owner,
//! where here they stay root's.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::decode::{self, DecodeError};
use super::{TranslateError, field_name, is_line_safe, is_true, shell_quote};
use crate::kairon::cloud_init::CloudInitFile;

/// Where staged content is put for the commands that write it. Root-only, under `/run` (a
/// tmpfs: gone at the next boot; first-boot commands never run again).
pub const STAGING_DIR: &str = "/run/cluster-api-provider-kairon";

/// What the `write_files` of a cloud-config become.
#[derive(Default)]
pub(super) struct Files {
    /// Kairon `writeFiles`: the direct entries in order, then the staged copies.
    pub(super) write_files: Vec<CloudInitFile>,
    /// Commands that must run before any of the cloud-config's own.
    pub(super) commands: Vec<String>,
}

struct Entry {
    path: String,
    content: Vec<u8>,
    /// `None`: cloud-init's default 0644.
    mode: Option<u32>,
    owner: Owner,
    append: bool,
    defer: bool,
}

/// `owner` as cloud-init splits it (`user:group`; empty, `-1` or `none` leave one unchanged).
#[derive(Clone, PartialEq, Eq)]
struct Owner {
    user: Option<String>,
    group: Option<String>,
}

impl Owner {
    fn parse(text: &str) -> Owner {
        let keep = |s: &str| {
            let s = s.trim();
            (!s.is_empty() && s != "-1" && !s.eq_ignore_ascii_case("none")).then(|| s.to_string())
        };
        let (user, group) = text.split_once(':').unwrap_or((text, ""));
        Owner {
            user: keep(user),
            group: keep(group),
        }
    }

    /// What Kairon's writes give every file (cloud-init's default owner).
    fn is_root(&self) -> bool {
        [&self.user, &self.group]
            .iter()
            .all(|part| part.as_deref().is_none_or(|p| p == "root"))
    }

    /// `chown`'s argument, if anything is to change.
    fn spec(&self) -> Option<String> {
        match (&self.user, &self.group) {
            (None, None) => None,
            (Some(u), None) => Some(u.clone()),
            (None, Some(g)) => Some(format!(":{g}")),
            (Some(u), Some(g)) => Some(format!("{u}:{g}")),
        }
    }
}

/// Plans the `write_files` of a cloud-config; `budget` bounds the total decoded content.
pub(super) fn plan(value: Option<&Value>, budget: usize) -> Result<Files, TranslateError> {
    let list = match value {
        None | Some(Value::Null) => return Ok(Files::default()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(invalid("write_files", "is not a list")),
    };
    let mut used = 0;
    let mut entries = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let Value::Object(fields) = item else {
            return Err(invalid("write_files", "has an entry that is not a mapping"));
        };
        entries.push(entry(i + 1, fields, budget, &mut used)?);
    }
    // cloud-init's order: the entries without `defer` (init stage), then the deferred ones
    // (final stage).
    let (now, deferred): (Vec<Entry>, Vec<Entry>) = entries.into_iter().partition(|e| !e.defer);
    let ops: Vec<Entry> = now.into_iter().chain(deferred).collect();
    let mut staged_paths = HashSet::new();
    let staged: Vec<bool> = ops
        .iter()
        .map(|e| {
            let staged =
                e.append || e.defer || staged_paths.contains(&e.path) || std::str::from_utf8(&e.content).is_err();
            if staged {
                staged_paths.insert(e.path.clone());
            }
            staged
        })
        .collect();

    // The last direct write of each path (the one whose owner counts), found in one pass:
    // the entries are the tenant's, and may be many.
    let last_direct_write: HashMap<&str, usize> = ops
        .iter()
        .zip(&staged)
        .enumerate()
        .filter(|(_, (_, s))| !**s)
        .map(|(i, (e, _))| (e.path.as_str(), i))
        .collect();
    let mut files = Files::default();
    let mut staged_copies = Vec::new();
    for (i, (e, &is_staged)) in ops.iter().zip(&staged).enumerate() {
        if is_staged {
            let stage = format!("{STAGING_DIR}/files/{}", staged_copies.len() + 1);
            let (content, binary) = match String::from_utf8(e.content.clone()) {
                Ok(text) => (text, false),
                Err(_) => (base64_text(&e.content), true),
            };
            files.commands.push(staged_write(&stage, e, binary));
            staged_copies.push(CloudInitFile {
                path: stage,
                content,
                permissions: "0600".into(),
            });
            continue;
        }
        files.write_files.push(CloudInitFile {
            path: e.path.clone(),
            content: String::from_utf8(e.content.clone()).unwrap_or_default(),
            permissions: e.mode.map(mode_text).unwrap_or_default(),
        });
        let last_direct = last_direct_write.get(e.path.as_str()) == Some(&i);
        if last_direct
            && !e.owner.is_root()
            && let Some(spec) = e.owner.spec()
        {
            files
                .commands
                .push(format!("chown {} {}", shell_quote(&spec), shell_quote(&e.path)));
        }
    }
    files.write_files.extend(staged_copies);
    Ok(files)
}

fn entry(index: usize, fields: &Map<String, Value>, budget: usize, used: &mut usize) -> Result<Entry, TranslateError> {
    let path = match fields.get("path") {
        None | Some(Value::Null) => return Err(TranslateError::MissingPath { index }),
        Some(Value::String(p)) if p.is_empty() => return Err(TranslateError::MissingPath { index }),
        Some(Value::String(p)) => p,
        Some(_) => return Err(invalid("write_files", "has a path that is not a string")),
    };
    if !is_line_safe(path) {
        return Err(TranslateError::InvalidFile {
            path: crate::text::bounded(path, 256),
            reason: "the path has a line break or a control character",
        });
    }
    let path = absolute(path);
    let bad = |reason: &'static str| TranslateError::InvalidFile {
        path: path.clone(),
        reason,
    };
    if path == STAGING_DIR || path.starts_with(&format!("{STAGING_DIR}/")) {
        return Err(bad("the path is reserved for the provider's staged files"));
    }
    for field in fields.keys() {
        if !["path", "content", "encoding", "owner", "permissions", "append", "defer"].contains(&field.as_str()) {
            return Err(TranslateError::UnsupportedFileField {
                path,
                field: field_name(field),
            });
        }
    }
    let text = match fields.get("content") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(_) => return Err(bad("content is not a string")),
    };
    let encoding = match fields.get("encoding") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_ascii_lowercase(),
        Some(_) => return Err(bad("encoding is not a string")),
    };
    let remaining = budget.saturating_sub(*used);
    let too_large = || TranslateError::TooLarge {
        path: path.clone(),
        limit: budget,
    };
    let decoded = |result: Result<Vec<u8>, DecodeError>| {
        result.map_err(|e| match e {
            DecodeError::TooLarge => too_large(),
            DecodeError::NotAscii => bad("base64 content has characters outside ASCII"),
            DecodeError::Base64 => bad("base64 content is incomplete (padding)"),
            DecodeError::Gzip => bad("gzip content is not a valid gzip stream"),
        })
    };
    // cloud-init's encodings (cc_write_files canonicalize_extraction); gzip of a YAML string
    // is gzip of its UTF-8 bytes.
    let content = match encoding.as_str() {
        "" | "text/plain" => text.as_bytes().to_vec(),
        "b64" | "base64" => decoded(decode::base64(text))?,
        "gz" | "gzip" => decoded(decode::gunzip(text.as_bytes(), remaining))?,
        "gz+base64" | "gzip+base64" | "gz+b64" | "gzip+b64" => {
            decoded(decode::base64(text).and_then(|b| decode::gunzip(&b, remaining)))?
        }
        // cloud-init would write the encoded text as it is, which no one means.
        _ => return Err(bad("encoding is none of cloud-init's (b64, gz, gz+b64, text/plain)")),
    };
    if content.len() > remaining {
        return Err(too_large());
    }
    *used += content.len();
    let owner = match fields.get("owner") {
        None | Some(Value::Null) => Owner {
            user: Some("root".into()),
            group: Some("root".into()),
        },
        Some(Value::String(s)) if is_line_safe(s) => Owner::parse(s),
        Some(Value::String(_)) => return Err(bad("owner has a line break or a control character")),
        Some(_) => return Err(bad("owner is not a string")),
    };
    let mode = match fields.get("permissions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(octal_mode(s).ok_or_else(|| bad("permissions is not an octal mode"))?),
        // YAML 1.1 (cloud-init's) and 1.2 (ours) read an unquoted 0640 differently.
        Some(_) => return Err(bad("permissions is not a quoted octal string")),
    };
    let flag = |name: &str| fields.get(name).is_some_and(is_true);
    Ok(Entry {
        path,
        content,
        mode,
        owner,
        append: flag("append"),
        defer: flag("defer"),
    })
}

fn invalid(key: &str, reason: &'static str) -> TranslateError {
    TranslateError::InvalidKey {
        key: key.to_string(),
        reason,
    }
}

/// The command writing a staged entry to its path as cloud-init's `write_file` would: parent
/// directories, content (truncating or appending), mode, owner; then the staged copy goes
/// (after `;`, so that it goes even when writing failed).
fn staged_write(stage: &str, e: &Entry, binary: bool) -> String {
    let parent = match e.path.rfind('/') {
        Some(0) | None => "/".to_string(),
        Some(i) => e.path[..i].to_string(),
    };
    let (q_stage, q_path) = (shell_quote(stage), shell_quote(&e.path));
    let reader = if binary { "base64 -d" } else { "cat" };
    let redirect = if e.append { ">>" } else { ">" };
    let mut steps = vec![
        format!("mkdir -p {}", shell_quote(&parent)),
        format!("{reader} {q_stage} {redirect} {q_path}"),
        format!("chmod {} {q_path}", mode_text(e.mode.unwrap_or(0o644))),
    ];
    if let Some(spec) = e.owner.spec() {
        steps.push(format!("chown {} {q_path}", shell_quote(&spec)));
    }
    format!("{}; rm -f {q_stage}", steps.join(" && "))
}

fn mode_text(mode: u32) -> String {
    format!("{mode:04o}")
}

/// Python's `int(text, 8)` for a mode: blanks around, an optional `0o` prefix, octal digits;
/// at most 0o7777.
fn octal_mode(text: &str) -> Option<u32> {
    let t = text.trim();
    let digits = t.strip_prefix("0o").or_else(|| t.strip_prefix("0O")).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u32::from_str_radix(digits, 8).ok().filter(|m| *m <= 0o7777)
}

/// `os.path.abspath` as cloud-init (working directory `/`) applies it to a path.
fn absolute(path: &str) -> String {
    let slashes = if path.starts_with("//") && !path.starts_with("///") {
        2
    } else {
        1
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("{}{}", "/".repeat(slashes), parts.join("/"))
}

pub(super) fn base64_text(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_as_python_does() {
        for (path, want) in [
            ("/etc/a", "/etc/a"),
            ("etc/a", "/etc/a"),
            ("/etc/./b/../a", "/etc/a"),
            ("/../a", "/a"),
            ("//a", "//a"),
            ("///a//b/", "/a/b"),
            ("/", "/"),
        ] {
            assert_eq!(absolute(path), want, "{path}");
        }
    }

    #[test]
    fn modes_are_read_as_python_reads_octal() {
        for (text, want) in [
            ("0644", Some(0o644)),
            (" 600 ", Some(0o600)),
            ("0o755", Some(0o755)),
            ("4755", Some(0o4755)),
            ("0x1ff", None),
            ("0648", None),
            ("", None),
            ("17777", None),
        ] {
            assert_eq!(octal_mode(text), want, "{text:?}");
        }
    }

    #[test]
    fn owners_split_as_cloud_init_does() {
        let parts = |o: Owner| (o.user, o.group);
        assert_eq!(parts(Owner::parse("ops:ops")), (Some("ops".into()), Some("ops".into())));
        assert_eq!(parts(Owner::parse(" ops ")), (Some("ops".into()), None));
        assert_eq!(parts(Owner::parse("none:adm")), (None, Some("adm".into())));
        assert_eq!(parts(Owner::parse("-1:-1")), (None, None));
        assert_eq!(parts(Owner::parse("a:b:c")), (Some("a".into()), Some("b:c".into())));
        assert!(Owner::parse("root").is_root());
        assert!(!Owner::parse("root:adm").is_root());
    }

    #[test]
    fn base64_text_round_trips() {
        for bytes in [&b""[..], b"a", b"ab", b"abc", b"\xff\xfe\x00\x10"] {
            assert_eq!(decode::base64(&base64_text(bytes)).unwrap(), bytes);
        }
        assert_eq!(base64_text(b"hello"), "aGVsbG8=");
    }
}
