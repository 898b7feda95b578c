//! What a failing test prints: the tail of every process log and the objects that explain the
//! state of the clusters (bootstrap data redacted).

use std::process::Command;

use serde_json::Value;

use crate::env::Env;
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

pub(crate) fn dump(env: &Env) {
    let prefix = format!("[{}]", env.name);
    eprintln!("{prefix} ===== capkr-testenv dump: {} =====", env.dir.display());
    for line in env.exited(0).lines() {
        eprintln!("{prefix} {line}");
    }
    dump_logs(env, LOG_LINES);
    for r in MANAGEMENT_RESOURCES {
        dump_objects(
            env,
            &prefix,
            env.kubeconfig_path.to_string_lossy().as_ref(),
            r,
            "management",
        );
    }
    let workloads = env.workloads.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for w in workloads {
        let what = format!("workload {}/{}", w.namespace, w.name);
        dump_objects(
            env,
            &prefix,
            w.kubeconfig_path.to_string_lossy().as_ref(),
            "nodes",
            &what,
        );
    }
    eprintln!("{prefix} ===== end of dump =====");
}

pub(crate) fn dump_logs(env: &Env, lines: usize) {
    let prefix = format!("[{}]", env.name);
    let mut files: Vec<_> = match std::fs::read_dir(env.log_dir()) {
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

fn dump_objects(env: &Env, prefix: &str, kubeconfig: &str, resource: &str, cluster: &str) {
    let out = Command::new(&env.bins.kubectl)
        .args([
            "--kubeconfig",
            kubeconfig,
            "--request-timeout=10s",
            "get",
            resource,
            "-A",
            "-o",
            "json",
        ])
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
