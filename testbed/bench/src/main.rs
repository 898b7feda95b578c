//! `capkr-bench`: see the library docs and docs/benchmarks.md. `make bench` builds the release
//! binaries and runs this with `--out-dir docs/bench`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use capkr_bench::Options;
use capkr_bench::results::{ApiLimits, Results};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "capkr-bench",
    about = "Scale benchmark of capkr-manager against the real control plane"
)]
struct Args {
    /// Machines of the provider, floor, steady-state and restart parts (space or comma separated).
    #[arg(long, default_value = "100 1000")]
    sizes: String,

    /// Client-side limits `qps/burst` of the manager and the floor, `0` for none (space or comma
    /// separated). Steady state and restart are measured with the first.
    #[arg(long, default_value = "100/200 0")]
    limits: String,

    /// Workers of the full CAPI path (space or comma separated; empty or 0 skips it).
    #[arg(long, default_value = "100 1000")]
    capi_sizes: String,

    /// Workers of the MachinePool-against-MachineDeployment part (space or comma separated;
    /// empty or 0 skips it).
    #[arg(long, default_value = "100 1000")]
    pool_sizes: String,

    /// Run the full CAPI path with capkr-manager only, not also with CAPD's in-memory provider.
    #[arg(long)]
    no_peer: bool,

    /// Seconds without any change during which the manager's writes are counted.
    #[arg(long, default_value_t = 120.0)]
    idle: f64,

    /// Seconds without a request after which a client counts as quiet.
    #[arg(long, default_value_t = 3.0)]
    quiet: f64,

    /// Creates in flight while the benchmark makes the machines.
    #[arg(long, default_value_t = 32)]
    create_concurrency: usize,

    /// The manager's --kaironmachine-concurrency, and the floor client's concurrency.
    #[arg(long, default_value_t = 10)]
    kaironmachine_concurrency: usize,

    /// An extra manager flag for the provider parts (repeatable), e.g. --manager-arg=--v=1.
    #[arg(long = "manager-arg", allow_hyphen_values = true)]
    manager_args: Vec<String>,

    /// Run client limits other than `0` only for sizes up to this (e.g. 1000, to add N=5000
    /// without a client limit only).
    #[arg(long)]
    limited_max: Option<usize>,

    /// Where results.json, results.md and the plots go.
    #[arg(long, default_value = "docs/bench")]
    out_dir: PathBuf,

    /// A TrueType font for the plots (default: DejaVu Sans from Debian's fonts-dejavu-core).
    #[arg(long)]
    font: Option<PathBuf>,

    /// Run nothing: check the targets and write results.md and the plots again from this
    /// results.json (e.g. one merged from several runs).
    #[arg(long)]
    render: Option<PathBuf>,
}

/// A list separated by spaces or commas.
fn parse_list<T: std::str::FromStr<Err: std::fmt::Display>>(flag: &str, s: &str) -> Result<Vec<T>> {
    s.split([' ', ','])
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse::<T>().map_err(|e| anyhow::anyhow!("{flag}: {p:?}: {e}")))
        .collect()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(json) = &args.render {
        let text = std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
        let mut results: Results =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
        // Checked again: results merged from several runs, or targets stated anew.
        results.targets = capkr_bench::results::check_targets(&results.runs);
        let font = capkr_bench::plot::load_font(args.font.as_deref())?;
        std::fs::create_dir_all(&args.out_dir)?;
        return capkr_bench::write_results(&results, &args.out_dir, &font);
    }
    let opts = Options {
        sizes: parse_list::<usize>("--sizes", &args.sizes)?
            .into_iter()
            .filter(|n| *n > 0)
            .collect(),
        limits: parse_list::<ApiLimits>("--limits", &args.limits)?,
        capi_sizes: parse_list::<usize>("--capi-sizes", &args.capi_sizes)?
            .into_iter()
            .filter(|n| *n > 0)
            .collect(),
        peer: !args.no_peer,
        pool_sizes: parse_list::<usize>("--pool-sizes", &args.pool_sizes)?
            .into_iter()
            .filter(|n| *n > 0)
            .collect(),
        create_concurrency: args.create_concurrency,
        kaironmachine_concurrency: args.kaironmachine_concurrency,
        idle: Duration::from_secs_f64(args.idle.max(0.0)),
        quiet: Duration::from_secs_f64(args.quiet.max(0.1)),
        limited_max: args.limited_max,
        manager_args: args.manager_args,
        out_dir: args.out_dir,
        font: args.font,
    };
    if opts.limits.is_empty() && !opts.sizes.is_empty() {
        anyhow::bail!("--limits is empty");
    }
    let results = capkr_bench::run(&opts).await?;
    print!("{}", capkr_bench::markdown::summary(&results));
    Ok(())
}
