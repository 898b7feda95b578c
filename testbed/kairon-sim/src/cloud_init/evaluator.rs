//! A small model of cloud-init for the tests: what a guest does with a cloud-config — its
//! hostname, the files it writes (path, content, mode, owner), the commands it runs in order,
//! its users and packages. It plays cloud-init for the original bootstrap data and for Kairon's
//! rendering alike: the simulator's own jinja (`guest::render`), `write_files` decoded with
//! `base64` and `flate2` (independent of the provider's decoder), deferred files after the
//! others, then `runcmd`, where a command that only moves files (`cat`, `base64 -d`, `chmod`,
//! `chown`, `mkdir -p`, `rm -f`, as the translation's staged writes are) is applied to the
//! files rather than recorded, `sh <file>` runs the file's text, and
//! Kairon's `[bash, -lc, X]` runs X. `runcmd` is one script, as cloud-init writes it: recorded
//! as one command, unless its entries are all FluxVM's `[bash, -lc, X]` (each its own shell,
//! played one by one). Files under the provider's staging directory are left out.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;
use capkr::kairon::cloud_init::STAGING_DIR;
use serde_json::Value;

use crate::guest;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FileState {
    pub(super) content: Vec<u8>,
    pub(super) mode: u32,
    pub(super) owner: (String, String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct User {
    pub(super) name: String,
    pub(super) sudo: Option<String>,
    pub(super) shell: Option<String>,
    pub(super) keys: Vec<String>,
}

/// What a guest does with a cloud-config.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Outcome {
    pub(super) hostname: String,
    pub(super) files: BTreeMap<String, FileState>,
    pub(super) commands: Vec<String>,
    pub(super) users: Vec<User>,
    pub(super) packages: Vec<String>,
}

pub(super) fn evaluate(user_data: &str, meta: &guest::MetaData) -> Outcome {
    let rendered = guest::render(user_data, meta);
    assert!(rendered.starts_with("#cloud-config"), "not a cloud-config");
    let doc: Value = serde_saphyr::from_str(&rendered).expect("YAML");
    let text = |key: &str| doc.get(key).and_then(Value::as_str).map(str::to_string);
    let mut out = Outcome {
        // cloud-init's set_hostname: fqdn's first label unless hostname is given.
        hostname: match (text("hostname"), text("fqdn")) {
            (Some(h), _) => h.split('.').next().unwrap_or_default().to_string(),
            (None, Some(f)) => f.split('.').next().unwrap_or_default().to_string(),
            (None, None) => meta.local_hostname.clone(),
        },
        ..Default::default()
    };
    let list = |key: &str| doc.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    let files = list("write_files");
    let deferred = |f: &Value| f.get("defer").and_then(Value::as_bool) == Some(true);
    for f in files
        .iter()
        .filter(|f| !deferred(f))
        .chain(files.iter().filter(|f| deferred(f)))
    {
        write_entry(&mut out.files, f);
    }
    // cloud-init runs `runcmd` as one `sh` script. FluxVM's entries are each
    // `[bash, -lc, X]`: lines of that script that are shells of their own, so each X runs
    // alone (and is played here); any other script is recorded as the one command it is.
    let entries = list("runcmd");
    let own_shells: Option<Vec<String>> = entries
        .iter()
        .map(|e| match e.as_array().map(Vec::as_slice) {
            Some([bash, flag, x]) if bash == "bash" && flag == "-lc" => x.as_str().map(str::to_string),
            _ => None,
        })
        .collect();
    match own_shells {
        Some(lines) => lines.iter().for_each(|line| run(&mut out, line)),
        None => out.commands.push(crate::scripts::shellify(&entries)),
    }
    out.files.retain(|path, _| !path.starts_with(STAGING_DIR));
    for u in list("users") {
        if u.as_str() == Some("default") {
            continue;
        }
        let field = |k: &str| match u.get(k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(a)) => Some(a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")),
            _ => None,
        };
        out.users.push(User {
            name: field("name").expect("user name"),
            sudo: field("sudo"),
            shell: field("shell"),
            keys: u
                .get("ssh_authorized_keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).map(str::to_string).collect())
                .unwrap_or_default(),
        });
    }
    out.packages = list("packages")
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    out
}

fn write_entry(files: &mut BTreeMap<String, FileState>, f: &Value) {
    let field = |k: &str| f.get(k).and_then(Value::as_str);
    let path = field("path").expect("path").to_string();
    let content = field("content").unwrap_or("");
    let b64 = |s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s.split_whitespace().collect::<String>())
            .expect("base64")
    };
    let bytes = match field("encoding").unwrap_or("").to_ascii_lowercase().as_str() {
        "" | "text/plain" => content.as_bytes().to_vec(),
        "b64" | "base64" => b64(content),
        "gz+b64" | "gzip+base64" | "gz+base64" | "gzip+b64" => {
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(b64(content).as_slice())
                .read_to_end(&mut out)
                .expect("gzip");
            out
        }
        other => panic!("encoding {other}"),
    };
    let mode = field("permissions").map_or(0o644, |p| u32::from_str_radix(p, 8).expect("mode"));
    let append = f.get("append").and_then(Value::as_bool) == Some(true);
    let owner = field("owner").unwrap_or("root:root");
    put(files, &path, bytes, append, mode, Some(owner));
}

/// Writes a file as cloud-init's write_file does: content (appended or not), mode, then owner
/// (`None`: unchanged).
fn put(
    files: &mut BTreeMap<String, FileState>,
    path: &str,
    bytes: Vec<u8>,
    append: bool,
    mode: u32,
    owner: Option<&str>,
) {
    let state = files.entry(path.to_string()).or_insert_with(|| FileState {
        content: Vec::new(),
        mode,
        owner: ("root".into(), "root".into()),
    });
    if append {
        state.content.extend(bytes);
    } else {
        state.content = bytes;
    }
    state.mode = mode;
    if let Some(owner) = owner {
        chown(state, owner);
    }
}

fn chown(state: &mut FileState, spec: &str) {
    let (user, group) = spec.split_once(':').unwrap_or((spec, ""));
    if !user.is_empty() {
        state.owner.0 = user.to_string();
    }
    if !group.is_empty() {
        state.owner.1 = group.to_string();
    }
}

/// Runs one runcmd line: applied to the files when it only moves files, else recorded.
fn run(out: &mut Outcome, line: &str) {
    // `sh <file>` runs the file's text.
    if let Some(script) = line.strip_prefix("sh ").and_then(only_word)
        && let Some(file) = out.files.get(&script)
    {
        let text = String::from_utf8(file.content.clone()).expect("script text");
        out.commands.push(text);
        return;
    }
    let Some(steps) = file_steps(line) else {
        out.commands.push(line.to_string());
        return;
    };
    for step in steps {
        match step.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["mkdir", "-p", _] => {}
            [reader @ ("cat" | "base64"), rest @ ..] => {
                let (decode, rest) = match (*reader, rest) {
                    ("base64", ["-d", rest @ ..]) => (true, rest),
                    ("cat", rest) => (false, rest),
                    _ => panic!("{reader}"),
                };
                let [src, redirect, dst] = rest else { panic!("redirect") };
                let staged = out.files.get(*src).expect("staged file").content.clone();
                let bytes = if decode {
                    base64::engine::general_purpose::STANDARD
                        .decode(staged)
                        .expect("base64")
                } else {
                    staged
                };
                let mode = out.files.get(*dst).map_or(0o644, |f| f.mode);
                put(&mut out.files, dst, bytes, *redirect == ">>", mode, None);
            }
            ["chmod", mode, path] => {
                out.files.get_mut(*path).expect("chmod target").mode = u32::from_str_radix(mode, 8).expect("mode");
            }
            ["chown", spec, path] => chown(out.files.get_mut(*path).expect("chown target"), spec),
            ["rm", "-f", path] => {
                out.files.remove(*path);
            }
            _ => unreachable!("file_steps only returns these"),
        }
    }
}

fn only_word(text: &str) -> Option<String> {
    let steps = words(text)?;
    match steps.as_slice() {
        [w] => Some(w.clone()),
        _ => None,
    }
}

/// The steps of a line made only of file commands joined by `&&` or `;`, if it is one.
fn file_steps(line: &str) -> Option<Vec<Vec<String>>> {
    let words = words(line)?;
    let steps: Vec<Vec<String>> = words.split(|w| w == "&&" || w == ";").map(<[String]>::to_vec).collect();
    let known = |s: &[String]| {
        matches!(
            s.iter().map(String::as_str).collect::<Vec<_>>().as_slice(),
            ["mkdir", "-p", _]
                | ["cat", _, ">" | ">>", _]
                | ["base64", "-d", _, ">" | ">>", _]
                | ["chmod", _, _]
                | ["chown", _, _]
                | ["rm", "-f", _]
        )
    };
    steps.iter().all(|s| known(s)).then_some(steps)
}

/// Shell words of `line` (single quotes, `\'`, and the operators `&&`, `;`, `>`, `>>`), or
/// `None` for anything richer.
fn words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c == ' ' {
            chars.next();
            continue;
        }
        let mut word = String::new();
        if c == ';' {
            chars.next();
            words.push(";".into());
            continue;
        }
        while let Some(&c) = chars.peek() {
            match c {
                ' ' | ';' => break,
                '\'' => {
                    chars.next();
                    for c in chars.by_ref() {
                        if c == '\'' {
                            break;
                        }
                        word.push(c);
                    }
                }
                '\\' => {
                    chars.next();
                    word.push(chars.next()?);
                }
                '"' | '$' | '`' | '|' | '<' | '(' | ')' | '*' | '\n' => return None,
                _ => {
                    chars.next();
                    word.push(c);
                }
            }
        }
        words.push(word);
    }
    Some(words)
}
