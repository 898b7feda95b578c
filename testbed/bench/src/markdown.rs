//! `results.md`: the results as Markdown tables, and a short summary for the terminal.

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::results::{ApiLimits, FullCapiRun, Percentiles, PoolPathRun, Results, SizeRun, run_label};

fn secs(s: f64) -> String {
    if s < 10.0 { format!("{s:.2}") } else { format!("{s:.1}") }
}

fn p50_p99(p: &Percentiles) -> String {
    if p.count == 0 {
        "–".into()
    } else {
        format!("{:.3} / {:.3}", p.p50, p.p99)
    }
}

fn per(x: f64) -> String {
    format!("{x:.2}")
}

/// One row of a table with a column per run.
struct Row {
    name: String,
    cell: Box<dyn Fn(&SizeRun) -> String>,
}

fn row(name: impl Into<String>, cell: impl Fn(&SizeRun) -> String + 'static) -> Row {
    Row {
        name: name.into(),
        cell: Box::new(cell),
    }
}

/// A table with one column per run.
fn table(out: &mut String, runs: &[&SizeRun], rows: &[Row]) {
    let _ = write!(out, "| |");
    for r in runs {
        let _ = write!(out, " {} |", run_label(r));
    }
    let _ = write!(out, "\n|---|");
    for _ in runs {
        let _ = write!(out, "---:|");
    }
    out.push('\n');
    for row in rows {
        let _ = write!(out, "| {} |", row.name);
        for r in runs {
            let _ = write!(out, " {} |", (row.cell)(r));
        }
        out.push('\n');
    }
    out.push('\n');
}

pub fn render(res: &Results) -> String {
    let mut o = String::new();
    let m = &res.machine;
    let v = &res.versions;
    let s = &res.settings;
    let _ = writeln!(o, "# Benchmark results\n");
    let _ = writeln!(
        o,
        "Written by `make bench` (`capkr-bench`) at {}. What the numbers mean, the targets and how to \
         reproduce them: [docs/benchmarks.md](../benchmarks.md). Raw numbers: [results.json](results.json).\n",
        res.generated_at
    );
    let _ = writeln!(o, "| | |\n|---|---|");
    let _ = writeln!(
        o,
        "| machine | {} CPUs ({}), {} GiB memory, Linux {} |",
        m.nproc, m.cpu_model, m.memory_gib, m.kernel
    );
    let _ = writeln!(o, "| manager | {} (`{}`) |", v.manager, s.manager_bin);
    let _ = writeln!(
        o,
        "| simulator | `{}` `{}` |",
        s.simulator_bin,
        s.simulator_args.join(" ")
    );
    let _ = writeln!(o, "| git commit | {} |", v.git_commit);
    let _ = writeln!(o, "| rustc | {} |", v.rustc);
    let _ = writeln!(o, "| kube-apiserver | {} |", v.kube_apiserver);
    let _ = writeln!(o, "| Cluster API | {} |", v.cluster_api);
    let _ = writeln!(
        o,
        "| settings | creates in flight {}, KaironMachine concurrency (manager and floor) {}, idle period {} s, quiet after {} s |\n",
        s.create_concurrency, s.kaironmachine_concurrency, s.idle_s, s.quiet_s
    );

    let _ = writeln!(o, "## Targets\n");
    if res.targets.is_empty() {
        let _ = writeln!(o, "No run measured a target.\n");
    } else {
        let _ = writeln!(o, "| target | run | value | |\n|---|---|---:|---|");
        for t in &res.targets {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} |",
                t.target,
                t.run,
                t.value,
                if t.met { "met" } else { "**missed**" }
            );
        }
        o.push('\n');
    }

    if !res.runs.is_empty() {
        let runs: Vec<&SizeRun> = res.runs.iter().collect();
        let _ = writeln!(o, "## Provider throughput, floor, steady state and restart\n");
        let _ = writeln!(
            o,
            "Times in seconds; requests are the manager's (the floor's where marked), per machine, from the \
             audit log; latencies p50 / p99.\n"
        );
        let verbs: BTreeSet<&String> = runs
            .iter()
            .flat_map(|r| r.provider.per_machine.by_verb.keys())
            .collect();
        let mut rows = vec![
            row("provider time", |r| secs(r.provider.wall_s)),
            row("floor time", |r| secs(r.floor.wall_s)),
            row("**provider / floor**", |r| format!("**{:.2}**", r.ratio)),
            row("creating the objects (provider run)", |r| secs(r.provider.create_s)),
            row("created → provisioned", |r| {
                p50_p99(&r.provider.created_to_provisioned)
            }),
            row("Kairon Running → provisioned", |r| {
                p50_p99(&r.provider.running_to_provisioned)
            }),
            row("floor: created → provisioned", |r| {
                p50_p99(&r.floor.created_to_provisioned)
            }),
            row("requests per machine", |r| per(r.provider.per_machine.requests)),
            row("reads per machine", |r| per(r.provider.per_machine.reads)),
            row("**writes per machine**", |r| {
                format!("**{}**", per(r.provider.per_machine.writes))
            }),
        ];
        for verb in verbs {
            let verb = verb.clone();
            rows.push(row(format!("&nbsp;&nbsp;{verb} per machine"), move |r| {
                per(r.provider.per_machine.by_verb.get(&verb).copied().unwrap_or(0.0))
            }));
        }
        rows.extend([
            row("KaironMachine versions seen per machine (create included)", |r| {
                format!(
                    "{:.2} (floor {:.2})",
                    r.provider.kaironmachine_versions, r.floor.kaironmachine_versions
                )
            }),
            row("floor: reads / writes per machine", |r| {
                format!(
                    "{} / {}",
                    per(r.floor.per_machine.reads),
                    per(r.floor.per_machine.writes)
                )
            }),
            row("manager peak RSS (MiB)", |r| format!("{:.1}", r.provider.peak_rss_mib)),
            row("manager CPU (s)", |r| secs(r.provider.cpu_s)),
            row("idle: writes / requests", |r| match &r.steady {
                Some(s) => format!("{} / {} in {:.0} s", s.requests.writes, s.requests.total, s.idle_s),
                None => "–".into(),
            }),
            row("restart: stop, then start → /readyz 200", |r| match &r.restart {
                Some(x) => format!("{} + {}", secs(x.stop_s), secs(x.ready_s)),
                None => "–".into(),
            }),
            row("restart: requests / writes until quiet", |r| match &r.restart {
                Some(x) => format!("{} / {}", x.requests.total, x.requests.writes),
                None => "–".into(),
            }),
            row("restart: peak RSS (MiB)", |r| match &r.restart {
                Some(x) => format!("{:.1}", x.peak_rss_mib),
                None => "–".into(),
            }),
        ]);
        table(&mut o, &runs, &rows);

        let _ = writeln!(o, "### The manager's requests per machine, by resource\n");
        let keys: BTreeSet<&String> = runs
            .iter()
            .flat_map(|r| r.provider.per_machine.by_resource.keys())
            .collect();
        let rows: Vec<Row> = keys
            .into_iter()
            .map(|k| {
                let k = k.clone();
                row(format!("`{k}`"), move |r| {
                    per(r.provider.per_machine.by_resource.get(&k).copied().unwrap_or(0.0))
                })
            })
            .collect();
        table(&mut o, &runs, &rows);

        let _ = writeln!(o, "Manager flags per run:\n");
        for r in &runs {
            let _ = writeln!(o, "- {}: `{}`", run_label(r), r.manager_args.join(" "));
        }
        o.push('\n');
        for r in &runs {
            let failed = &r.provider.requests.failed;
            if !failed.is_empty() {
                let _ = writeln!(
                    o,
                    "Manager requests answered with an error while provisioning ({}):\n",
                    run_label(r)
                );
                for (k, v) in failed {
                    let _ = writeln!(o, "- `{k}`: {v}");
                }
                o.push('\n');
            }
            for (what, writes) in [
                ("idle", r.steady.as_ref().map(|s| &s.writes)),
                ("restart", r.restart.as_ref().map(|s| &s.writes)),
            ] {
                if let Some(w) = writes.filter(|w| !w.is_empty()) {
                    let _ = writeln!(o, "Writes during {what} ({}):\n", run_label(r));
                    for line in w {
                        let _ = writeln!(o, "- `{line}`");
                    }
                    o.push('\n');
                }
            }
        }
    }

    if !res.full_capi.is_empty() {
        let _ = writeln!(o, "## Full CAPI path\n");
        let _ = writeln!(
            o,
            "| N | control plane Machine up (s) | MachineDeployment 0 → N, all Running with a Node (s) | manager \
             requests / writes per machine | manager peak RSS (MiB) |\n|---:|---:|---:|---:|---:|"
        );
        for r in &res.full_capi {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} / {} | {:.1} |",
                r.n,
                secs(r.control_plane_s),
                secs(r.scale_s),
                per(r.per_machine.requests),
                per(r.per_machine.writes),
                r.peak_rss_mib
            );
        }
        if let Some(r) = res.full_capi.first() {
            let _ = writeln!(o, "\nManager flags: `{}`\n", r.manager_args.join(" "));
        }
        // Without CAPD beside it (`--no-peer`), the phases are told here.
        for r in res.full_capi.iter().filter(|r| !res.peer.iter().any(|p| p.n == r.n)) {
            let _ = writeln!(o, "N={}:", r.n);
            phases_table(&mut o, &[("capkr-manager", r)]);
            o.push('\n');
        }
    }

    if !res.peer.is_empty() {
        peer_section(&mut o, res);
    }
    if !res.pool.is_empty() {
        pool_section(&mut o, res);
    }

    let _ = writeln!(
        o,
        "## Plots\n\n![time against N](time-vs-n.png)\n\n![peak RSS against N](rss-vs-n.png)"
    );
    if !res.peer.is_empty() {
        let _ = writeln!(o, "\n![capkr-manager and CAPD in-memory against N](peer-vs-n.png)");
    }
    o
}

/// Part 4 side by side with CAPD's in-memory provider: one table per N, a column per provider
/// and their ratio; then each provider's writes per machine by resource.
fn peer_section(o: &mut String, res: &Results) {
    let _ = writeln!(
        o,
        "## Side by side: capkr-manager and CAPD's in-memory provider\n\n\
         The full CAPI path with each provider, in the same run: the same cluster shape (one \
         control-plane Machine with kubeadm init data, a MachineDeployment scaled 0 → N) on the \
         same CAPI core, kubeadm bootstrap and control plane managers, each in a fresh \
         environment. Requests are the provider manager's own (audit log, by User-Agent; no \
         Leases), from the scale until it went quiet; CPU is its utime + stime over the same \
         window.\n"
    );
    type Figure = (&'static str, fn(&FullCapiRun) -> f64, fn(f64) -> String);
    let figures: [Figure; 8] = [
        (
            "MachineDeployment 0 → N, all Running with a Node (s)",
            |r| r.scale_s,
            secs,
        ),
        ("control-plane Machine up (s)", |r| r.control_plane_s, secs),
        ("requests per machine", |r| r.per_machine.requests, per),
        ("reads per machine", |r| r.per_machine.reads, per),
        ("writes per machine", |r| r.per_machine.writes, per),
        ("CPU (s)", |r| r.cpu_s, secs),
        (
            "CPU per machine (ms)",
            |r| 1000.0 * r.cpu_s / r.n.max(1) as f64,
            |x| format!("{x:.1}"),
        ),
        ("peak RSS (MiB)", |r| r.peak_rss_mib, |x| format!("{x:.1}")),
    ];
    for p in &res.peer {
        let _ = writeln!(
            o,
            "### N={}\n\n| | capkr-manager + simulator | CAPD in-memory | ours / CAPD |\n|---|---:|---:|---:|",
            p.n
        );
        for (name, f, fmt) in figures {
            let ratio = p.ratio(f).map(|x| format!("{x:.2}")).unwrap_or_else(|| "–".into());
            let _ = writeln!(o, "| {name} | {} | {} | {ratio} |", fmt(f(&p.ours)), fmt(f(&p.capd)));
        }
        let _ = writeln!(
            o,
            "\nWrites per machine by resource:\n\n| write | capkr-manager | CAPD in-memory |\n|---|---:|---:|"
        );
        let keys: BTreeSet<&String> = p
            .ours
            .per_machine
            .by_resource
            .keys()
            .chain(p.capd.per_machine.by_resource.keys())
            .filter(|k| {
                ["create ", "update ", "patch ", "delete "]
                    .iter()
                    .any(|v| k.starts_with(v))
            })
            .collect();
        for k in keys {
            let get = |r: &FullCapiRun| r.per_machine.by_resource.get(k).copied().unwrap_or(0.0);
            let _ = writeln!(o, "| `{k}` | {} | {} |", per(get(&p.ours)), per(get(&p.capd)));
        }
        environment_cpu_table(o, &p.ours, &p.capd);
        phases_table(o, &[("capkr-manager", &p.ours), ("CAPD in-memory", &p.capd)]);
        o.push('\n');
    }
    if let Some(p) = res.peer.first() {
        let _ = writeln!(
            o,
            "capkr-manager flags: `{}`; CAPD's: `{}` (its defaults otherwise: client limit 100/200, \
             50 DevMachine workers; capkr-manager's: {}/{}, 10 KaironMachine workers).\n",
            p.ours.manager_args.join(" "),
            p.capd.manager_args.join(" "),
            ApiLimits::DEFAULT.qps,
            ApiLimits::DEFAULT.burst
        );
    }
}

/// Part 6: MachinePool against MachineDeployment, one table per N, then each path's manager
/// writes by resource and every client's requests and writes per machine.
fn pool_section(o: &mut String, res: &Results) {
    let _ = writeln!(
        o,
        "## MachinePool vs MachineDeployment\n\n\
         The full CAPI path with capkr-manager, the same cluster twice: its N workers as a \
         MachineDeployment, then as a MachinePool of a KaironMachinePool (one KaironMachine, so one \
         plain Kairon Machine, per member), each in a fresh environment. Times from the scale 0 → N; requests are \
         capkr-manager's (audit log, no Leases) from the scale until it went quiet, per worker.\n"
    );
    type Figure = (&'static str, fn(&PoolPathRun) -> f64, fn(f64) -> String);
    let figures: [Figure; 10] = [
        ("**0 → N: all up** (s)", |r| r.scale_s, secs),
        ("0 → N: all Machines Running with a nodeRef (s)", |r| r.running_s, secs),
        ("0 → N: all Nodes Ready (s)", |r| r.nodes_ready_s, secs),
        ("0 → N: readyReplicas = N (s)", |r| r.ready_replicas_s, secs),
        ("control-plane Machine up (s)", |r| r.control_plane_s, secs),
        ("manager requests per machine", |r| r.per_machine.requests, per),
        ("manager reads per machine", |r| r.per_machine.reads, per),
        ("**manager writes per machine**", |r| r.per_machine.writes, per),
        ("manager CPU (s)", |r| r.cpu_s, secs),
        ("manager peak RSS (MiB)", |r| r.peak_rss_mib, |x| format!("{x:.1}")),
    ];
    for p in &res.pool {
        let _ = writeln!(
            o,
            "### N={} (measured {}, commit {})\n\n| | MachineDeployment | MachinePool | pool / deployment |\n|---|---:|---:|---:|",
            p.n, p.measured_at, p.git_commit
        );
        for (name, f, fmt) in figures {
            let ratio = p.ratio(f).map(|x| format!("{x:.2}")).unwrap_or_else(|| "–".into());
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {ratio} |",
                fmt(f(&p.deployment)),
                fmt(f(&p.pool))
            );
        }
        let _ = writeln!(
            o,
            "\nThe manager's requests per machine by resource:\n\n| request | MachineDeployment | MachinePool |\n|---|---:|---:|"
        );
        let keys: BTreeSet<&String> = p
            .deployment
            .per_machine
            .by_resource
            .keys()
            .chain(p.pool.per_machine.by_resource.keys())
            .collect();
        for k in keys {
            let get = |r: &PoolPathRun| r.per_machine.by_resource.get(k).copied().unwrap_or(0.0);
            let _ = writeln!(o, "| `{k}` | {} | {} |", per(get(&p.deployment)), per(get(&p.pool)));
        }
        let _ = writeln!(
            o,
            "\nThe manager's writes naming one worker (its KaironMachine, VM, Machine, Events), in order:\n\n\
             | # | MachineDeployment | MachinePool |\n|---:|---|---|"
        );
        let longest = p.deployment.one_machine.len().max(p.pool.one_machine.len());
        for i in 0..longest {
            let cell = |r: &PoolPathRun| r.one_machine.get(i).map(|w| format!("`{w}`")).unwrap_or_default();
            let _ = writeln!(o, "| {} | {} | {} |", i + 1, cell(&p.deployment), cell(&p.pool));
        }
        let _ = writeln!(
            o,
            "\nEvery client's requests / writes per machine in the same window:\n\n\
             | client | MachineDeployment | MachinePool |\n|---|---:|---:|"
        );
        let clients: BTreeSet<&String> = p.deployment.by_client.keys().chain(p.pool.by_client.keys()).collect();
        for c in clients {
            let cell = |r: &PoolPathRun| match r.by_client.get(c) {
                Some(m) => format!("{} / {}", per(m.requests), per(m.writes)),
                None => "–".into(),
            };
            let _ = writeln!(o, "| `{c}` | {} | {} |", cell(&p.deployment), cell(&p.pool));
        }
        o.push('\n');
    }
    if let Some(p) = res.pool.first() {
        let _ = writeln!(o, "Manager flags: `{}`\n", p.pool.manager_args.join(" "));
    }
}

/// A few lines for the terminal.
pub fn summary(res: &Results) -> String {
    let mut o = String::new();
    for r in &res.runs {
        let _ = writeln!(
            o,
            "{}: provider {} s, floor {} s, ratio {:.2}, {:.2} writes/machine, peak RSS {:.1} MiB",
            run_label(r),
            secs(r.provider.wall_s),
            secs(r.floor.wall_s),
            r.ratio,
            r.provider.per_machine.writes,
            r.provider.peak_rss_mib
        );
    }
    for r in &res.full_capi {
        let _ = writeln!(o, "full CAPI path N={}: {} s", r.n, secs(r.scale_s));
    }
    for p in &res.peer {
        let _ = writeln!(
            o,
            "side by side N={}: ours / CAPD in-memory: time {} s / {} s, writes per machine {} / {}, \
             requests per machine {} / {}, CPU {} s / {} s, peak RSS {:.1} / {:.1} MiB",
            p.n,
            secs(p.ours.scale_s),
            secs(p.capd.scale_s),
            per(p.ours.per_machine.writes),
            per(p.capd.per_machine.writes),
            per(p.ours.per_machine.requests),
            per(p.capd.per_machine.requests),
            secs(p.ours.cpu_s),
            secs(p.capd.cpu_s),
            p.ours.peak_rss_mib,
            p.capd.peak_rss_mib
        );
    }
    for p in &res.pool {
        let _ = writeln!(
            o,
            "MachinePool vs MachineDeployment N={}: up {} s / {} s, manager writes per machine {} / {}, \
             requests per machine {} / {}, CPU {} s / {} s, peak RSS {:.1} / {:.1} MiB",
            p.n,
            secs(p.pool.scale_s),
            secs(p.deployment.scale_s),
            per(p.pool.per_machine.writes),
            per(p.deployment.per_machine.writes),
            per(p.pool.per_machine.requests),
            per(p.deployment.per_machine.requests),
            secs(p.pool.cpu_s),
            secs(p.deployment.cpu_s),
            p.pool.peak_rss_mib,
            p.deployment.peak_rss_mib
        );
    }
    for t in &res.targets {
        let _ = writeln!(
            o,
            "target {} [{}]: {} ({})",
            t.target,
            t.run,
            if t.met { "met" } else { "MISSED" },
            t.value
        );
    }
    o
}

/// Where each worker's time went with each provider (`columns`: its name and its run): median
/// CPU of every process of each environment over the scale's window, by process name, with
/// the sum (nothing when the run predates the figure).
fn environment_cpu_table(o: &mut String, ours: &FullCapiRun, capd: &FullCapiRun) {
    if ours.environment_cpu_s.is_empty() && capd.environment_cpu_s.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nCPU of every process of the environment over the same window (s; the simulator plays \
         Kairon for ours, CAPD's in-memory backend runs inside its manager):\n\n| process | \
         capkr-manager + simulator | CAPD in-memory |\n|---|---:|---:|"
    );
    let names: BTreeSet<&String> = ours
        .environment_cpu_s
        .keys()
        .chain(capd.environment_cpu_s.keys())
        .collect();
    let cell = |r: &FullCapiRun, name: &String| {
        r.environment_cpu_s
            .get(name)
            .map_or_else(|| "–".to_string(), |s| format!("{s:.1}"))
    };
    for name in names {
        let _ = writeln!(o, "| {name} | {} | {} |", cell(ours, name), cell(capd, name));
    }
    let sum = |r: &FullCapiRun| r.environment_cpu_s.values().sum::<f64>();
    let _ = writeln!(o, "| **all** | **{:.1}** | **{:.1}** |", sum(ours), sum(capd));
}

/// and p99 of every phase, from the end of the phase before (crate::phases).
fn phases_table(o: &mut String, columns: &[(&str, &FullCapiRun)]) {
    if columns.iter().all(|(_, r)| r.phases.is_empty()) {
        return;
    }
    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    let _ = writeln!(
        o,
        "\nWhere each worker's time went, phase by phase from the end of the one before (median / \
         p99 in seconds; creates timed by the audit log, ends marked * read from objects' \
         timestamps, to the second):\n\n| until | whose | {} |\n|---|---|{}",
        names.join(" | "),
        "---:|".repeat(columns.len())
    );
    let mut untils: Vec<&crate::results::Phase> = Vec::new();
    for x in columns.iter().flat_map(|(_, r)| &r.phases) {
        if !untils.iter().any(|u| u.until == x.until) {
            untils.push(x);
        }
    }
    for phase in untils {
        let mark = if phase.whole_seconds { " *" } else { "" };
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, r)| {
                r.phases
                    .iter()
                    .find(|x| x.until == phase.until)
                    .map(|x| format!("{:.2} / {:.2}", x.latency.p50, x.latency.p99))
                    .unwrap_or_else(|| "–".into())
            })
            .collect();
        let _ = writeln!(o, "| {}{mark} | {} | {} |", phase.until, phase.by, cells.join(" | "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Phase;

    fn run(phases: &[(&str, f64, bool)]) -> FullCapiRun {
        FullCapiRun {
            n: 2,
            manager_args: vec![],
            control_plane_s: 1.0,
            scale_s: 9.0,
            requests: Default::default(),
            per_machine: Default::default(),
            peak_rss_mib: 1.0,
            cpu_s: 1.0,
            phases: phases
                .iter()
                .map(|(until, p50, whole_seconds)| Phase {
                    until: until.to_string(),
                    by: "who".into(),
                    latency: Percentiles::of(&[*p50, 2.0 * p50]),
                    whole_seconds: *whole_seconds,
                })
                .collect(),
            environment_cpu_s: Default::default(),
        }
    }

    #[test]
    fn environment_cpu_is_told_per_process_with_a_dash_where_one_has_none_and_the_sum() {
        let mut ours = run(&[]);
        ours.environment_cpu_s = [("kube-apiserver".to_string(), 10.0), ("kairon-sim".to_string(), 2.5)].into();
        let mut capd = run(&[]);
        capd.environment_cpu_s = [("kube-apiserver".to_string(), 8.0), ("capd-manager".to_string(), 6.0)].into();
        let mut o = String::new();
        environment_cpu_table(&mut o, &ours, &capd);
        assert!(o.contains("| kube-apiserver | 10.0 | 8.0 |"), "{o}");
        assert!(o.contains("| kairon-sim | 2.5 | – |"), "{o}");
        assert!(o.contains("| capd-manager | – | 6.0 |"), "{o}");
        assert!(o.contains("| **all** | **12.5** | **14.0** |"), "{o}");
        let mut none = String::new();
        environment_cpu_table(&mut none, &run(&[]), &run(&[]));
        assert!(none.is_empty(), "runs without the figure get no table: {none}");
    }

    #[test]
    fn phases_are_told_per_provider_with_a_dash_where_one_has_none() {
        let ours = run(&[
            ("Machine created", 1.0, false),
            ("VM created", 0.5, false),
            ("all of it", 4.0, true),
        ]);
        let capd = run(&[("Machine created", 2.0, false), ("all of it", 5.0, true)]);
        let mut o = String::new();
        phases_table(&mut o, &[("capkr-manager", &ours), ("CAPD in-memory", &capd)]);
        assert!(
            o.contains("| until | whose | capkr-manager | CAPD in-memory |\n|---|---|---:|---:|"),
            "{o}"
        );
        assert!(
            o.contains("| Machine created | who | 1.00 / 2.00 | 2.00 / 4.00 |"),
            "{o}"
        );
        assert!(o.contains("| VM created | who | 0.50 / 1.00 | – |"), "{o}");
        assert!(o.contains("| all of it * | who | 4.00 / 8.00 | 5.00 / 10.00 |"), "{o}");

        // One provider alone (`--no-peer`): one column; no phases, no table.
        let mut o = String::new();
        phases_table(&mut o, &[("capkr-manager", &ours)]);
        assert!(o.contains("| until | whose | capkr-manager |\n|---|---|---:|"), "{o}");
        let mut o = String::new();
        phases_table(&mut o, &[("capkr-manager", &run(&[]))]);
        assert!(o.is_empty(), "{o}");
    }
}
