//! The NoCloud seed a Kairon guest boots with, from a Machine's structured `spec.cloudInit`, as
//! Kairon renders it: kairon-node forwards the fields to FluxVM's create request (only when
//! one is set; Kairon `internal/fluxvm/client.go`), and FluxVM writes the seed
//! (`crates/fluxvm-image/src/cloudinit.rs`):
//!
//! - user-data: `#cloud-config`, then `hostname` (default `fluxvm-vm`), `users` (the image's
//!   `default` and one user, default `cloud`, with passwordless sudo, `/bin/bash` and the SSH
//!   keys), `package_update: true` and `packages`, `runcmd` with each command as
//!   `[ bash, -lc, <command> ]`, and `write_files` with each file's `path`, `permissions` when
//!   set, `encoding: b64` and the base64 of its content. Every scalar in single quotes;
//! - meta-data: the hostname as both `instance-id` and `local-hostname`.
//!
//! The user-data is a cloud-config that [`crate::guest`] reads as it reads CAPI's bootstrap
//! data (with [`meta`] for meta-data).

use base64::Engine;
use capkr::kairon::cloud_init::CloudInit;

use crate::guest::MetaData;

/// FluxVM's hostname and user when a cloudInit has none.
pub const DEFAULT_HOSTNAME: &str = "fluxvm-vm";
pub const DEFAULT_USER: &str = "cloud";

/// A guest's NoCloud seed.
#[derive(Clone, PartialEq, Eq)]
pub struct Seed {
    pub user_data: String,
    pub meta_data: String,
}

/// The seed of a VM with this cloudInit; `None` when every field is empty, as kairon-node
/// then asks FluxVM for no cloud-init at all.
pub fn seed(ci: &CloudInit) -> Option<Seed> {
    if *ci == CloudInit::default() {
        return None;
    }
    let hostname = hostname(ci);
    Some(Seed {
        user_data: user_data(ci),
        meta_data: format!("instance-id: {hostname}\nlocal-hostname: {hostname}\n"),
    })
}

/// The meta-data of [`seed`] as the guest reads it.
pub fn meta(ci: &CloudInit) -> MetaData {
    MetaData {
        instance_id: hostname(ci).to_string(),
        local_hostname: hostname(ci).to_string(),
    }
}

fn hostname(ci: &CloudInit) -> &str {
    if ci.hostname.is_empty() {
        DEFAULT_HOSTNAME
    } else {
        &ci.hostname
    }
}

fn user_data(ci: &CloudInit) -> String {
    let q = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let user = if ci.user.is_empty() { DEFAULT_USER } else { &ci.user };
    let mut out = String::from("#cloud-config\n");
    out += &format!("hostname: {}\n", q(hostname(ci)));
    out += "users:\n  - default\n";
    out += &format!(
        "  - name: {}\n    sudo: ALL=(ALL) NOPASSWD:ALL\n    shell: /bin/bash\n",
        q(user)
    );
    if !ci.ssh_authorized_keys.is_empty() {
        out += "    ssh_authorized_keys:\n";
        for key in &ci.ssh_authorized_keys {
            out += &format!("      - {}\n", q(key));
        }
    }
    if !ci.packages.is_empty() {
        out += "package_update: true\npackages:\n";
        for p in &ci.packages {
            out += &format!("  - {}\n", q(p));
        }
    }
    if !ci.run_cmd.is_empty() {
        out += "runcmd:\n";
        for command in &ci.run_cmd {
            out += &format!("  - [ bash, -lc, {} ]\n", q(command));
        }
    }
    if !ci.write_files.is_empty() {
        out += "write_files:\n";
        for f in &ci.write_files {
            out += &format!("  - path: {}\n", q(&f.path));
            if !f.permissions.is_empty() {
                out += &format!("    permissions: {}\n", q(&f.permissions));
            }
            out += "    encoding: b64\n";
            let content = base64::engine::general_purpose::STANDARD.encode(f.content.as_bytes());
            out += &format!("    content: {}\n", q(&content));
        }
    }
    out
}

#[cfg(test)]
mod evaluator;
#[cfg(test)]
mod tests;
