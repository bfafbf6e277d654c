//! `--plot out.svg`: bandwidth against transfer size, one line per backend, one panel per
//! direction (and read cache state), drawn with plotters' SVG backend (no system libraries;
//! text is left to the SVG viewer's fonts).

use super::measure::Cache;
use super::report::{Cell, Report};
use super::subjects::RAW;
use crate::sizes::format_size;
use plotters::coord::combinators::{BindKeyPoints, IntoLogRange};
use plotters::prelude::*;
use std::collections::BTreeMap;

/// Width of one panel, pixels.
const PANEL_W: u32 = 620;
/// Height of the chart, pixels.
const HEIGHT: u32 = 500;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// One line: a backend's best median bandwidth per size, and how many knob settings it is the
/// best of.
struct Line {
    points: Vec<(f64, f64)>,
    settings: usize,
}

fn panel_title(direction: &str, cache: Option<Cache>) -> String {
    match (direction, cache) {
        ("read", Some(Cache::Cold)) => "read, cold page cache".to_string(),
        ("read", Some(Cache::Warm)) => "read, warm page cache".to_string(),
        ("write", _) => "write (synced to disk)".to_string(),
        (d, _) => d.to_string(),
    }
}

/// Per backend (raw last), its line in the cells of one panel.
fn lines(cells: &[&Cell]) -> Vec<(String, Line)> {
    let mut best: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    let mut labels: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for c in cells {
        let e = best.entry(c.backend.clone()).or_default();
        let v = e.entry(c.bytes).or_insert(0.0);
        *v = v.max(c.gbps_median);
        labels
            .entry(c.backend.clone())
            .or_default()
            .insert(c.label.clone());
    }
    let mut out: Vec<(String, Line)> = best
        .into_iter()
        .map(|(name, by_size)| {
            let settings = labels.get(&name).map_or(1, |l| l.len());
            let points = by_size.into_iter().map(|(s, g)| (s as f64, g)).collect();
            (name, Line { points, settings })
        })
        .collect();
    out.sort_by_key(|(name, _)| name == RAW);
    out
}

/// The chart as SVG text; `Err` only when plotters fails to draw.
pub fn svg(report: &Report) -> Result<String, String> {
    let mut panels: Vec<(String, Option<Cache>)> = Vec::new();
    for c in &report.cells {
        let p = (c.direction.clone(), c.cache);
        if !panels.contains(&p) {
            panels.push(p);
        }
    }
    panels.sort_by_key(|(d, c)| (d != "read", *c));
    let mut names: Vec<&str> = report.cells.iter().map(|c| c.backend.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut text = String::new();
    {
        let n = panels.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut text, (PANEL_W * n, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let m = &report.machine;
        let title = format!(
            "fastensor bench: {} on {} ({}), kernel {}",
            m.file_system,
            if m.device_model.is_empty() {
                "unknown device"
            } else {
                &m.device_model
            },
            m.device,
            m.kernel
        );
        let root = root
            .titled(&title, ("sans-serif", 20))
            .map_err(|e| e.to_string())?;
        let areas = root.split_evenly((1, n as usize));
        for ((direction, cache), area) in panels.iter().zip(areas.iter()) {
            let cells: Vec<&Cell> = report
                .cells
                .iter()
                .filter(|c| &c.direction == direction && c.cache == *cache)
                .collect();
            draw_panel(area, &panel_title(direction, *cache), &cells, &names)?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(text)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    cells: &[&Cell],
    names: &[&str],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut sizes: Vec<f64> = cells.iter().map(|c| c.bytes as f64).collect();
    sizes.sort_by(|a, b| a.total_cmp(b));
    sizes.dedup();
    let lo = sizes.first().copied().unwrap_or(4096.0);
    let hi = sizes.last().copied().unwrap_or(lo);
    let (lo, hi) = (lo / 1.5, hi * 1.5);
    let top = cells.iter().map(|c| c.gbps_median).fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(sizes.clone()),
            0.0..top,
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("transfer size (bytes, log scale)")
        .y_desc("bandwidth (GB/s, 10^9 B/s)")
        .x_label_formatter(&|v| format_size(v.round() as u64))
        .y_label_formatter(&|v| format!("{v:.2}"))
        .max_light_lines(2)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    for (name, line) in lines(cells) {
        // The same colour for a backend in every panel.
        let i = names.iter().position(|n| *n == name).unwrap_or(0);
        let color = if name == RAW {
            RGBColor(90, 90, 90)
        } else {
            COLORS[i % COLORS.len()]
        };
        let style = ShapeStyle::from(&color).stroke_width(2);
        let label = match (name.as_str(), line.settings) {
            (RAW, _) => "raw O_DIRECT reference".to_string(),
            (n, 1) => n.to_string(),
            (n, k) => format!("{n} (best of {k} knob settings)"),
        };
        chart
            .draw_series(LineSeries::new(line.points.clone(), style))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(
                line.points
                    .iter()
                    .map(|&p| Circle::new(p, 3, ShapeStyle::from(&color).filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    Ok(())
}
