//! The PNG plots: time against N, the manager's peak RSS against N, and part 4 side by side
//! with CAPD's in-memory provider. Text is drawn with a TrueType font read from a file (no
//! fontconfig): DejaVu Sans, which Debian's `fonts-dejavu-core` installs, unless `--font` names
//! another.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;

use crate::results::{FullCapiRun, Results};

const FAMILY: &str = "sans-serif";

/// Places DejaVu Sans is found on common distributions.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
];

/// Proof that the plots' font is registered.
#[derive(Clone, Debug)]
pub struct Font {
    pub path: PathBuf,
}

/// Registers the font for the plots; an error that says what to install when there is none.
pub fn load_font(path: Option<&Path>) -> Result<Font> {
    static LOADED: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| register(path).map_err(|e| format!("{e:#}")));
    match loaded {
        Ok(p) => Ok(Font { path: p.clone() }),
        Err(e) => Err(anyhow!("{e}")),
    }
}

fn register(path: Option<&Path>) -> Result<PathBuf> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => FONT_CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                anyhow!(
                    "no font for the plots: none of {} exists; install Debian's fonts-dejavu-core \
                     (apt-get install fonts-dejavu-core) or pass --font <file.ttf>",
                    FONT_CANDIDATES.join(", ")
                )
            })?,
    };
    let bytes = std::fs::read(&path).with_context(|| format!("reading the font {}", path.display()))?;
    // The plotting library keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FAMILY, FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a TrueType font", path.display()))?;
    Ok(path)
}

/// Distinct colours that read well on white.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

/// Log-scale bounds around `values` with some room.
fn log_bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let v: Vec<f64> = values.filter(|x| x.is_finite() && *x > 0.0).collect();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    (!v.is_empty()).then(|| (lo / 1.6, hi * 1.6))
}

/// A label on the N axis at 1, 2 and 5 times a power of ten only: on a log axis the other
/// ticks crowd into each other (`9001000`).
fn n_label(x: &f64) -> String {
    let mantissa = x / 10f64.powf(x.log10().floor());
    if [1.0, 2.0, 5.0, 10.0].iter().any(|m| (mantissa - m).abs() < 0.05) {
        format!("{x:.0}")
    } else {
        String::new()
    }
}

fn draw_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing: {e}")
}

/// Provider and floor time for each client limit, and the full CAPI path, against N.
pub fn time_vs_n(results: &Results, path: &Path, _font: &Font) -> Result<()> {
    let mut series = Vec::new();
    for limits in &results.settings.limits {
        let runs = results.runs.iter().filter(|r| r.limits == *limits);
        series.push(Series {
            label: format!("provider, {limits}"),
            points: runs.clone().map(|r| (r.n as f64, r.provider.wall_s)).collect(),
        });
        series.push(Series {
            label: format!("floor, {limits}"),
            points: runs.map(|r| (r.n as f64, r.floor.wall_s)).collect(),
        });
    }
    series.push(Series {
        label: "full CAPI path (MachineDeployment 0 -> N)".into(),
        points: results.full_capi.iter().map(|r| (r.n as f64, r.scale_s)).collect(),
    });
    series.retain(|s| !s.points.is_empty());
    let all = || series.iter().flat_map(|s| s.points.iter());
    let Some((x0, x1)) = log_bounds(all().map(|p| p.0)) else {
        return empty(path, "Time until N machines are provisioned");
    };
    let (y0, y1) = log_bounds(all().map(|p| p.1)).unwrap_or((0.1, 10.0));
    // Room above the data for the legend.
    let y1 = y1 * 6.0;

    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Time until N machines are provisioned", (FAMILY, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("machines (N)")
        .y_desc("seconds")
        .x_label_formatter(&n_label)
        .light_line_style(WHITE)
        .y_label_formatter(&|y| {
            if *y >= 10.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.1}")
            }
        })
        .label_style((FAMILY, 14))
        .draw()
        .map_err(draw_err)?;
    draw_series(&mut chart, &series)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

/// The manager's peak RSS after provisioning (and after a restart) against N, with the
/// 64 MiB target.
pub fn rss_vs_n(results: &Results, path: &Path, _font: &Font) -> Result<()> {
    let mut series = Vec::new();
    for limits in &results.settings.limits {
        series.push(Series {
            label: format!("provisioning, {limits}"),
            points: results
                .runs
                .iter()
                .filter(|r| r.limits == *limits)
                .map(|r| (r.n as f64, r.provider.peak_rss_mib))
                .collect(),
        });
    }
    series.push(Series {
        label: "full CAPI path".into(),
        points: results.full_capi.iter().map(|r| (r.n as f64, r.peak_rss_mib)).collect(),
    });
    series.push(Series {
        label: "after a restart".into(),
        points: results
            .runs
            .iter()
            .filter_map(|r| Some((r.n as f64, r.restart.as_ref()?.peak_rss_mib)))
            .collect(),
    });
    series.retain(|s| !s.points.is_empty());
    let Some((x0, x1)) = log_bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.0))) else {
        return empty(path, "capkr-manager peak RSS (VmHWM)");
    };
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(64.0, f64::max)
        * 1.6;

    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("capkr-manager peak RSS (VmHWM)", (FAMILY, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((x0..x1).log_scale(), 0.0..top)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("machines (N)")
        .y_desc("MiB")
        .x_label_formatter(&n_label)
        .light_line_style(WHITE)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FAMILY, 14))
        .draw()
        .map_err(draw_err)?;
    chart
        .draw_series(LineSeries::new([(x0, 64.0), (x1, 64.0)], RED.stroke_width(1)))
        .map_err(draw_err)?
        .label("target: 64 MiB at N=5000")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], RED.stroke_width(1)));
    draw_series(&mut chart, &series)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

/// A plot without data: the title and a note.
fn empty(path: &Path, title: &str) -> Result<()> {
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let root = root.titled(title, (FAMILY, 24)).map_err(draw_err)?;
    root.draw_text("no run measured this", &(FAMILY, 18).into_text_style(&root), (380, 260))
        .map_err(draw_err)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

type Chart<'a, Y> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<plotters::coord::combinators::LogCoord<f64>, Y>>;

fn draw_series<Y>(chart: &mut Chart<'_, Y>, series: &[Series]) -> Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
            .map_err(draw_err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
        chart
            .draw_series(s.points.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Part 4 side by side: capkr-manager with the simulator and CAPD's in-memory provider against
/// N, in four panels: time from the scale to all Machines Running, the provider manager's
/// writes per machine, its CPU seconds and its peak RSS.
pub fn peer_vs_n(results: &Results, path: &Path, _font: &Font) -> Result<()> {
    let title = "capkr-manager and CAPD in-memory, MachineDeployment 0 -> N";
    let Some((x0, x1)) = log_bounds(results.peer.iter().map(|p| p.n as f64)) else {
        return empty(path, title);
    };
    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let root = root.titled(title, (FAMILY, 24)).map_err(draw_err)?;
    type Figure = (&'static str, &'static str, fn(&FullCapiRun) -> f64);
    let panels: [Figure; 4] = [
        ("time to all Machines Running", "seconds", |r| r.scale_s),
        ("provider writes per machine", "writes", |r| r.per_machine.writes),
        ("provider CPU (user + system)", "seconds", |r| r.cpu_s),
        ("provider peak RSS (VmHWM)", "MiB", |r| r.peak_rss_mib),
    ];
    for (area, (name, unit, f)) in root.split_evenly((2, 2)).iter().zip(panels) {
        let series = [
            Series {
                label: "capkr-manager + simulator".into(),
                points: results.peer.iter().map(|p| (p.n as f64, f(&p.ours))).collect(),
            },
            Series {
                label: "CAPD in-memory".into(),
                points: results.peer.iter().map(|p| (p.n as f64, f(&p.capd))).collect(),
            },
        ];
        let top = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max)
            .max(f64::EPSILON)
            * 1.5;
        let mut chart = ChartBuilder::on(area)
            .caption(name, (FAMILY, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d((x0..x1).log_scale(), 0.0..top)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("machines (N)")
            .y_desc(unit)
            .x_label_formatter(&n_label)
            .light_line_style(WHITE)
            .y_label_formatter(&|y| {
                if top >= 10.0 {
                    format!("{y:.0}")
                } else {
                    format!("{y:.1}")
                }
            })
            .label_style((FAMILY, 13))
            .draw()
            .map_err(draw_err)?;
        draw_series(&mut chart, &series)?;
    }
    root.present().map_err(draw_err)?;
    Ok(())
}
