//! The machine and the versions a result was measured with.

use std::path::Path;
use std::process::Command;

use capkr_testenv::{Binaries, workspace_root};

use crate::results::{MachineInfo, Versions};

pub fn machine() -> MachineInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    MachineInfo {
        nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        cpu_model,
        memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
    }
}

/// The first line a command prints, or `unknown`.
fn first_line(program: &Path, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

pub fn versions(bins: &Binaries, manager_bin: &Path) -> Versions {
    // `Kubernetes v1.36.3`
    let kube_apiserver = first_line(&bins.kube_apiserver, &["--version"]);
    let kube_apiserver = kube_apiserver
        .strip_prefix("Kubernetes ")
        .unwrap_or(&kube_apiserver)
        .to_string();
    let mut commit = first_line(Path::new("git"), &["rev-parse", "HEAD"]);
    if commit != "unknown" {
        let dirty = Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no"])
            .current_dir(workspace_root())
            .output()
            .is_ok_and(|o| !o.stdout.is_empty());
        if dirty {
            commit.push_str(" (with uncommitted changes)");
        }
    }
    Versions {
        rustc: first_line(Path::new("rustc"), &["--version"]),
        kube_apiserver,
        cluster_api: first_line(&bins.clusterctl, &["version", "-o", "short"]),
        git_commit: commit,
        manager: first_line(manager_bin, &["--version"]),
    }
}
