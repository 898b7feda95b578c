//! What a failing test prints: the tail of every process log and the objects that explain the
//! state of the clusters (bootstrap data redacted).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::manifests::redact_user_data;
use crate::process::tail_file;

const LOG_LINES: usize = 60;

/// Resources dumped from the management cluster, in this order.
const MANAGEMENT_RESOURCES: &[&str] = &[
    "clusters.cluster.x-k8s.io",
    "kaironclusters.infrastructure.cluster.x-k8s.io",
    "machinedeployments.cluster.x-k8s.io",
    "machinesets.cluster.x-k8s.io",
    "machines.cluster.x-k8s.io",
    "kaironmachines.infrastructure.cluster.x-k8s.io",
    "machines.kairon.zyvor.dev",
    "kubeadmconfigs.bootstrap.cluster.x-k8s.io",
];

/// What a dump reads of an environment, taken by the environment itself.
pub(crate) struct Subject {
    /// The environment's name, prefixing every line.
    pub name: String,
    pub dir: PathBuf,
    pub log_dir: PathBuf,
    pub kubectl: PathBuf,
    pub kubeconfig: PathBuf,
    /// Each workload cluster as `(namespace/name, kubeconfig)`.
    pub workloads: Vec<(String, PathBuf)>,
    /// [`crate::Env::exited`]'s lines.
    pub exited: String,
}

pub(crate) fn dump(env: &Subject) {
    let prefix = format!("[{}]", env.name);
    eprintln!("{prefix} ===== capkr-testenv dump: {} =====", env.dir.display());
    for line in env.exited.lines() {
        eprintln!("{prefix} {line}");
    }
    dump_logs(&env.name, &env.log_dir, LOG_LINES);
    for r in MANAGEMENT_RESOURCES {
        dump_objects(&env.kubectl, &prefix, &env.kubeconfig, r, "management");
    }
    for (name, kubeconfig) in &env.workloads {
        dump_objects(&env.kubectl, &prefix, kubeconfig, "nodes", &format!("workload {name}"));
    }
    eprintln!("{prefix} ===== end of dump =====");
}

/// The last `lines` lines of every log in `log_dir`, each line prefixed with the
/// environment's `name` and the log's.
pub(crate) fn dump_logs(name: &str, log_dir: &Path, lines: usize) {
    let prefix = format!("[{name}]");
    let mut files: Vec<_> = match std::fs::read_dir(log_dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) => {
            eprintln!("{prefix} cannot list logs: {e}");
            return;
        }
    };
    files.sort();
    for f in files {
        let name = f
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        eprintln!("{prefix} ----- {name}: last {lines} lines of {} -----", f.display());
        for line in tail_file(&f, lines).lines() {
            eprintln!("{prefix}[{name}] {line}");
        }
    }
}

fn dump_objects(kubectl: &Path, prefix: &str, kubeconfig: &Path, resource: &str, cluster: &str) {
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout=10s", "get", resource, "-A", "-o", "json"])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => {
            eprintln!(
                "{prefix} ----- {cluster} {resource}: kubectl failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("{prefix} ----- {cluster} {resource}: cannot run kubectl: {e}");
            return;
        }
    };
    let mut list: Value = match serde_json::from_slice(&out) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{prefix} ----- {cluster} {resource}: unparsable kubectl output: {e}");
            return;
        }
    };
    let items = list["items"].as_array_mut().map(std::mem::take).unwrap_or_default();
    eprintln!("{prefix} ----- {cluster} {resource}: {} object(s) -----", items.len());
    for mut item in items {
        if let Some(meta) = item["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
        redact_user_data(&mut item);
        match serde_saphyr::to_string(&item) {
            Ok(yaml) => {
                eprintln!("{prefix} ---");
                for line in yaml.lines() {
                    eprintln!("{prefix} {line}");
                }
            }
            Err(e) => eprintln!("{prefix} <cannot render YAML: {e}>"),
        }
    }
}
