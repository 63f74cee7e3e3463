//! The report's PNG plots (800 × 450, bitmap backend, DejaVu Sans compiled
//! in through the `dejavu` crate so that rendering needs no system font).

use std::path::Path;
use std::sync::Once;

use anyhow::anyhow;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use qos_core::sim::experiments::{DynamicRun, Experiment, SuiteResult};
use qos_core::sim::schedulers::SchedulerKind;
use qos_core::IoKind;

const WIDTH: u32 = 800;
const HEIGHT: u32 = 450;
const FONT: &str = "sans-serif";

/// One image written for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// What it shows, to find it again (e.g. `fairness/fairness-sizes-clean`).
    pub key: String,
    /// File name inside the image directory.
    pub file: String,
}

fn register_font() {
    static FONT_ONCE: Once = Once::new();
    FONT_ONCE.call_once(|| {
        // A failure shows up as an error from the first text drawn.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

trait PlotResult<T> {
    fn plot_err(self) -> anyhow::Result<T>;
}

impl<T, E: std::fmt::Display> PlotResult<T> for Result<T, E> {
    fn plot_err(self) -> anyhow::Result<T> {
        self.map_err(|e| anyhow!("plotting: {e}"))
    }
}

/// The colour of a scheme in every plot.
fn scheme_color(kind: SchedulerKind) -> RGBColor {
    match kind {
        SchedulerKind::Fifo => RGBColor(128, 128, 128),
        SchedulerKind::Reflex => RGBColor(230, 145, 56),
        SchedulerKind::Parda => RGBColor(76, 160, 90),
        SchedulerKind::FlashFq => RGBColor(150, 100, 190),
        SchedulerKind::Gimbal => RGBColor(40, 100, 200),
    }
}

const GROUP_COLORS: [RGBColor; 2] = [RGBColor(40, 100, 200), RGBColor(215, 70, 60)];

/// Draws every plot of the report into `dir`.
pub fn draw_all(suite: &SuiteResult, dir: &Path) -> anyhow::Result<Vec<Image>> {
    register_font();
    let mut images = Vec::new();
    let mut add = |key: String, file: String| {
        images.push(Image { key, file });
    };

    let file = "utilization.png".to_string();
    draw_utilization(&suite.utilization, &dir.join(&file))?;
    add("utilization".into(), file);

    for e in &suite.fairness {
        let file = format!("{}.png", e.id);
        draw_fairness(e, &dir.join(&file))?;
        add(format!("fairness/{}", e.id), file);
        let file = format!("{}-latency.png", e.id);
        draw_latency(e, &dir.join(&file))?;
        add(format!("latency/{}", e.id), file);
    }

    if let Some(dynamic) = &suite.dynamic {
        for run in &dynamic.runs {
            let stem = format!(
                "dynamic-{}-{:?}",
                run.scheduler.name().to_lowercase(),
                run.device
            )
            .to_lowercase();
            let file = format!("{stem}-bandwidth.png");
            draw_dynamic_bandwidth(run, &dynamic.workers, &dir.join(&file))?;
            add(format!("dynamic-bandwidth/{stem}"), file);
            let file = format!("{stem}-latency.png");
            draw_dynamic_latency(run, &dir.join(&file))?;
            add(format!("dynamic-latency/{stem}"), file);
        }
    }
    Ok(images)
}

/// A grouped bar chart: one group of bars per category, one bar per series.
struct Bars {
    title: String,
    y_desc: String,
    categories: Vec<String>,
    /// (legend, colour, value per category)
    series: Vec<(String, RGBColor, Vec<f64>)>,
    /// Plot log10 of the values (latencies in µs).
    log_y: bool,
    /// A dashed horizontal line (e.g. the ideal f-Util of 1).
    reference: Option<f64>,
}

fn format_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.0} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn draw_bars(path: &Path, bars: &Bars) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).plot_err()?;
    let transform = |v: f64| if bars.log_y { v.max(1.0).log10() } else { v };
    let max = bars
        .series
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .map(transform)
        .fold(bars.reference.map_or(0.0, transform), f64::max);
    let y_max = if bars.log_y {
        max.ceil().max(1.0) + 0.3
    } else {
        (max * 1.25).max(0.1)
    };
    let n = bars.categories.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(&bars.title, (FONT, 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n, 0f64..y_max)
        .plot_err()?;
    let log_y = bars.log_y;
    let label = move |v: &f64| {
        if log_y {
            format_us(10f64.powf(*v))
        } else {
            format!("{v:.2}")
        }
    };
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(bars.y_desc.as_str())
        .y_label_formatter(&label)
        .y_labels(if bars.log_y {
            y_max.floor() as usize + 1
        } else {
            8
        })
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .draw()
        .plot_err()?;
    let k = bars.series.len().max(1) as f64;
    let width = 0.8 / k;
    for (j, (name, color, values)) in bars.series.iter().enumerate() {
        let color = *color;
        let rects = values.iter().enumerate().map(move |(i, &v)| {
            let x0 = i as f64 + 0.1 + j as f64 * width;
            Rectangle::new(
                [(x0, 0.0), (x0 + width * 0.92, transform(v))],
                color.filled(),
            )
        });
        chart
            .draw_series(rects)
            .plot_err()?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    if let Some(r) = bars.reference {
        let r = transform(r);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, r), (n, r)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .plot_err()?;
    }
    for (i, name) in bars.categories.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        root.draw(&Text::new(
            name.clone(),
            (px, py + 6),
            TextStyle::from((FONT, 14)).pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .plot_err()?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()
        .plot_err()?;
    root.present().plot_err()?;
    Ok(())
}

fn short_case(id: &str) -> String {
    match id {
        "utilization-clean-read" => "C-R (128K read)".into(),
        "utilization-clean-write" => "C-W (128K write)".into(),
        "utilization-fragmented-read" => "F-R (4K read)".into(),
        "utilization-fragmented-write" => "F-W (4K write)".into(),
        other => other.into(),
    }
}

fn draw_utilization(experiments: &[Experiment], path: &Path) -> anyhow::Result<()> {
    let series = SchedulerKind::ALL
        .iter()
        .map(|&kind| {
            let values = experiments
                .iter()
                .map(|e| e.of(kind).map_or(0.0, |s| s.utilization))
                .collect();
            (kind.name().to_string(), scheme_color(kind), values)
        })
        .collect();
    draw_bars(
        path,
        &Bars {
            title: "§5.2 Utilization: 16 identical workers".into(),
            y_desc: "bandwidth / standalone maximum".into(),
            categories: experiments.iter().map(|e| short_case(&e.id)).collect(),
            series,
            log_y: false,
            reference: Some(1.0),
        },
    )
}

fn draw_fairness(e: &Experiment, path: &Path) -> anyhow::Result<()> {
    let groups: Vec<String> = e.composition.iter().map(|(w, _)| w.label()).collect();
    let series = groups
        .iter()
        .enumerate()
        .map(|(g, label)| {
            let values = e
                .schedulers
                .iter()
                .map(|s| s.groups.get(g).map_or(0.0, |x| x.f_util_mean))
                .collect();
            (
                format!("{label} ×{}", e.composition[g].1),
                GROUP_COLORS[g % GROUP_COLORS.len()],
                values,
            )
        })
        .collect();
    draw_bars(
        path,
        &Bars {
            title: format!("§5.3 f-Util per worker, {} ({})", e.id, e.device.name()),
            y_desc: "mean f-Util of the group (ideal 1)".into(),
            categories: e
                .schedulers
                .iter()
                .map(|s| s.scheduler.name().to_string())
                .collect(),
            series,
            log_y: false,
            reference: Some(1.0),
        },
    )
}

fn draw_latency(e: &Experiment, path: &Path) -> anyhow::Result<()> {
    let mut series = Vec::new();
    for (i, kind) in [IoKind::Read, IoKind::Write].into_iter().enumerate() {
        let summaries: Vec<_> = e
            .schedulers
            .iter()
            .map(|s| match kind {
                IoKind::Read => s.read_latency,
                IoKind::Write => s.write_latency,
            })
            .collect();
        if summaries.iter().all(|l| l.count == 0) {
            continue;
        }
        let name = match kind {
            IoKind::Read => "read",
            IoKind::Write => "write",
        };
        series.push((
            format!("{name} p99"),
            GROUP_COLORS[i],
            summaries.iter().map(|l| l.p99_us).collect(),
        ));
        series.push((
            format!("{name} p50"),
            GROUP_COLORS[i].mix(0.45).to_rgba().rgb_color(),
            summaries.iter().map(|l| l.p50_us).collect(),
        ));
    }
    draw_bars(
        path,
        &Bars {
            title: format!("§5.4 end-to-end latency, {} ({})", e.id, e.device.name()),
            y_desc: "latency (log scale)".into(),
            categories: e
                .schedulers
                .iter()
                .map(|s| s.scheduler.name().to_string())
                .collect(),
            series,
            log_y: true,
            reference: None,
        },
    )
}

trait RgbaToRgb {
    fn rgb_color(&self) -> RGBColor;
}

impl RgbaToRgb for RGBAColor {
    /// Blends onto white, so "lighter" bars stay opaque.
    fn rgb_color(&self) -> RGBColor {
        let (r, g, b) = self.rgb();
        let a = self.alpha();
        let blend = |c: u8| (f64::from(c) * a + 255.0 * (1.0 - a)).round() as u8;
        RGBColor(blend(r), blend(g), blend(b))
    }
}

fn shade(base: RGBColor, i: usize, n: usize) -> RGBColor {
    let t = if n <= 1 {
        0.0
    } else {
        i as f64 / (n - 1) as f64 * 0.6
    };
    let lighten = |c: u8| (f64::from(c) + (255.0 - f64::from(c)) * t).round() as u8;
    RGBColor(lighten(base.0), lighten(base.1), lighten(base.2))
}

fn draw_dynamic_bandwidth(
    run: &DynamicRun,
    workers: &[qos_core::sim::experiments::DynamicWorker],
    path: &Path,
) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).plot_err()?;
    let x_max = run.samples.last().map_or(1.0, |s| s.at_ns as f64 / 1e9);
    let y_max = run
        .samples
        .iter()
        .flat_map(|s| s.worker_bandwidth_bytes_per_sec.iter())
        .fold(0.0f64, |a, &b| a.max(b / 1e6))
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "§5.5 bandwidth per worker, {} on {}",
                run.scheduler.name(),
                run.device.name()
            ),
            (FONT, 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max.max(1.0))
        .plot_err()?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("time (s)")
        .y_desc("MB/s")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .draw()
        .plot_err()?;
    let reads = workers.iter().filter(|w| w.kind == IoKind::Read).count();
    let writes = workers.len() - reads;
    let (mut nr, mut nw) = (0, 0);
    for (i, w) in workers.iter().enumerate() {
        let (color, first) = match w.kind {
            IoKind::Read => {
                nr += 1;
                (shade(GROUP_COLORS[0], nr - 1, reads), nr == 1)
            }
            IoKind::Write => {
                nw += 1;
                (shade(GROUP_COLORS[1], nw - 1, writes), nw == 1)
            }
        };
        let points: Vec<(f64, f64)> = run
            .samples
            .iter()
            .map(|s| {
                (
                    s.at_ns as f64 / 1e9,
                    s.worker_bandwidth_bytes_per_sec
                        .get(i)
                        .copied()
                        .unwrap_or(0.0)
                        / 1e6,
                )
            })
            .collect();
        let series = chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .plot_err()?;
        if first {
            let label = match w.kind {
                IoKind::Read => "read workers (≤ 200 MB/s each)",
                IoKind::Write => "write workers (≤ 60 MB/s each)",
            };
            series.label(label).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()
        .plot_err()?;
    root.present().plot_err()?;
    Ok(())
}

fn draw_dynamic_latency(run: &DynamicRun, path: &Path) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).plot_err()?;
    let x_max = run.samples.last().map_or(1.0, |s| s.at_ns as f64 / 1e9);
    let log = |us: f64| us.max(1.0).log10();
    let y_max = run
        .samples
        .iter()
        .flat_map(|s| [s.read_device_latency_us, s.write_device_latency_us])
        .flatten()
        .map(log)
        .fold(2.0f64, f64::max)
        .ceil()
        + 0.2;
    let has_cost = run.samples.iter().any(|s| s.write_cost.is_some());
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "§5.5 device latency{}, {} on {}",
                if has_cost { " and write cost" } else { "" },
                run.scheduler.name(),
                run.device.name()
            ),
            (FONT, 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .right_y_label_area_size(if has_cost { 50 } else { 0 })
        .build_cartesian_2d(0f64..x_max, 1f64..y_max)
        .plot_err()?
        .set_secondary_coord(0f64..x_max, 0f64..10f64);
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("time (s)")
        .y_desc("mean device latency (log scale)")
        .y_label_formatter(&|v| format_us(10f64.powf(*v)))
        .y_labels(y_max.floor() as usize + 1)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .draw()
        .plot_err()?;
    for (i, (name, pick)) in [
        (
            "read latency",
            (|s: &qos_core::sim::engine::Sample| s.read_device_latency_us)
                as fn(&qos_core::sim::engine::Sample) -> Option<f64>,
        ),
        ("write latency", |s| s.write_device_latency_us),
    ]
    .into_iter()
    .enumerate()
    {
        let color = GROUP_COLORS[i];
        let points: Vec<(f64, f64)> = run
            .samples
            .iter()
            .filter_map(|s| pick(s).map(|us| (s.at_ns as f64 / 1e9, log(us))))
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .plot_err()?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    if has_cost {
        chart
            .configure_secondary_axes()
            .y_desc("write cost")
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .plot_err()?;
        let points: Vec<(f64, f64)> = run
            .samples
            .iter()
            .filter_map(|s| s.write_cost.map(|c| (s.at_ns as f64 / 1e9, c)))
            .collect();
        chart
            .draw_secondary_series(LineSeries::new(points, BLACK.stroke_width(1)))
            .plot_err()?
            .label("write cost (right axis)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()
        .plot_err()?;
    root.present().plot_err()?;
    Ok(())
}
