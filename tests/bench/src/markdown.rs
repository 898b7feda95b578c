//! `results.md`: the results as Markdown tables, and a short summary for the terminal.

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::results::{Percentiles, Results, SizeRun, run_label};

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
    }

    let _ = writeln!(
        o,
        "## Plots\n\n![time against N](time-vs-n.png)\n\n![peak RSS against N](rss-vs-n.png)"
    );
    o
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
