//! `make demo`: a management cluster, the Kairon simulator and our manager, and a cluster from
//! the shipped default flavor (`clusterctl generate cluster` from the release assets): a
//! KubeadmControlPlane whose VMs run real etcd and kube-apiserver processes, behind the
//! kube-vip endpoint the simulator serves, and a MachineDeployment of two workers.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Api;
use kube::api::{DynamicObject, ListParams};
use serde_json::Value;

use crate::cluster::{ClusterOptions, cluster_yaml};
use crate::env::{Env, EnvOptions};
use crate::flavors::{ClusterctlRepo, GuestNetwork, VERSION, guest_simulator_args};
use crate::kube_util::resolve_kind;
use crate::process::Process;

pub const NAMESPACE: &str = "demo";
pub const CLUSTER: &str = "demo";
pub use crate::cluster::KUBERNETES_VERSION;
pub const WORKERS: usize = 2;
/// Control-plane replicas of the demo cluster (each runs an etcd and a kube-apiserver).
pub const CONTROL_PLANES: usize = 1;

#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Return as soon as every Machine is Running with a Node (otherwise run until Ctrl-C).
    pub exit_when_ready: bool,
    /// How long to wait for the cluster before failing.
    pub timeout: Duration,
    pub simulator_args: Vec<String>,
    pub manager_args: Vec<String>,
    /// Print the progress table (to stdout).
    pub show_progress: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            exit_when_ready: false,
            timeout: Duration::from_secs(300),
            simulator_args: [
                "--provision-delay",
                "1s",
                "--boot-delay",
                "2s",
                // Hosts in the two failure domains of the sample KaironCluster, as Nodes of
                // Kairon's cluster that an operator can cordon and evacuate.
                "--host-objects",
                "--hosts",
                "kairon-node-1:topology.kairon.zyvor.dev/zone=zone-a,\
                 kairon-node-2:topology.kairon.zyvor.dev/zone=zone-b,\
                 kairon-node-3:topology.kairon.zyvor.dev/zone=zone-b,\
                 kairon-node-4:topology.kairon.zyvor.dev/zone=zone-b",
            ]
            .map(String::from)
            .to_vec(),
            manager_args: Vec::new(),
            show_progress: true,
        }
    }
}

/// One line of the progress table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineRow {
    pub name: String,
    pub role: &'static str,
    pub phase: String,
    pub infra_ready: bool,
    pub provider_id: String,
    pub node: String,
}

impl MachineRow {
    pub fn is_up(&self) -> bool {
        self.phase == "Running" && !self.node.is_empty()
    }
}

#[derive(Clone, Debug)]
pub struct DemoReport {
    pub env_startup: Duration,
    /// From applying the cluster to every Machine Running with a nodeRef.
    pub time_to_ready: Duration,
    pub machines: Vec<MachineRow>,
}

/// The sample cluster (CAPI v1beta2) with its control plane endpoint at `host:port`: one
/// control-plane Machine and a MachineDeployment of [`WORKERS`] workers.
pub fn cluster_manifests(namespace: &str, cluster: &str, host: &str, port: u16) -> String {
    cluster_yaml(
        namespace,
        cluster,
        host,
        port,
        &ClusterOptions {
            workers: WORKERS,
            ..ClusterOptions::default()
        },
    )
}

/// The current Machines of the demo cluster with their KaironMachines.
pub async fn machine_rows(env: &Env, namespace: &str, cluster: &str) -> Result<Vec<MachineRow>> {
    let client = env.client();
    let (mar, _) = resolve_kind(&client, "cluster.x-k8s.io/v1beta2", "Machine").await?;
    let (kar, _) = resolve_kind(&client, "infrastructure.cluster.x-k8s.io/v1alpha1", "KaironMachine").await?;
    let lp = ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={cluster}"));
    let machines = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &mar)
        .list(&lp)
        .await?;
    let kms: BTreeMap<String, DynamicObject> = Api::<DynamicObject>::namespaced_with(client, namespace, &kar)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name.clone().map(|n| (n, o)))
        .collect();
    let mut rows: Vec<MachineRow> = machines
        .items
        .iter()
        .map(|m| {
            let d = &m.data;
            let km_name = d["spec"]["infrastructureRef"]["name"].as_str().unwrap_or_default();
            let infra_ready = kms
                .get(km_name)
                .map(|km| km.data["status"]["initialization"]["provisioned"] == Value::Bool(true))
                .unwrap_or(false);
            let is_cp = m
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("cluster.x-k8s.io/control-plane"));
            MachineRow {
                name: m.metadata.name.clone().unwrap_or_default(),
                role: if is_cp { "control-plane" } else { "worker" },
                phase: d["status"]["phase"].as_str().unwrap_or("-").to_string(),
                infra_ready,
                provider_id: d["spec"]["providerID"].as_str().unwrap_or_default().to_string(),
                node: d["status"]["nodeRef"]["name"].as_str().unwrap_or_default().to_string(),
            }
        })
        .collect();
    rows.sort_by(|a, b| (a.role, &a.name).cmp(&(b.role, &b.name)));
    Ok(rows)
}

pub fn render_table(rows: &[MachineRow]) -> String {
    let header = ["MACHINE", "ROLE", "PHASE", "INFRA READY", "PROVIDER ID", "NODE"];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.role.to_string(),
                r.phase.clone(),
                if r.infra_ready { "true" } else { "false" }.to_string(),
                if r.provider_id.is_empty() {
                    "-".into()
                } else {
                    r.provider_id.clone()
                },
                if r.node.is_empty() { "-".into() } else { r.node.clone() },
            ]
        })
        .collect();
    columns(&header, &cells)
}

/// Left-aligned columns two spaces apart, as kubectl prints them.
fn columns(header: &[&str], cells: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for c in cells {
        for (i, v) in c.iter().enumerate() {
            widths[i] = widths[i].max(v.len());
        }
    }
    let line = |vals: &[&str]| {
        vals.iter()
            .enumerate()
            .map(|(i, v)| format!("{v:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![line(header)];
    for c in cells {
        out.push(line(&c.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    out.join("\n")
}

/// A Kairon Machine's network as Kairon reads its spec: the mode (`user` when absent) and
/// where it attaches (`tap/br0`, `tap/netns`, `macvtap/eth1`).
fn network_of(spec: &Value) -> String {
    let network = &spec["network"];
    let mode = network["mode"].as_str().unwrap_or("user");
    let on = match mode {
        "tap" if network["netns"].as_bool() == Some(true) => Some("netns"),
        "tap" => network["bridge"].as_str(),
        "macvtap" => network["parent"].as_str(),
        _ => None,
    };
    match on {
        Some(on) => format!("{mode}/{on}"),
        None => mode.to_string(),
    }
}

/// The Kairon Machines of `namespace` as Kairon shows them (its printer columns, with the
/// image), and the spec the provider wrote on the first control plane's: image, resources,
/// placement, network and guest agent as they are, `cloudInit` only counted (it holds the cluster's
/// secrets).
pub async fn kairon_machines_summary(env: &Env, namespace: &str) -> Result<String> {
    let client = env.client();
    let (ar, _) = resolve_kind(&client, "kairon.zyvor.dev/v1alpha1", "Machine").await?;
    let mut vms = Api::<DynamicObject>::namespaced_with(client, namespace, &ar)
        .list(&ListParams::default())
        .await?
        .items;
    vms.sort_by_key(|vm| vm.metadata.name.clone());
    let text = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| "-".into());
    let cells: Vec<Vec<String>> = vms
        .iter()
        .map(|vm| {
            let (spec, status) = (&vm.data["spec"], &vm.data["status"]);
            vec![
                vm.metadata.name.clone().unwrap_or_default(),
                text(&status["nodeName"]),
                text(&status["phase"]),
                text(&spec["resources"]["cpu"]),
                text(&spec["resources"]["memory"]),
                text(&spec["image"]["imageRef"]),
                network_of(spec),
                text(&status["guestIP"]),
            ]
        })
        .collect();
    let mut out = columns(
        &["NAME", "NODE", "PHASE", "CPU", "MEMORY", "IMAGE", "NETWORK", "IP"],
        &cells,
    );
    let control_plane = vms.iter().find(|vm| {
        vm.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key("cluster.x-k8s.io/control-plane"))
    });
    if let Some(vm) = control_plane {
        let spec = &vm.data["spec"];
        let mut shown = serde_json::Map::new();
        for key in [
            "image",
            "resources",
            "instanceTypeName",
            "network",
            "guestAgent",
            "placement",
            "nodeName",
        ] {
            if !spec[key].is_null() {
                shown.insert(key.to_string(), spec[key].clone());
            }
        }
        let ci = &spec["cloudInit"];
        let count = |k: &str| ci[k].as_array().map_or(0, Vec::len);
        shown.insert(
            "cloudInit".into(),
            serde_json::json!(format!(
                "hostname {}, {} writeFiles, {} runCmd (not shown: the cluster's secrets)",
                text(&ci["hostname"]),
                count("writeFiles"),
                count("runCmd")
            )),
        );
        out.push_str(&format!(
            "\n\nspec of Kairon Machine {}:\n{}",
            vm.metadata.name.clone().unwrap_or_default(),
            serde_yaml_like(&Value::Object(shown), 1)
        ));
    }
    Ok(out)
}

/// A JSON value as indented YAML-like text (maps and lists; scalars as JSON).
fn serde_yaml_like(v: &Value, depth: usize) -> String {
    let pad = "  ".repeat(depth);
    match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::Object(_) | Value::Array(_) => format!("{pad}{k}:\n{}", serde_yaml_like(v, depth + 1)),
                scalar => format!("{pad}{k}: {scalar}"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Array(items) => items
            .iter()
            .map(|i| format!("{pad}- {}", serde_yaml_like(i, depth + 1).trim_start()))
            .collect::<Vec<_>>()
            .join("\n"),
        scalar => format!("{pad}{scalar}"),
    }
}

/// Redraws the table in place on a terminal; prints it on change otherwise.
struct Progress {
    tty: bool,
    last: String,
    lines: usize,
    enabled: bool,
}

impl Progress {
    fn show(&mut self, text: &str, status: &str) {
        if !self.enabled {
            return;
        }
        let mut out = std::io::stdout().lock();
        if self.tty {
            if self.lines > 0 {
                let _ = write!(out, "\x1b[{}A\x1b[J", self.lines);
            }
            let _ = writeln!(out, "{status}\n{text}");
            self.lines = text.lines().count() + 1;
        } else if text != self.last {
            let _ = writeln!(out, "{status}\n{text}\n");
        }
        let _ = out.flush();
        self.last = text.to_string();
    }
}

/// Runs the demo. With `exit_when_ready` it returns once the cluster is up; otherwise it keeps
/// the environment running until the future is dropped (the binary drops it on Ctrl-C).
pub async fn run(opts: DemoOptions) -> Result<DemoReport> {
    let say = |s: &str| {
        if opts.show_progress {
            println!("{s}");
        }
    };
    say("Starting etcd, kube-apiserver, kube-controller-manager and the Cluster API managers ...");
    let env = Env::start(EnvOptions::new("demo")).await?;
    let env_startup = env.startup_time();
    say(&format!("Management cluster up in {:.1}s.", env_startup.as_secs_f64()));

    let result = run_in(&env, &opts, env_startup).await;
    if result.is_err() {
        env.dump();
    }
    result
}

async fn run_in(env: &Env, opts: &DemoOptions, env_startup: Duration) -> Result<DemoReport> {
    let say = |s: &str| {
        if opts.show_progress {
            println!("{s}");
        }
    };
    let net = GuestNetwork::pick();
    let mut sim_args = opts.simulator_args.clone();
    sim_args.extend(guest_simulator_args(env.binaries(), &env.dir().join("guests"), &net)?);
    let sim: Process = env.start_simulator(&sim_args)?;
    let manager: Process = env.start_manager(&opts.manager_args)?;
    env.create_namespace(NAMESPACE).await?;
    let repo = ClusterctlRepo::create(&env.dir().join("clusterctl"), env.binaries())?;
    let manifests = repo.generate_cluster(
        CLUSTER,
        NAMESPACE,
        "",
        KUBERNETES_VERSION,
        CONTROL_PLANES as u32,
        WORKERS as u32,
        &net.endpoint_ip(1),
    )?;
    let file = env.dir().join("demo-cluster.yaml");
    std::fs::write(&file, &manifests).context("writing the generated cluster")?;
    let applied_at = Instant::now();
    let out = std::process::Command::new(&env.binaries().kubectl)
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(["apply", "-f"])
        .arg(&file)
        .output()
        .context("running kubectl apply")?;
    if !out.status.success() {
        bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    say(&format!(
        "Created Cluster {NAMESPACE}/{CLUSTER} from the default flavor (clusterctl generate cluster, kairon {VERSION}): \
         KubeadmControlPlane of {CONTROL_PLANES} + MachineDeployment of {WORKERS} workers, endpoint {}:6443.\n",
        net.endpoint_ip(1)
    ));

    let mut progress = Progress {
        tty: std::io::stdout().is_terminal(),
        last: String::new(),
        lines: 0,
        enabled: opts.show_progress,
    };
    let rows = loop {
        for (p, what) in [(&sim, "kairon-sim"), (&manager, "capkr-manager")] {
            if let Some(status) = p.try_exit_status() {
                bail!("{what}: {}", p.exit_report(status, 30));
            }
        }
        let rows = match machine_rows(env, NAMESPACE, CLUSTER).await {
            Ok(r) => r,
            Err(e) => {
                progress.show(&format!("(listing machines failed: {e:#})"), "");
                Vec::new()
            }
        };
        let elapsed = applied_at.elapsed();
        let up = rows.iter().filter(|r| r.is_up()).count();
        progress.show(
            &render_table(&rows),
            &format!(
                "[{:>5.1}s] {up}/{} Machines Running with a Node",
                elapsed.as_secs_f64(),
                CONTROL_PLANES + WORKERS
            ),
        );
        if rows.len() == CONTROL_PLANES + WORKERS && up == rows.len() {
            break rows;
        }
        if elapsed > opts.timeout {
            bail!(
                "the demo cluster did not come up within {:?} ({up}/{} Machines Running with a Node){}",
                opts.timeout,
                CONTROL_PLANES + WORKERS,
                if rows.iter().all(|r| r.phase == "Provisioning" || r.phase == "Pending") {
                    "; is the Kairon simulator functional?"
                } else {
                    ""
                }
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let time_to_ready = applied_at.elapsed();
    let report = DemoReport {
        env_startup,
        time_to_ready,
        machines: rows,
    };
    say(&format!(
        "\nCluster {CLUSTER} is up: {} Machines Running with nodeRefs, {:.1}s after it was created \
         (management cluster start: {:.1}s).",
        report.machines.len(),
        time_to_ready.as_secs_f64(),
        env_startup.as_secs_f64()
    ));
    match kairon_machines_summary(env, NAMESPACE).await {
        Ok(summary) => say(&format!("\nThe Kairon Machines, as Kairon shows them:\n{summary}")),
        Err(e) => say(&format!("\n(listing the Kairon Machines failed: {e:#})")),
    }
    if opts.exit_when_ready {
        return Ok(report);
    }
    let kubectl = env.binaries().kubectl.display().to_string();
    let kc = env.kubeconfig_path().display().to_string();
    let clusterctl = format!(
        "XDG_CONFIG_HOME={0}/xdg CLUSTERCTL_DISABLE_VERSIONCHECK=true {1} --config {0}/clusterctl.yaml",
        repo.dir.display(),
        env.binaries().clusterctl.display()
    );
    let workload_kc = env.dir().join("demo-workload.kubeconfig");
    let sim = crate::own_binary("kairon-sim", "KAIRON_SIM_BIN")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "kairon-sim".into());
    say(&format!(
        "\nTry (the files go away when the demo stops):\n  \
         {kubectl} --kubeconfig {kc} get clusters,kubeadmcontrolplanes,machines.cluster.x-k8s.io,kaironmachines -n {NAMESPACE}\n  \
         {kubectl} --kubeconfig {kc} get machines.kairon.zyvor.dev -n {NAMESPACE} -o wide\n  \
         {clusterctl} describe cluster {CLUSTER} -n {NAMESPACE} --kubeconfig {kc}\n  \
         {kubectl} --kubeconfig {kc} scale machinedeployment {CLUSTER}-md-0 -n {NAMESPACE} --replicas=3\n  \
         {clusterctl} get kubeconfig {CLUSTER} -n {NAMESPACE} --kubeconfig {kc} > {wk}\n  \
         {kubectl} --kubeconfig {wk} get nodes,pods -A -o wide\n\n\
         Run a workload in it (the workload cluster schedules Pods; KWOK plays the kubelets):\n  \
         {kubectl} --kubeconfig {wk} create deployment web --image=registry.k8s.io/pause:3.10 --replicas=6\n  \
         {kubectl} --kubeconfig {wk} create poddisruptionbudget web --selector=app=web --max-unavailable=1\n  \
         {kubectl} --kubeconfig {wk} get pods -o wide --watch        # in another terminal\n  \
         {kubectl} --kubeconfig {kc} scale machinedeployment {CLUSTER}-md-0 -n {NAMESPACE} --replicas=1\n\
         Each worker that goes is drained first: its Pods are evicted one at a time, as the \
         PodDisruptionBudget allows, and Running again on the remaining Nodes; then its VM is deleted.\n\n\
         Host maintenance (docs/host-maintenance.md): Kairon's hosts are the Nodes of its cluster \
         (here the management cluster's). Move a VM live, as an operator's MachineMigration does (the \
         same VM on another node; nothing in the cluster notices):\n  \
         {kubectl} --kubeconfig {kc} get nodes -L topology.kairon.zyvor.dev/zone\n  \
         {kubectl} --kubeconfig {kc} create -n {NAMESPACE} -f - <<EOF\n  \
         {{\"apiVersion\":\"kairon.zyvor.dev/v1alpha1\",\"kind\":\"MachineMigration\",\"metadata\":{{\"name\":\"move-1\"}},\
         \"spec\":{{\"machineName\":\"<a VM>\",\"strategy\":\"live\"}}}}\n  EOF\n\
         Empty a node as `kaironctl evacuate` does: Kairon skips the cluster's VMs (the provider's \
         MachineDisruptionBudgets allow it no cold migration, which would recreate them on fresh disks) \
         and the provider has CAPI replace their Machines, one at a time, Nodes drained first:\n  \
         {kubectl} --kubeconfig {kc} cordon <a node>\n  \
         {sim} --kubeconfig {kc} evacuate <the node> --wait\n  \
         {kubectl} --kubeconfig {kc} get machines.kairon.zyvor.dev -n {NAMESPACE} -o wide --watch\n  \
         {kubectl} --kubeconfig {kc} get events -n {NAMESPACE} --watch   # EvacuationRequested, ReplacementRequested, ...\n\
         `evacuate --wait` ends once the node is empty; uncordon it with `kubectl uncordon`.\n\n\
         Create clusters of your own from the shipped templates (flavors: default, md-remediation, \
         topology). Each cluster needs its own control-plane endpoint address: 127.{o}.100.2, \
         127.{o}.100.3, ... are free (VMs get addresses from {pool}):\n  \
         CONTROL_PLANE_ENDPOINT_IP=127.{o}.100.2 KAIRON_MACHINE_IMAGE=ubuntu-2404-kube-{KUBERNETES_VERSION} \\\n    \
         {clusterctl} generate cluster c2 --infrastructure kairon:{VERSION} --kubeconfig {kc} \\\n    \
         --target-namespace {NAMESPACE} --kubernetes-version {KUBERNETES_VERSION} \
         --control-plane-machine-count 3 --worker-machine-count 2 \\\n    \
         | {kubectl} --kubeconfig {kc} apply -f -\n\
         (add `--flavor topology` or `--flavor md-remediation` for the other flavors; the next cluster: \
         another name and 127.{o}.100.3).\n\
         Each control-plane VM runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler \
         (~500 MiB); one KWOK per cluster plays the kubelets (~60 MiB).\n\
         Logs: {} (VMs: {}/guests/logs)\n\nPress Ctrl-C to stop and clean up.",
        env.log_dir().display(),
        env.dir().display(),
        wk = workload_kc.display(),
        o = net.octet,
        pool = net.address_pool(),
    ));
    std::future::pending::<()>().await;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kairon_machine_spec_prints_as_yaml() {
        let spec = serde_json::json!({
            "image": {"imageRef": "ubuntu", "diskSize": "20Gi"},
            "placement": {"preferredAntiAffinity": [{"weight": 100, "topologyKey": "kubernetes.io/hostname"}]}
        });
        assert_eq!(
            serde_yaml_like(&spec, 1),
            "  image:\n    diskSize: \"20Gi\"\n    imageRef: \"ubuntu\"\n  placement:\n    preferredAntiAffinity:\n      - topologyKey: \"kubernetes.io/hostname\"\n        weight: 100"
        );
        let table = columns(&["NAME", "IP"], &[vec!["vm-1".into(), "-".into()]]);
        assert_eq!(table, "NAME  IP\nvm-1  -");
    }

    #[test]
    fn the_network_column_shows_the_mode_and_where_it_attaches() {
        let cases = [
            (serde_json::json!({}), "user"),
            (serde_json::json!({"network": {"mode": "user"}}), "user"),
            (
                serde_json::json!({"network": {"mode": "tap", "bridge": "br0", "learnIP": true}}),
                "tap/br0",
            ),
            (
                serde_json::json!({"network": {"mode": "tap", "netns": true}}),
                "tap/netns",
            ),
            (
                serde_json::json!({"network": {"mode": "macvtap", "parent": "eth1"}}),
                "macvtap/eth1",
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(network_of(&spec), want, "{spec}");
        }
    }

    #[test]
    fn sample_cluster_manifests_parse_into_eight_objects() {
        let docs = crate::manifests::parse_yaml_documents(&cluster_manifests("ns", "c", "127.0.0.1", 6443)).unwrap();
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "Cluster",
                "KaironCluster",
                "KubeadmConfig",
                "KaironMachine",
                "Machine",
                "KubeadmConfigTemplate",
                "KaironMachineTemplate",
                "MachineDeployment"
            ]
        );
        let init = &docs[2]["spec"]["initConfiguration"]["nodeRegistration"];
        assert_eq!(init["name"], "{{ ds.meta_data.local_hostname }}");
        assert_eq!(
            init["kubeletExtraArgs"][0]["value"],
            "kairon://{{ ds.meta_data.instance_id }}"
        );
        let join = &docs[5]["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"];
        assert_eq!(join["kubeletExtraArgs"][0]["name"], "provider-id");
        assert_eq!(docs[3]["spec"]["resources"]["memory"], "4Gi");
        assert_eq!(docs[6]["spec"]["template"]["spec"]["image"]["diskSize"], "20Gi");
        assert_eq!(docs[1]["spec"]["controlPlaneEndpoint"]["port"], 6443);
        assert_eq!(docs[7]["spec"]["replicas"], 2);
    }
}
