//! CAPI bootstrap data (the kubeadm `#cloud-config` CABPK writes) as Kairon's structured
//! `spec.cloudInit`, which has no raw user-data. Pure.
//!
//! What Kairon's guest gets is FluxVM's rendering of that structure (Kairon
//! `internal/fluxvm/client.go` forwards it; FluxVM `crates/fluxvm-image/src/cloudinit.rs`
//! renders it): a plain `#cloud-config` with `hostname`, the image's default user plus one
//! user with passwordless sudo, `packages`, each `runCmd` entry as `[bash, -lc, <command>]`,
//! and each file base64-encoded; meta-data `instance-id` and `local-hostname` are both the
//! hostname. The translation keeps what the original would do on the guest:
//!
//! - **jinja**: FluxVM's user-data is no template, so `{{ ds.meta_data.* }}` and `{{ v1.* }}`
//!   are rendered here with the [`GuestFacts`], exactly as cloud-init would ([`jinja`]);
//! - **files**: decoded, in order, with their modes; owners, appends, deferred and binary files
//!   through commands at the head of `runCmd` ([`files`]);
//! - **commands**: cloud-init runs `runcmd` as one script (cc_runcmd writes it, scripts_user
//!   executes it): `#!/bin/sh`, each string entry as a line as it is, each list entry
//!   shell-quoted word by word, no `set -e`. Kairon runs each `runCmd` entry in its own
//!   `bash -lc`, where an `export` or `cd` would be lost before the next entry, so the same
//!   script goes to the guest as a file ([`RUNCMD_SCRIPT`], mode 0700) and one `runCmd`
//!   entry runs it with `sh` (`/run` is `noexec` on Debian and Ubuntu guests: the file can be
//!   read, not executed): shell state holds from line to line, a failing line stops nothing,
//!   and line breaks (heredocs) and long commands need no special case;
//! - **users**: one user with passwordless sudo maps onto Kairon's `user`, the only kind it
//!   makes; any other user setting is an error;
//! - **hostname** (`hostname`, `fqdn`): Kairon's `hostname`, by default the guest's
//!   local-hostname. Kairon gives it as meta-data too, which nothing reads once the template
//!   is rendered;
//! - **packages**: Kairon's `packages` (FluxVM adds `package_update: true`: an index refresh
//!   before installing, which changes how fresh the packages are, not which);
//! - every other key (`bootcmd`, `ntp`, `disk_setup`, `fs_setup`, `mounts`, …) has no Kairon
//!   equivalent that runs when it would (`bootcmd` at every boot before files, disks before
//!   mounts before files): [`TranslateError::Unsupported`], never dropped.
//!
//! Bootstrap data holds the cluster's secrets: errors name a key, a field, a path or a line,
//! never content or command text.

use serde_json::{Map, Value};

use super::CloudInit;
use crate::capi::bootstrap::DEFAULT_MAX_BOOTSTRAP_DATA_BYTES;

mod decode;
mod files;
mod jinja;
mod yaml;

pub use files::STAGING_DIR;
pub use yaml::{MAX_YAML_ALIASES, MAX_YAML_EXPANDED_BYTES, MAX_YAML_NODES};
use yaml::{over_budget, yaml_options};

/// Largest total of decoded file content, by default: twice the largest payload. A Kairon
/// Machine carries it, and must stay below etcd's 1.5 MiB object limit.
pub const DEFAULT_MAX_DECODED_BYTES: usize = 2 * DEFAULT_MAX_BOOTSTRAP_DATA_BYTES;

/// What the guest's cloud-init would know about itself, as far as the provider knows it
/// before the VM exists: the values of the template variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestFacts {
    /// NoCloud `local-hostname`; also the hostname unless the cloud-config sets one.
    pub local_hostname: String,
    /// NoCloud `instance-id`, if known before creation; a template using it is an error
    /// otherwise.
    pub instance_id: Option<String>,
}

impl GuestFacts {
    /// The facts of a Kairon guest named `hostname`: FluxVM writes the hostname it is given as
    /// both `local-hostname` and `instance-id` (not the Machine's uid).
    pub fn kairon(hostname: &str) -> GuestFacts {
        GuestFacts {
            local_hostname: hostname.to_string(),
            instance_id: Some(hostname.to_string()),
        }
    }
}

/// Why bootstrap data cannot become a Kairon cloudInit. Terminal: the same data fails again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    #[error("bootstrap data declares a template other than '## template: jinja' on its first line")]
    TemplateHeader,
    #[error("bootstrap data uses the jinja variable {name}, which is not known before the VM exists")]
    UnknownVariable { name: String },
    #[error(
        "bootstrap data has a jinja statement, unclosed tag or expression on line {line}; only variables (with lower/upper) can be rendered"
    )]
    UnsupportedJinja { line: usize },
    #[error("bootstrap data is not a #cloud-config")]
    NotCloudConfig,
    #[error("bootstrap data is not valid YAML")]
    InvalidYaml,
    #[error(
        "bootstrap data expands to more than a cloud-config may (at most {MAX_YAML_ALIASES} aliases, {MAX_YAML_NODES} nodes and {MAX_YAML_EXPANDED_BYTES} bytes of anchored text repeated)"
    )]
    YamlTooLarge,
    #[error("bootstrap data is not a mapping of cloud-config keys")]
    NotAMapping,
    #[error("cloud-config key {key} has no Kairon equivalent")]
    Unsupported { key: String },
    #[error("cloud-config key {key} {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("write_files entry {index} has no path")]
    MissingPath { index: usize },
    #[error("write_files entry for {path}: {reason}")]
    InvalidFile { path: String, reason: &'static str },
    #[error("write_files entry for {path} has field {field}, which has no Kairon equivalent")]
    UnsupportedFileField { path: String, field: String },
    #[error("write_files content decodes to more than {limit} bytes in all (at {path})")]
    TooLarge { path: String, limit: usize },
    #[error("users entry {index}: {what} has no Kairon equivalent")]
    UnsupportedUser { index: usize, what: String },
    #[error("{key} is not a host name Kairon can set")]
    InvalidHostname { key: &'static str },
    #[error("hostname and fqdn name different hosts; Kairon sets one name")]
    ConflictingHostname,
    #[error("bootstrap data could not be translated: the translation stopped unexpectedly")]
    Interrupted,
}

/// Where the guest gets `runcmd` as the one script cloud-init would have made of it.
pub const RUNCMD_SCRIPT: &str = "/run/cluster-api-provider-kairon/runcmd";

/// Top-level keys with no effect on a Kairon guest, and why.
const IGNORED_KEYS: &[(&str, &str)] = &[
    // How this part merges with other user-data parts and vendor-data: Kairon's seed has one
    // part and no vendor-data.
    ("merge_how", "nothing to merge with"),
    ("merge_type", "nothing to merge with"),
];

/// [`translate_cloud_config`] on a thread for blocking work: bootstrap data is written by a
/// tenant, and its translation (bounded, under a second for the largest data a debug build
/// takes) must not hold a thread of the runtime every reconcile shares.
pub async fn translate_off_runtime(
    user_data: String,
    facts: GuestFacts,
    max_decoded_bytes: usize,
) -> Result<CloudInit, TranslateError> {
    tokio::task::spawn_blocking(move || translate_cloud_config(&user_data, &facts, max_decoded_bytes))
        .await
        .unwrap_or(Err(TranslateError::Interrupted))
}

/// The Kairon cloudInit that does on the guest what `user_data` (CAPI bootstrap data) would,
/// with `facts` for its template variables and at most `max_decoded_bytes` of decoded files.
pub fn translate_cloud_config(
    user_data: &str,
    facts: &GuestFacts,
    max_decoded_bytes: usize,
) -> Result<CloudInit, TranslateError> {
    if !is_hostname(&facts.local_hostname) {
        return Err(TranslateError::InvalidHostname { key: "local-hostname" });
    }
    let text = rendered(user_data, facts)?;
    let lower = text.trim_start().to_ascii_lowercase();
    // cloud-init's part types by prefix; the longer ones are other formats.
    if !lower.starts_with("#cloud-config")
        || lower.starts_with("#cloud-config-archive")
        || lower.starts_with("#cloud-config-jsonp")
    {
        return Err(TranslateError::NotCloudConfig);
    }
    // The parser's messages quote the document: never passed on.
    let doc: Value = serde_saphyr::from_str_with_options(&text, yaml_options(text.len())).map_err(|e| {
        if over_budget(&e) {
            TranslateError::YamlTooLarge
        } else {
            TranslateError::InvalidYaml
        }
    })?;
    let config = match doc {
        Value::Null => Map::new(),
        Value::Object(map) => map,
        _ => return Err(TranslateError::NotAMapping),
    };
    check_keys(&config)?;

    let files = files::plan(config.get("write_files"), max_decoded_bytes)?;
    let (user, ssh_authorized_keys) = user(config.get("users"))?.unwrap_or_default();
    let mut run_cmd = files.commands;
    let mut write_files = files.write_files;
    let commands = commands(config.get("runcmd"))?;
    if !commands.is_empty() {
        // cloud-init's cc_runcmd: one script, `#!/bin/sh` and a line per entry, mode 0700,
        // which scripts_user executes, so `/bin/sh` runs it. Kairon's runCmd entry hands it to
        // `sh` rather than executing it: Debian's and Ubuntu's `/run` is `noexec`.
        run_cmd.push(format!("sh {}", shell_quote(RUNCMD_SCRIPT)));
        write_files.push(crate::kairon::cloud_init::CloudInitFile {
            path: RUNCMD_SCRIPT.into(),
            content: runcmd_script(&commands),
            permissions: "0700".into(),
        });
    }
    Ok(CloudInit {
        hostname: hostname(&config, &facts.local_hostname)?,
        user,
        ssh_authorized_keys,
        packages: packages(&config)?,
        run_cmd,
        write_files,
    })
}

fn rendered(user_data: &str, facts: &GuestFacts) -> Result<String, TranslateError> {
    let template = jinja::template_of(user_data).map_err(jinja_error)?;
    let Some(template) = template else {
        return Ok(user_data.to_string());
    };
    let vars = jinja::Variables {
        instance_id: facts.instance_id.as_deref(),
        local_hostname: &facts.local_hostname,
    };
    jinja::render(template, &vars).map_err(jinja_error)
}

fn jinja_error(e: jinja::JinjaError) -> TranslateError {
    match e {
        jinja::JinjaError::Header => TranslateError::TemplateHeader,
        jinja::JinjaError::Unknown(name) => TranslateError::UnknownVariable {
            name: field_name(&name),
        },
        jinja::JinjaError::Unsupported { line } => TranslateError::UnsupportedJinja { line },
    }
}

/// Every key is translated, ignored for a reason, or refused.
fn check_keys(config: &Map<String, Value>) -> Result<(), TranslateError> {
    const TRANSLATED: &[&str] = &[
        "write_files",
        "runcmd",
        "users",
        "hostname",
        "fqdn",
        "packages",
        "package_update",
    ];
    for (key, value) in config {
        let known = TRANSLATED.contains(&key.as_str()) || IGNORED_KEYS.iter().any(|(k, _)| k == key);
        // cc_ntp does nothing when `ntp.enabled` is given and false (CABPK writes
        // `enabled: false` for a KubeadmConfig's `ntp.enabled: false`).
        let ntp_off = key == "ntp" && value.get("enabled").is_some_and(|e| !is_true(e));
        if !known && !ntp_off {
            return Err(TranslateError::Unsupported { key: field_name(key) });
        }
    }
    Ok(())
}

/// `runcmd` as the lines cloud-init's runcmd script has: a string as it is, a list shell-quoted
/// word by word (cloud-init's `shellify`).
fn commands(value: Option<&Value>) -> Result<Vec<String>, TranslateError> {
    let invalid = |reason| TranslateError::InvalidKey {
        key: "runcmd".into(),
        reason,
    };
    let list = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(invalid("is not a list")),
    };
    list.iter()
        .map(|entry| match entry {
            Value::String(s) => Ok(s.clone()),
            Value::Array(words) => words
                .iter()
                .map(|w| match w {
                    Value::String(s) => Ok(shell_quote(s)),
                    Value::Number(n) if n.is_i64() || n.is_u64() => Ok(shell_quote(&n.to_string())),
                    _ => Err(invalid("has a command word that is neither a string nor an integer")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|words| words.join(" ")),
            _ => Err(invalid("has an entry that is neither a string nor a list")),
        })
        .collect()
}

/// The script cloud-init's cc_runcmd writes for these lines (its `util.shellify`): a
/// `#!/bin/sh` line, then each line and a line break. No `set -e`: a failing line does not
/// stop the next, and the script's status is the last line's.
fn runcmd_script(lines: &[String]) -> String {
    let mut script = String::from("#!/bin/sh\n");
    for line in lines {
        script.push_str(line);
        script.push('\n');
    }
    script
}

/// cloud-init's hostname: `fqdn` wins and `hostname` defaults to its first label (and a
/// dotted `hostname` is an fqdn), which Kairon reproduces when given the fqdn.
fn hostname(config: &Map<String, Value>, local_hostname: &str) -> Result<String, TranslateError> {
    let text = |key: &'static str| match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if is_hostname(s) => Ok(Some(s.clone())),
        Some(_) => Err(TranslateError::InvalidHostname { key }),
    };
    match (text("hostname")?, text("fqdn")?) {
        (None, None) => Ok(local_hostname.to_string()),
        (Some(h), None) => Ok(h),
        (None, Some(f)) => Ok(f),
        (Some(h), Some(f)) if f.split('.').next() == Some(h.as_str()) || f == h => Ok(f),
        _ => Err(TranslateError::ConflictingHostname),
    }
}

/// A name FluxVM can write unquoted into meta-data: letters, digits, `-` and `.`.
/// A DNS name a guest can take as its hostname: at most 253 characters, each dot-separated
/// label 1 to 63 letters, digits or hyphens (a longer label is no host name, and Linux keeps at
/// most 64 bytes of a hostname).
fn is_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len()) && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// The one user Kairon makes: the image's default user is always there, plus one user with
/// passwordless sudo, `/bin/bash` and its keys. Returns its name and keys.
fn user(value: Option<&Value>) -> Result<Option<(String, Vec<String>)>, TranslateError> {
    const SUDO: &str = "ALL=(ALL) NOPASSWD:ALL";
    let list = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(TranslateError::InvalidKey {
                key: "users".into(),
                reason: "is not a list",
            });
        }
    };
    let mut found = None;
    for (i, entry) in list.iter().enumerate() {
        let index = i + 1;
        let unsupported = |what: &str| TranslateError::UnsupportedUser {
            index,
            what: what.to_string(),
        };
        let fields = match entry {
            // FluxVM always creates the image's default user.
            Value::String(s) if s == "default" => continue,
            Value::Object(fields) => fields,
            _ => return Err(unsupported("a user without passwordless sudo")),
        };
        let name = match fields.get("name") {
            Some(Value::String(n)) if n != "default" && !n.is_empty() && is_line_safe(n) => n.clone(),
            _ => return Err(unsupported("a user without a plain name")),
        };
        if found.is_some() {
            return Err(unsupported("a second user (Kairon makes one)"));
        }
        for (field, value) in fields {
            let fine = match field.as_str() {
                "name" => true,
                "sudo" => match value {
                    Value::String(s) => s == SUDO,
                    Value::Array(rules) => rules.len() == 1 && rules[0] == SUDO,
                    _ => false,
                },
                // Kairon's is /bin/bash; a user without `shell` gets it where cloud-init would
                // have given useradd's default, a difference of login shell only.
                "shell" => value == "/bin/bash",
                // cloud-init locks passwords by default, as Kairon's user has it.
                "lock_passwd" => is_true(value),
                "ssh_authorized_keys" => true,
                _ => false,
            };
            if !fine {
                return Err(unsupported(&format!("field {}", field_name(field))));
            }
        }
        if !fields.contains_key("sudo") {
            return Err(unsupported("a user without passwordless sudo"));
        }
        let keys = match fields.get("ssh_authorized_keys") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(keys)) => keys
                .iter()
                .map(|k| match k {
                    Value::String(k) if is_line_safe(k) => Ok(k.clone()),
                    _ => Err(unsupported("an ssh_authorized_keys entry that is not one line of text")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(unsupported("ssh_authorized_keys that is not a list")),
        };
        found = Some((name, keys));
    }
    Ok(found)
}

/// `packages`, when Kairon's rendering (always `package_update: true` with them) matches.
fn packages(config: &Map<String, Value>) -> Result<Vec<String>, TranslateError> {
    let packages = match config.get("packages") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|p| match p {
                Value::String(p) if is_line_safe(p) => Ok(p.clone()),
                // [name, version] pins are distro-specific; Kairon takes names.
                _ => Err(TranslateError::InvalidKey {
                    key: "packages".into(),
                    reason: "has an entry that is not a package name",
                }),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(TranslateError::InvalidKey {
                key: "packages".into(),
                reason: "is not a list",
            });
        }
    };
    if let Some(update) = config.get("package_update")
        && is_true(update) == packages.is_empty()
    {
        // An update without packages, or packages without the update FluxVM always adds.
        return Err(TranslateError::Unsupported {
            key: "package_update".into(),
        });
    }
    Ok(packages)
}

/// cloud-init's `translate_bool`: a boolean, or `true`/`1`/`on`/`yes` in any case.
fn is_true(value: &Value) -> bool {
    match value {
        Value::Bool(b) => *b,
        Value::String(s) => ["true", "1", "on", "yes"].contains(&s.trim().to_ascii_lowercase().as_str()),
        Value::Number(n) => n.as_f64() == Some(1.0),
        _ => false,
    }
}

/// Whether FluxVM's single-quoted YAML scalar keeps `text` as it is: no line break (which YAML
/// folds into a space) and nothing YAML does not allow.
fn is_line_safe(text: &str) -> bool {
    text.chars()
        .all(|c| c == '\t' || !(c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{fffe}' | '\u{ffff}')))
}

/// POSIX shell single quotes, as cloud-init's `shellify` quotes words.
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// A key, field or variable name fit for an error: as it is when it looks like one (cloud-init's
/// are lower case), else a placeholder (a misindented document can turn content into keys).
fn field_name(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.'));
    if plain {
        name.to_string()
    } else {
        "(a key that is not a plain name)".to_string()
    }
}

#[cfg(test)]
mod tests;
