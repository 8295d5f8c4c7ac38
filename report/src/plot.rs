//! Plots of run reports: SVG and PNG drawn with plotters.
//!
//! Every figure is drawn twice from one description, once into an SVG string and once into an
//! in-memory RGB bitmap that is encoded as PNG with the `png` crate. Text is laid out and
//! rasterised with DejaVu Sans, which is compiled into the binary, so a PNG looks the same on
//! every machine and never depends on the fonts installed there. (An SVG names the
//! `sans-serif` family and leaves glyph rendering to its viewer, as SVG always does.)
//!
//! The figures of one run are [`run_figures`]: the throughput timeline, the latency CDF per op
//! type with p99 and p99.9 marked, the members' bandwidth as small multiples (arrays only, in
//! the style of SWAN's Figure 6) and the NAND counters with the write-amplification breakdown.
//! [`compare_figures`] overlays several runs, one line per run, and [`RatioTable`] puts their
//! headline numbers side by side. [`paper_vs_measured`] draws an `afa reproduce` result.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::{LatencySummary, OpReport, RunReport, TimelinePoint};

/// DejaVu Sans (Bitstream Vera licence, see `report/fonts/LICENSE-DejaVu`).
static FONT_TTF: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
/// The family name the font is registered under; the SVGs name it too.
const FONT_FAMILY: &str = "sans-serif";

const TITLE_FONT_PX: u32 = 20;
const CAPTION_FONT_PX: u32 = 16;
const LABEL_FONT_PX: u32 = 13;

/// The size of a single-panel figure.
const FIGURE_PX: (u32, u32) = (960, 540);

/// The op types in report order, with the colour each is drawn in.
const OP_COLORS: [(&str, RGBColor); 4] = [
    ("read", RGBColor(31, 119, 180)),
    ("write", RGBColor(214, 39, 40)),
    ("trim", RGBColor(44, 160, 44)),
    ("flush", RGBColor(148, 103, 189)),
];

/// Colours for runs in a comparison and for series in bar charts (matplotlib's tab10), so
/// that run i has the same colour in every figure.
const SERIES_COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const GRID_COLOR: RGBColor = RGBColor(225, 225, 225);
const REFERENCE_COLOR: RGBColor = RGBColor(150, 150, 150);

/// A latency CDF's y axis shows "nines", −log10(1 − F), so that p90, p99 and p99.9 are
/// evenly spaced; it stops at this many nines even for runs with billions of requests.
const MAX_NINES: f64 = 6.0;

/// Why a figure could not be produced.
#[derive(Debug)]
pub enum PlotError {
    /// The embedded font did not parse (a corrupted build).
    Font,
    /// plotters reported an error while drawing the named figure.
    Draw { figure: String, message: String },
    /// The PNG encoder failed for the named figure.
    Png { figure: String, message: String },
    /// A file could not be written.
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlotError::Font => write!(f, "the embedded DejaVu Sans font does not parse"),
            PlotError::Draw { figure, message } => {
                write!(f, "cannot draw figure {figure}: {message}")
            }
            PlotError::Png { figure, message } => {
                write!(f, "cannot encode figure {figure} as PNG: {message}")
            }
            PlotError::Write { path, source } => {
                write!(f, "cannot write {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for PlotError {}

/// One rendered figure: the same drawing as SVG text and as PNG bytes.
#[derive(Debug, Clone)]
pub struct Figure {
    /// File stem, e.g. `latency_cdf`; [`write_figures`] adds `.svg` and `.png`.
    pub name: String,
    /// A one-line description, used as the caption in the HTML report.
    pub title: String,
    pub svg: String,
    pub png: Vec<u8>,
}

/// Registers the embedded font with plotters once per process.
fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT_TTF).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

/// Something that can draw itself onto any plotters backend.
trait Chart {
    fn size_px(&self) -> (u32, u32) {
        FIGURE_PX
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

fn render(name: &str, title: &str, chart: &impl Chart) -> Result<Figure, PlotError> {
    ensure_font()?;
    let draw_error = |message: String| PlotError::Draw {
        figure: name.to_owned(),
        message,
    };
    let (width_px, height_px) = chart.size_px();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width_px, height_px)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(e.to_string()))?;
        chart.draw(&root).map_err(draw_error)?;
        root.present().map_err(|e| draw_error(e.to_string()))?;
    }
    let mut rgb = vec![0_u8; width_px as usize * height_px as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (width_px, height_px)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(e.to_string()))?;
        chart.draw(&root).map_err(draw_error)?;
        root.present().map_err(|e| draw_error(e.to_string()))?;
    }
    let png = encode_png(&rgb, width_px, height_px).map_err(|message| PlotError::Png {
        figure: name.to_owned(),
        message,
    })?;
    Ok(Figure {
        name: name.to_owned(),
        title: title.to_owned(),
        svg,
        png,
    })
}

fn encode_png(rgb: &[u8], width_px: u32, height_px: u32) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width_px, height_px);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(rgb).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

/// Writes `NAME.svg` and `NAME.png` for every figure into `dir` (created if missing) and
/// returns the paths written.
pub fn write_figures(dir: &Path, figures: &[Figure]) -> Result<Vec<PathBuf>, PlotError> {
    std::fs::create_dir_all(dir).map_err(|source| PlotError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let mut written = Vec::new();
    for figure in figures {
        for (extension, bytes) in [("svg", figure.svg.as_bytes()), ("png", &figure.png[..])] {
            let path = dir.join(format!("{}.{extension}", figure.name));
            std::fs::write(&path, bytes).map_err(|source| PlotError::Write {
                path: path.clone(),
                source,
            })?;
            written.push(path);
        }
    }
    Ok(written)
}

// ---------------------------------------------------------------------------------------------
// Axis helpers

/// A linear axis over `[lo, hi]` whose ticks (and grid lines) are exactly the given values.
/// plotters' own key-point combinator cannot take a label formatter, and its automatic ticks
/// would land between categories or at fractional powers of ten.
#[derive(Debug, Clone)]
struct TickedAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl TickedAxis {
    fn new(lo: f64, hi: f64, ticks: Vec<f64>) -> Self {
        Self { lo, hi, ticks }
    }
}

impl Ranged for TickedAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        let fraction = if span > 0.0 {
            (value - self.lo) / span
        } else {
            0.0
        };
        let pixels = f64::from(limit.1 - limit.0) * fraction;
        limit.0 + pixels.round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.max_num_points() == 0 {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// "Nice" tick positions (1, 2 or 5 times a power of ten apart) covering `[lo, hi]`, at most
/// about `max_count` of them.
fn linear_ticks(lo: f64, hi: f64, max_count: usize) -> Vec<f64> {
    let span = hi - lo;
    if !(span > 0.0 && span.is_finite()) {
        return vec![lo];
    }
    let raw_step = span / max_count.max(1) as f64;
    let magnitude = 10_f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw_step)
        .unwrap_or(10.0 * magnitude);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Ticks for an axis whose data are log10 of the values: 1, 2 and 5 times each power of ten
/// within `[lo_log, hi_log]`, or only the powers of ten when that would be too many.
fn log_ticks(lo_log: f64, hi_log: f64) -> Vec<f64> {
    let first = lo_log.floor() as i32;
    let last = hi_log.ceil() as i32;
    let multiples: &[f64] = if last - first > 4 {
        &[1.0]
    } else {
        &[1.0, 2.0, 5.0]
    };
    let mut ticks = Vec::new();
    for k in first..=last {
        for m in multiples {
            let t = f64::from(k) + m.log10();
            if t >= lo_log - 1e-9 && t <= hi_log + 1e-9 {
                ticks.push(t);
            }
        }
    }
    if ticks.is_empty() {
        ticks.push(lo_log);
    }
    ticks
}

/// A compact label for a tick or a value: SI suffixes from ten thousand up, trailing zeros
/// trimmed below.
pub fn format_number(value: f64) -> String {
    let magnitude = value.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        }
    };
    if magnitude >= 1e10 {
        format!("{}G", trim(format!("{:.1}", value / 1e9)))
    } else if magnitude >= 1e7 {
        format!("{}M", trim(format!("{:.1}", value / 1e6)))
    } else if magnitude >= 1e4 {
        format!("{}k", trim(format!("{:.1}", value / 1e3)))
    } else if magnitude >= 100.0 || magnitude == 0.0 {
        format!("{value:.0}")
    } else if magnitude >= 1.0 {
        trim(format!("{value:.2}"))
    } else {
        trim(format!("{value:.4}"))
    }
}

/// The percentile a "nines" value stands for: 1 → "90%", 2 → "99%", 3 → "99.9%".
fn nines_label(nines: f64) -> String {
    let percent = 100.0 * (1.0 - 10_f64.powf(-nines));
    let digits = (nines.round() as i64 - 2).clamp(0, 6) as usize;
    format!("{percent:.digits$}%")
}

fn nines(fraction_at_or_below: f64) -> f64 {
    let tail = 1.0 - fraction_at_or_below;
    if tail <= 0.0 {
        MAX_NINES
    } else {
        (-tail.log10()).clamp(0.0, MAX_NINES)
    }
}

// ---------------------------------------------------------------------------------------------
// Line charts

/// How a line chart's axis maps data to position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    Linear,
    /// Data are log10 of the values and ticks are labelled with the values.
    Log10,
    /// Data are "nines" (see [`nines`]) and ticks are labelled as percentiles.
    Nines,
}

#[derive(Debug, Clone)]
struct Line {
    /// Legend text; an empty name draws no legend entry.
    name: String,
    color: RGBColor,
    /// Points in axis data units (already log-transformed for a log axis).
    points: Vec<(f64, f64)>,
    dashed: bool,
}

#[derive(Debug, Clone)]
struct LineChart {
    caption: String,
    x_desc: String,
    y_desc: String,
    x_scale: Scale,
    y_scale: Scale,
    lines: Vec<Line>,
    /// A fixed y range, so small multiples share one scale.
    y_range: Option<(f64, f64)>,
    legend_position: SeriesLabelPosition,
}

impl LineChart {
    fn data_lines(&self) -> impl Iterator<Item = &Line> {
        self.lines.iter().filter(|l| !l.dashed)
    }

    fn x_bounds(&self) -> Option<(f64, f64)> {
        bounds(self.data_lines().flat_map(|l| l.points.iter().map(|p| p.0)))
    }

    fn y_bounds(&self) -> Option<(f64, f64)> {
        if let Some(range) = self.y_range {
            return Some(range);
        }
        let (lo, hi) = bounds(self.data_lines().flat_map(|l| l.points.iter().map(|p| p.1)))?;
        let lo = lo.min(0.0);
        let hi = if hi > lo { hi * 1.08 } else { lo + 1.0 };
        Some((lo, hi))
    }
}

fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

fn ticks_for(scale: Scale, lo: f64, hi: f64, max_count: usize) -> Vec<f64> {
    match scale {
        Scale::Linear => linear_ticks(lo, hi, max_count),
        Scale::Log10 => log_ticks(lo, hi),
        Scale::Nines => (lo.ceil() as i64..=hi.floor() as i64)
            .map(|k| k as f64)
            .collect(),
    }
}

fn tick_label(scale: Scale, value: f64) -> String {
    match scale {
        Scale::Linear => format_number(value),
        Scale::Log10 => format_number(10_f64.powf(value)),
        Scale::Nines => nines_label(value),
    }
}

fn draw_text_centered<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
) -> Result<(), String> {
    let (width_px, height_px) = area.dim_in_pixel();
    let style = TextStyle::from((FONT_FAMILY, CAPTION_FONT_PX).into_font())
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new(
        text.to_owned(),
        (width_px as i32 / 2, height_px as i32 / 2),
        style,
    ))
    .map_err(|e| e.to_string())
}

/// The caption as wide as `area` leaves room for: one wider than that first loses its
/// parenthesised tail (a reproduction's unit, which its value axis shows too), then its last
/// characters, ended with an ellipsis, so that no title runs off the figure.
fn fitted_caption<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, caption: &str) -> String {
    let style: TextStyle = (FONT_FAMILY, CAPTION_FONT_PX).into();
    // The chart's margins leave the caption a little less than the area's width.
    let room_px = area.dim_in_pixel().0.saturating_sub(24);
    let fits = |text: &str| {
        area.estimate_text_size(text, &style)
            .is_ok_and(|(width_px, _)| width_px <= room_px)
    };
    if fits(caption) {
        return caption.to_owned();
    }
    let mut text = match trailing_parenthesis(caption) {
        Some(open) => caption[..open].trim_end().to_owned(),
        None => caption.to_owned(),
    };
    if fits(&text) {
        return text;
    }
    while text.pop().is_some() {
        let shortened = format!("{}…", text.trim_end());
        if fits(&shortened) {
            return shortened;
        }
    }
    String::new()
}

/// Where the parenthesis that closes `text` opens, its nested ones skipped over.
fn trailing_parenthesis(text: &str) -> Option<usize> {
    if !text.ends_with(')') {
        return None;
    }
    let mut depth = 0_usize;
    for (i, c) in text.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn draw_line_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    chart_spec: &LineChart,
) -> Result<(), String> {
    let (Some((x_lo, mut x_hi)), Some((y_lo, y_hi))) =
        (chart_spec.x_bounds(), chart_spec.y_bounds())
    else {
        let titled = area
            .titled(
                &fitted_caption(area, &chart_spec.caption),
                (FONT_FAMILY, CAPTION_FONT_PX),
            )
            .map_err(|e| e.to_string())?;
        return draw_text_centered(&titled, "no data");
    };
    if x_hi <= x_lo {
        x_hi = x_lo + 1.0;
    }
    let x_ticks = ticks_for(chart_spec.x_scale, x_lo, x_hi, 10);
    let y_ticks = ticks_for(chart_spec.y_scale, y_lo, y_hi, 8);
    let (x_scale, y_scale) = (chart_spec.x_scale, chart_spec.y_scale);
    let mut chart = ChartBuilder::on(area)
        .caption(
            fitted_caption(area, &chart_spec.caption),
            (FONT_FAMILY, CAPTION_FONT_PX),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            TickedAxis::new(x_lo, x_hi, x_ticks),
            TickedAxis::new(y_lo, y_hi, y_ticks),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(chart_spec.x_desc.as_str())
        .y_desc(chart_spec.y_desc.as_str())
        .x_label_formatter(&|v: &f64| tick_label(x_scale, *v))
        .y_label_formatter(&|v: &f64| tick_label(y_scale, *v))
        .label_style((FONT_FAMILY, LABEL_FONT_PX))
        .axis_desc_style((FONT_FAMILY, LABEL_FONT_PX))
        .bold_line_style(GRID_COLOR)
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(|e| e.to_string())?;
    let mut any_legend = false;
    for line in &chart_spec.lines {
        let color = line.color;
        // Thick polylines are joined with mitres, which spike far past sharp corners; dense
        // series (timelines of thousands of buckets) have many, so they are drawn thin.
        let width_px = if line.points.len() > 200 { 1 } else { 2 };
        let style = ShapeStyle::from(&color).stroke_width(width_px);
        // Points outside the plotting range (a marker beyond the data) are clipped by
        // clamping, so a marker still shows at the edge rather than vanishing.
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|&(x, y)| (x.clamp(x_lo, x_hi), y.clamp(y_lo, y_hi)))
            .collect();
        let annotation = if line.dashed {
            chart.draw_series(DashedLineSeries::new(points, 8, 5, style))
        } else {
            chart.draw_series(LineSeries::new(points, style))
        }
        .map_err(|e| e.to_string())?;
        if !line.name.is_empty() {
            any_legend = true;
            annotation
                .label(line.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
    }
    if any_legend {
        chart
            .configure_series_labels()
            .position(chart_spec.legend_position.clone())
            .background_style(WHITE.mix(0.85))
            .border_style(REFERENCE_COLOR)
            .label_font((FONT_FAMILY, LABEL_FONT_PX))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl Chart for LineChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_line_chart(root, self)
    }
}

/// Several line charts side by side or in a grid under one title.
#[derive(Debug, Clone)]
struct Panels {
    title: String,
    columns: usize,
    panels: Vec<LineChart>,
    panel_px: (u32, u32),
}

impl Chart for Panels {
    fn size_px(&self) -> (u32, u32) {
        let columns = self.columns.max(1);
        let rows = self.panels.len().div_ceil(columns).max(1);
        (
            self.panel_px.0 * columns as u32,
            self.panel_px.1 * rows as u32 + 40,
        )
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let inner = root
            .titled(&self.title, (FONT_FAMILY, TITLE_FONT_PX))
            .map_err(|e| e.to_string())?;
        let columns = self.columns.max(1);
        let rows = self.panels.len().div_ceil(columns).max(1);
        for (area, panel) in inner.split_evenly((rows, columns)).iter().zip(&self.panels) {
            draw_line_chart(area, panel)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Bar charts

#[derive(Debug, Clone)]
struct BarSeries {
    name: String,
    color: RGBColor,
    values: Vec<f64>,
    /// A range drawn as a whisker over each category's bar (the spread of a value over
    /// several runs), or none; empty when the series has no ranges.
    ranges: Vec<Option<(f64, f64)>>,
}

/// Horizontal bars, one group per category (top to bottom in order), so that long category
/// labels such as experiment labels stay readable.
#[derive(Debug, Clone)]
struct BarChart {
    caption: String,
    value_desc: String,
    categories: Vec<String>,
    series: Vec<BarSeries>,
    /// Stack the series within a category instead of placing them side by side.
    stacked: bool,
    /// A log10 value axis, for counters spanning orders of magnitude.
    log: bool,
    /// Text drawn right of each category's bars (e.g. a ratio), one per category or none.
    notes: Vec<String>,
}

impl BarChart {
    /// The value extent of each bar: `(category, series, start, end)` in axis units.
    fn bars(&self, floor: f64) -> Vec<(usize, usize, f64, f64)> {
        let axis = |v: f64| if self.log { v.log10() } else { v };
        let mut bars = Vec::new();
        for category in 0..self.categories.len() {
            let mut stack_end = 0.0;
            for (s, series) in self.series.iter().enumerate() {
                let value = series.values.get(category).copied().unwrap_or(0.0);
                if !(value.is_finite() && value > 0.0) {
                    continue;
                }
                if self.stacked {
                    bars.push((category, s, stack_end, stack_end + value));
                    stack_end += value;
                } else {
                    bars.push((category, s, floor, axis(value)));
                }
            }
        }
        bars
    }

    /// The whiskers of side-by-side bars: `(category, series, low, high)` in axis units,
    /// for every range whose ends the axis can show.
    fn whiskers(&self) -> Vec<(usize, usize, f64, f64)> {
        if self.stacked {
            return Vec::new();
        }
        let axis = |v: f64| if self.log { v.log10() } else { v };
        let shown = |v: f64| v.is_finite() && (!self.log || v > 0.0);
        let mut whiskers = Vec::new();
        for (s, series) in self.series.iter().enumerate() {
            for (category, range) in series.ranges.iter().enumerate() {
                if let Some((low, high)) = *range {
                    if shown(low) && shown(high) {
                        whiskers.push((category, s, axis(low), axis(high)));
                    }
                }
            }
        }
        whiskers
    }
}

impl Chart for BarChart {
    fn size_px(&self) -> (u32, u32) {
        let bars_per_category = if self.stacked { 1 } else { self.series.len() };
        // One more row than there are categories, for the legend.
        let rows = self.categories.len() as u32 + 1;
        let height = 100 + rows * (18 * bars_per_category.max(1) as u32 + 20);
        (FIGURE_PX.0, height.max(260))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_bar_chart(root, self)
    }
}

fn draw_bar_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    spec: &BarChart,
) -> Result<(), String> {
    let positive = spec
        .series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite() && *v > 0.0);
    let Some((min_value, _)) = bounds(positive) else {
        let titled = area
            .titled(
                &fitted_caption(area, &spec.caption),
                (FONT_FAMILY, CAPTION_FONT_PX),
            )
            .map_err(|e| e.to_string())?;
        return draw_text_centered(&titled, "no data");
    };
    let floor = if spec.log {
        min_value.log10().floor()
    } else {
        0.0
    };
    let bars = spec.bars(floor);
    let whiskers = spec.whiskers();
    let top = bars
        .iter()
        .chain(&whiskers)
        .map(|b| b.3)
        .fold(floor, f64::max);
    // Headroom on the right for the notes.
    let x_hi = if spec.log {
        top.ceil().max(floor + 1.0) + if spec.notes.is_empty() { 0.0 } else { 0.6 }
    } else {
        let span = (top - floor).max(f64::MIN_POSITIVE);
        top + span * if spec.notes.is_empty() { 0.05 } else { 0.2 }
    };
    let n = spec.categories.len();
    let label_chars = spec
        .categories
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(1);
    let categories = spec.categories.clone();
    // Category i is drawn at y = n − 1 − i so that the first category is at the top.
    let category_label = move |v: &f64| {
        let index = n as f64 - 1.0 - v.round();
        if (v - v.round()).abs() < 1e-6 && index >= 0.0 && (index as usize) < categories.len() {
            categories[index as usize].clone()
        } else {
            String::new()
        }
    };
    let scale = if spec.log {
        Scale::Log10
    } else {
        Scale::Linear
    };
    let mut chart = ChartBuilder::on(area)
        .caption(
            fitted_caption(area, &spec.caption),
            (FONT_FAMILY, CAPTION_FONT_PX),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size((label_chars as u32 * 8 + 16).min(360))
        .build_cartesian_2d(
            TickedAxis::new(floor, x_hi, ticks_for(scale, floor, x_hi, 8)),
            // The empty row above the first category holds the legend, so that it never
            // covers a bar or a note.
            TickedAxis::new(-0.6, n as f64 + 0.6, (0..n).map(|i| i as f64).collect()),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(spec.value_desc.as_str())
        .x_label_formatter(&|v: &f64| tick_label(scale, *v))
        .y_label_formatter(&category_label)
        .label_style((FONT_FAMILY, LABEL_FONT_PX))
        .axis_desc_style((FONT_FAMILY, LABEL_FONT_PX))
        .bold_line_style(GRID_COLOR)
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(|e| e.to_string())?;
    let group_height = 0.76;
    let bar_height = if spec.stacked {
        group_height
    } else {
        group_height / spec.series.len().max(1) as f64
    };
    for (s, series) in spec.series.iter().enumerate() {
        let color = series.color;
        let rectangles = bars
            .iter()
            .filter(|b| b.1 == s)
            .map(|&(category, _, start, end)| {
                let centre = n as f64 - 1.0 - category as f64;
                let top_y = if spec.stacked {
                    centre + group_height / 2.0
                } else {
                    centre + group_height / 2.0 - s as f64 * bar_height
                };
                Rectangle::new([(start, top_y), (end, top_y - bar_height)], color.filled())
            });
        chart
            .draw_series(rectangles)
            .map_err(|e| e.to_string())?
            .label(series.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    for &(category, s, low, high) in &whiskers {
        let centre = n as f64 - 1.0 - category as f64;
        let y = centre + group_height / 2.0 - (s as f64 + 0.5) * bar_height;
        let tick = bar_height * 0.3;
        let low = low.max(floor);
        let lines = [
            vec![(low, y), (high, y)],
            vec![(low, y - tick), (low, y + tick)],
            vec![(high, y - tick), (high, y + tick)],
        ];
        chart
            .draw_series(
                lines
                    .into_iter()
                    .map(|points| PathElement::new(points, BLACK.stroke_width(2))),
            )
            .map_err(|e| e.to_string())?;
    }
    let note_style = TextStyle::from((FONT_FAMILY, LABEL_FONT_PX).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (category, note) in spec.notes.iter().enumerate() {
        let end = bars
            .iter()
            .chain(&whiskers)
            .filter(|b| b.0 == category)
            .map(|b| b.3)
            .fold(floor, f64::max);
        let gap = (x_hi - floor) * 0.01;
        let centre = n as f64 - 1.0 - category as f64;
        chart
            .draw_series(std::iter::once(Text::new(
                note.clone(),
                (end + gap, centre),
                note_style.clone(),
            )))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(REFERENCE_COLOR)
        .label_font((FONT_FAMILY, LABEL_FONT_PX))
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Two bar charts side by side under one title.
#[derive(Debug, Clone)]
struct BarPair {
    title: String,
    left: BarChart,
    right: BarChart,
}

impl Chart for BarPair {
    fn size_px(&self) -> (u32, u32) {
        let height = self.left.size_px().1.max(self.right.size_px().1);
        (FIGURE_PX.0 * 3 / 2, height + 40)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let inner = root
            .titled(&self.title, (FONT_FAMILY, TITLE_FONT_PX))
            .map_err(|e| e.to_string())?;
        let left_px = inner.dim_in_pixel().0 * 3 / 5;
        let (left, right) = inner.split_horizontally(left_px);
        draw_bar_chart(&left, &self.left)?;
        draw_bar_chart(&right, &self.right)
    }
}

// ---------------------------------------------------------------------------------------------
// Run figures

fn ops(report: &RunReport) -> [(&'static str, RGBColor, &OpReport); 4] {
    let by_name = [&report.read, &report.write, &report.trim, &report.flush];
    [0, 1, 2, 3].map(|i| (OP_COLORS[i].0, OP_COLORS[i].1, by_name[i]))
}

/// Time axis: seconds for long runs, milliseconds for short ones.
fn time_axis(timeline: &[TimelinePoint]) -> (&'static str, f64) {
    let end_ms = timeline.last().map_or(0.0, |p| p.t_ms);
    if end_ms >= 10_000.0 {
        ("time (s, virtual)", 1e-3)
    } else {
        ("time (ms, virtual)", 1.0)
    }
}

fn timeline_lines(timeline: &[TimelinePoint], scale: f64, colors: [RGBColor; 2]) -> Vec<Line> {
    let read: Vec<(f64, f64)> = timeline
        .iter()
        .map(|p| (p.t_ms * scale, p.read_mb_s))
        .collect();
    let write: Vec<(f64, f64)> = timeline
        .iter()
        .map(|p| (p.t_ms * scale, p.write_mb_s))
        .collect();
    let any_read = timeline.iter().any(|p| p.read_mb_s > 0.0);
    let any_write = timeline.iter().any(|p| p.write_mb_s > 0.0);
    let mut lines = Vec::new();
    // With neither kind of traffic both are drawn (flat at zero), which is the truth.
    if any_read || !any_write {
        lines.push(Line {
            name: "read".into(),
            color: colors[0],
            points: read,
            dashed: false,
        });
    }
    if any_write || !any_read {
        lines.push(Line {
            name: "write".into(),
            color: colors[1],
            points: write,
            dashed: false,
        });
    }
    lines
}

fn timeline_chart(report: &RunReport, caption: &str) -> LineChart {
    let (x_desc, scale) = time_axis(&report.timeline);
    LineChart {
        caption: caption.to_owned(),
        x_desc: x_desc.into(),
        y_desc: "MB/s".into(),
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        lines: timeline_lines(&report.timeline, scale, [OP_COLORS[0].1, OP_COLORS[1].1]),
        y_range: None,
        legend_position: SeriesLabelPosition::UpperRight,
    }
}

/// `(log10 latency_us, nines)` points of an op's CDF, from the report's CDF series or, for
/// reports written before it existed, from the latency percentiles.
fn cdf_points(op: &OpReport) -> Vec<(f64, f64)> {
    let log_us = |ns: f64| (ns / 1e3).max(1e-3).log10();
    if let Some(last) = op.latency_cdf.last() {
        let total = last.requests_at_or_below().max(1) as f64;
        // A CDF plotted as a line from its first point would start at the first bucket's
        // fraction; a leading point at zero makes the curve start from the axis.
        // The empirical CDF is a step function: it stays at the previous level up to the next
        // point's latency and rises there. Drawing straight lines between the points would
        // suggest latencies between them that no request had.
        let mut points = Vec::with_capacity(op.latency_cdf.len() * 2);
        let mut level = 0.0;
        for p in &op.latency_cdf {
            let x = log_us(p.latency_ns() as f64);
            points.push((x, level));
            let fraction = p.requests_at_or_below() as f64 / total;
            // The last point has F = 1; show it one request short of certainty, which is
            // what the data can resolve.
            level = nines(fraction.min(1.0 - 0.5 / total));
            points.push((x, level));
        }
        points
    } else {
        let l = &op.latency_us;
        [
            (l.p50, 0.5),
            (l.p90, 0.9),
            (l.p99, 0.99),
            (l.p999, 0.999),
            (l.max, 0.9999),
        ]
        .iter()
        .filter(|(us, _)| *us > 0.0)
        .map(|&(us, f)| (us.log10(), nines(f)))
        .collect()
    }
}

fn latency_cdf_chart(report: &RunReport) -> LineChart {
    let mut lines = Vec::new();
    let mut y_top: f64 = 3.5;
    for (name, color, op) in ops(report) {
        if op.ios == 0 {
            continue;
        }
        let points = cdf_points(op);
        y_top = points.iter().map(|p| p.1 + 0.3).fold(y_top, f64::max);
        lines.push(Line {
            name: name.into(),
            color,
            points,
            dashed: false,
        });
    }
    let y_top = y_top.min(MAX_NINES);
    for (name, color, op) in ops(report) {
        if op.ios == 0 {
            continue;
        }
        let LatencySummary { p99, p999, .. } = op.latency_us;
        for (label, us, level) in [("p99", p99, 2.0), ("p99.9", p999, 3.0)] {
            if us > 0.0 {
                let x = us.log10();
                lines.push(Line {
                    name: format!("{name} {label} = {} µs", format_number(us)),
                    color,
                    points: vec![(x, 0.0), (x, level)],
                    dashed: true,
                });
            }
        }
    }
    // Horizontal references at the 99th and 99.9th percentiles.
    if !lines.is_empty() {
        let (lo, hi) = bounds(
            lines
                .iter()
                .filter(|l| !l.dashed)
                .flat_map(|l| l.points.iter().map(|p| p.0)),
        )
        .unwrap_or((0.0, 1.0));
        for level in [2.0, 3.0] {
            lines.push(Line {
                name: String::new(),
                color: REFERENCE_COLOR,
                points: vec![(lo, level), (hi, level)],
                dashed: true,
            });
        }
    }
    LineChart {
        caption: "Latency CDF (p99 and p99.9 marked)".into(),
        x_desc: "latency (µs, log scale)".into(),
        y_desc: "requests at or below".into(),
        x_scale: Scale::Log10,
        y_scale: Scale::Nines,
        lines,
        y_range: Some((0.0, y_top)),
        legend_position: SeriesLabelPosition::UpperLeft,
    }
}

fn members_chart(report: &RunReport) -> Panels {
    let columns = report.members.len().clamp(1, 4);
    let y_max = report
        .members
        .iter()
        .flat_map(|m| m.timeline.iter().map(|p| p.read_mb_s.max(p.write_mb_s)))
        .fold(0.0, f64::max);
    // The headroom above the highest bucket keeps each panel's legend, in its upper right
    // corner, clear of the data: a member busy at its bandwidth ceiling all run long would
    // otherwise draw its lines under the legend box.
    let y_range = (0.0, if y_max > 0.0 { y_max * 1.4 } else { 1.0 });
    let panels = report
        .members
        .iter()
        .enumerate()
        .map(|(i, member)| {
            let (x_desc, scale) = time_axis(&member.timeline);
            LineChart {
                caption: format!("member {i}"),
                x_desc: x_desc.into(),
                y_desc: "MB/s".into(),
                x_scale: Scale::Linear,
                y_scale: Scale::Linear,
                lines: timeline_lines(&member.timeline, scale, [OP_COLORS[0].1, OP_COLORS[1].1]),
                y_range: Some(y_range),
                legend_position: SeriesLabelPosition::UpperRight,
            }
        })
        .collect();
    Panels {
        title: "Bandwidth per member device".into(),
        columns,
        panels,
        panel_px: (360, 260),
    }
}

/// SWAN's Figure 7 from an array report's `victims` (one entry per cleaned victim: its
/// time, its utilisation and the array's free segments after it), as two panels against
/// time. None when the run cleaned no victim or its engine records none.
fn victims_chart(report: &RunReport) -> Option<Panels> {
    let array = report.array.as_ref()?;
    let victims = array.get("victims")?.as_array()?;
    if victims.is_empty() {
        return None;
    }
    // The engine's clock starts before the run when aging ran through a time shift in front
    // of it (a reproduce report's `aging_end_ns`, with the engine's own epoch left at 0);
    // an `afa run` report names the engine's epoch.
    let epoch_ns = report
        .config
        .get("aging_end_ns")
        .and_then(|v| v.as_f64())
        .or_else(|| array.get("epoch_ns").and_then(|v| v.as_f64()))
        .unwrap_or(0.0);
    let series = |key: &str| -> Vec<(f64, f64)> {
        victims
            .iter()
            .filter_map(|v| {
                let t_ns = v.get("t_ns")?.as_f64()?;
                Some(((t_ns - epoch_ns) / 1e9, v.get(key)?.as_f64()?))
            })
            .collect()
    };
    let panel = |caption: &str, y_desc: &str, points, y_range| {
        line_over_time(caption.into(), y_desc, points, y_range)
    };
    Some(Panels {
        title: "Victim segments and free segments".into(),
        columns: 2,
        panels: vec![
            panel(
                "utilisation of each victim",
                "valid / data blocks",
                series("utilization"),
                Some((0.0, 1.0)),
            ),
            panel(
                "free segments after each cleaning",
                "segments",
                series("free_segments"),
                None,
            ),
        ],
        panel_px: (480, 320),
    })
}

/// A panel of one unnamed line against virtual time in seconds.
fn line_over_time(
    caption: String,
    y_desc: &str,
    points: Vec<(f64, f64)>,
    y_range: Option<(f64, f64)>,
) -> LineChart {
    LineChart {
        caption,
        x_desc: "time (s, virtual)".into(),
        y_desc: y_desc.into(),
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        lines: vec![Line {
            name: String::new(),
            color: SERIES_COLORS[0],
            points,
            dashed: false,
        }],
        y_range,
        legend_position: SeriesLabelPosition::UpperRight,
    }
}

/// The most steady-state windows and latency searches the `controls` figure draws.
const CONTROL_PANELS_MAX: usize = 8;

/// fio's run controls, when a job set them: the last window of each steady-state
/// detection (its samples, their mean, and for a slope criterion the fitted line) and the
/// queue depth of each latency-target search over time.
fn run_controls_chart(report: &RunReport) -> Option<Panels> {
    let mut panels = Vec::new();
    for ss in report.steady_state.iter().take(CONTROL_PANELS_MAX) {
        let bandwidth = ss.ss.starts_with("bw");
        let samples: Vec<f64> = if bandwidth {
            ss.bw_bytes_s.iter().map(|&b| b as f64 / 1e6).collect()
        } else {
            ss.iops.iter().map(|&i| i as f64).collect()
        };
        let points: Vec<(f64, f64)> = samples
            .iter()
            .enumerate()
            .map(|(i, &y)| (i as f64, y))
            .collect();
        let mut lines = vec![Line {
            name: "samples".into(),
            color: SERIES_COLORS[0],
            points: points.clone(),
            dashed: false,
        }];
        if let (Some(first), Some(last)) = (points.first(), points.last()) {
            let mean = samples.iter().sum::<f64>() / samples.len() as f64;
            lines.push(Line {
                name: "window mean".into(),
                color: SERIES_COLORS[1],
                points: vec![(first.0, mean), (last.0, mean)],
                dashed: true,
            });
            if ss.ss.contains("_slope") {
                // The least-squares line through the mean at the middle of the window.
                let slope = if bandwidth { ss.slope / 1e6 } else { ss.slope };
                let middle = (first.0 + last.0) / 2.0;
                lines.push(Line {
                    name: "fitted slope".into(),
                    color: SERIES_COLORS[2],
                    points: vec![
                        (first.0, mean + slope * (first.0 - middle)),
                        (last.0, mean + slope * (last.0 - middle)),
                    ],
                    dashed: true,
                });
            }
        }
        let outcome = match ss.attained_at_s {
            Some(at_s) if ss.attained => format!("attained at {at_s:.3} s"),
            _ => "not attained".into(),
        };
        panels.push(LineChart {
            caption: format!("steady state of {} ({}): {outcome}", ss.job, ss.ss),
            x_desc: format!("sample of the last window (every {} s)", ss.interval_s),
            y_desc: if bandwidth { "MB/s" } else { "IOPS" }.into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            lines,
            y_range: None,
            legend_position: SeriesLabelPosition::LowerRight,
        });
    }
    for search in report.latency_target.iter().take(CONTROL_PANELS_MAX) {
        // A step line: each depth holds until the next change, the last one until the job's
        // last completion.
        let end_s = search.last_completion_s;
        let mut points = Vec::with_capacity(search.steps.len() * 2);
        for (i, &(at_s, depth)) in search.steps.iter().enumerate() {
            let until_s = search
                .steps
                .get(i + 1)
                .map_or(end_s.max(at_s), |next| next.0);
            points.push((at_s, f64::from(depth)));
            points.push((until_s, f64::from(depth)));
        }
        let outcome = if search.converged {
            format!("converged at depth {}", search.depth)
        } else {
            format!("at depth {} at the end", search.depth)
        };
        panels.push(line_over_time(
            format!(
                "latency target of {} ({} µs at p{}): {outcome}",
                search.job, search.target_us, search.percentile
            ),
            "queue depth",
            points,
            None,
        ));
    }
    if panels.is_empty() {
        return None;
    }
    Some(Panels {
        title: "fio run controls: steady state and latency target".into(),
        columns: panels.len().min(2),
        panels,
        panel_px: (560, 340),
    })
}

fn nand_chart(report: &RunReport) -> BarPair {
    let n = &report.nand;
    let counters = BarChart {
        caption: "NAND operations".into(),
        value_desc: "operations (log scale)".into(),
        categories: vec![
            "page reads".into(),
            "page programs".into(),
            "block erases".into(),
            "host page writes".into(),
            "GC pages moved".into(),
        ],
        series: vec![
            BarSeries {
                name: "SLC".into(),
                color: SERIES_COLORS[1],
                values: vec![
                    n.slc_reads as f64,
                    n.slc_programs as f64,
                    n.slc_erases as f64,
                ],
                ranges: Vec::new(),
            },
            BarSeries {
                name: "MLC/TLC".into(),
                color: SERIES_COLORS[0],
                values: vec![
                    n.mlc_reads as f64,
                    n.mlc_programs as f64,
                    n.mlc_erases as f64,
                ],
                ranges: Vec::new(),
            },
            BarSeries {
                name: "total".into(),
                color: SERIES_COLORS[7],
                values: vec![
                    n.page_reads as f64,
                    n.page_programs as f64,
                    n.block_erases as f64,
                    report.host_page_writes as f64,
                    report.gc.pages_moved as f64,
                ],
                ranges: Vec::new(),
            },
        ],
        stacked: false,
        log: true,
        notes: Vec::new(),
    };
    // The write amplification split by cause, in programs per host page: the host's own pages,
    // GC relocations, and the rest (parity, SLC-cache evictions, metadata).
    let host = report.host_page_writes.max(1) as f64;
    let gc = report.gc.pages_moved as f64 / host;
    let rest = (report.waf - gc).max(0.0);
    let user = rest.min(1.0);
    let other = rest - user;
    let waf = BarChart {
        caption: format!("Write amplification {:.3}", report.waf),
        value_desc: "NAND programs per host page".into(),
        categories: vec!["volume".into()],
        series: vec![
            BarSeries {
                name: "host data".into(),
                color: SERIES_COLORS[0],
                values: vec![user],
                ranges: Vec::new(),
            },
            BarSeries {
                name: "GC moves".into(),
                color: SERIES_COLORS[3],
                values: vec![gc],
                ranges: Vec::new(),
            },
            BarSeries {
                name: "other (parity, SLC eviction, ...)".into(),
                color: SERIES_COLORS[2],
                values: vec![other],
                ranges: Vec::new(),
            },
        ],
        stacked: true,
        log: false,
        notes: vec![format!("{:.3}", report.waf)],
    };
    BarPair {
        title: "NAND counters and write amplification".into(),
        left: counters,
        right: waf,
    }
}

/// The figures of one run: `timeline`, `latency_cdf`, `members` (arrays only), `victims`
/// (arrays whose engine records its cleaned victims: SWAN's Figure 7), `controls` (jobs
/// with fio's steady-state detection or latency-target search) and `nand`.
pub fn run_figures(report: &RunReport) -> Result<Vec<Figure>, PlotError> {
    let mut figures = vec![
        render(
            "timeline",
            "Throughput over time",
            &timeline_chart(report, "Throughput (read and write)"),
        )?,
        render(
            "latency_cdf",
            "Latency CDF per op type",
            &latency_cdf_chart(report),
        )?,
    ];
    if !report.members.is_empty() {
        figures.push(render(
            "members",
            "Bandwidth per member device",
            &members_chart(report),
        )?);
    }
    if let Some(chart) = victims_chart(report) {
        figures.push(render(
            "victims",
            "Victim segments and free segments",
            &chart,
        )?);
    }
    if let Some(chart) = run_controls_chart(report) {
        figures.push(render(
            "controls",
            "Steady state and latency target",
            &chart,
        )?);
    }
    figures.push(render(
        "nand",
        "NAND counters and write amplification",
        &nand_chart(report),
    )?);
    Ok(figures)
}

// ---------------------------------------------------------------------------------------------
// Comparisons

/// Overlays of several runs, one line per run in the run's colour: `compare_throughput`
/// (read and write panels) and `compare_latency_cdf` (a panel per op type any run has).
pub fn compare_figures(runs: &[(String, &RunReport)]) -> Result<Vec<Figure>, PlotError> {
    let color = |i: usize| SERIES_COLORS[i % SERIES_COLORS.len()];
    let long = runs.iter().any(|(_, r)| time_axis(&r.timeline).1 < 1.0);
    let (x_desc, scale) = if long {
        ("time (s, virtual)", 1e-3)
    } else {
        ("time (ms, virtual)", 1.0)
    };
    let mut throughput = Vec::new();
    for (direction, pick) in [
        (
            "read",
            (|p: &TimelinePoint| p.read_mb_s) as fn(&TimelinePoint) -> f64,
        ),
        ("write", |p: &TimelinePoint| p.write_mb_s),
    ] {
        throughput.push(LineChart {
            caption: format!("{direction} MB/s"),
            x_desc: x_desc.into(),
            y_desc: "MB/s".into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            lines: runs
                .iter()
                .enumerate()
                .map(|(i, (name, r))| Line {
                    name: name.clone(),
                    color: color(i),
                    points: r
                        .timeline
                        .iter()
                        .map(|p| (p.t_ms * scale, pick(p)))
                        .collect(),
                    dashed: false,
                })
                .collect(),
            y_range: None,
            legend_position: SeriesLabelPosition::UpperRight,
        });
    }
    let by_op: Vec<(String, [&OpReport; 4])> = runs
        .iter()
        .map(|(name, r)| (name.clone(), ops(r).map(|(_, _, op)| op)))
        .collect();
    let cdfs = cdf_panels(&by_op);
    let mut figures = vec![render(
        "compare_throughput",
        "Throughput over time, one line per run",
        &Panels {
            title: "Throughput, one line per run".into(),
            columns: 2,
            panels: throughput,
            panel_px: (640, 420),
        },
    )?];
    figures.extend(cdf_figure(
        "compare_latency_cdf",
        "Latency CDF per op type, one line per run",
        "Latency CDF, one line per run",
        cdfs,
    )?);
    Ok(figures)
}

/// The CDF panels drawn side by side, two to a row; `None` when there is no panel.
fn cdf_figure(
    name: &str,
    title: &str,
    panels_title: &str,
    cdfs: Vec<LineChart>,
) -> Result<Option<Figure>, PlotError> {
    if cdfs.is_empty() {
        return Ok(None);
    }
    let columns = cdfs.len().min(2);
    render(
        name,
        title,
        &Panels {
            title: panels_title.into(),
            columns,
            panels: cdfs,
            panel_px: (640, 420),
        },
    )
    .map(Some)
}

/// One latency-CDF panel per op type that any run has, one line per run in the run's
/// colour; each run gives its read, write, trim and flush reports in that order.
fn cdf_panels(runs: &[(String, [&OpReport; 4])]) -> Vec<LineChart> {
    let color = |i: usize| SERIES_COLORS[i % SERIES_COLORS.len()];
    let mut cdfs = Vec::new();
    for (op_index, (name, _)) in OP_COLORS.iter().enumerate() {
        let op_of = |r: &[&OpReport; 4]| r[op_index].ios;
        if runs.iter().all(|(_, r)| op_of(r) == 0) {
            continue;
        }
        let lines: Vec<Line> = runs
            .iter()
            .enumerate()
            .filter(|(_, (_, r))| op_of(r) > 0)
            .map(|(i, (run, r))| Line {
                name: format!(
                    "{run} (p99 {} µs)",
                    format_number(r[op_index].latency_us.p99)
                ),
                color: color(i),
                points: cdf_points(r[op_index]),
                dashed: false,
            })
            .collect();
        let y_top = lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1 + 0.3))
            .fold(3.5, f64::max)
            .min(MAX_NINES);
        cdfs.push(LineChart {
            caption: format!("{name} latency CDF"),
            x_desc: "latency (µs, log scale)".into(),
            y_desc: "requests at or below".into(),
            x_scale: Scale::Log10,
            y_scale: Scale::Nines,
            lines,
            y_range: Some((0.0, y_top)),
            legend_position: SeriesLabelPosition::UpperLeft,
        });
    }
    cdfs
}

/// Latency CDFs of several measurements side by side, a panel per op type any of them has
/// and a line per run (SWAN Figure 12: the latency inside the member SSDs of two arrays);
/// `None` when no run completed a request.
pub fn latency_cdf_comparison(
    name: &str,
    title: &str,
    runs: &[(String, &crate::Measurements)],
) -> Result<Option<Figure>, PlotError> {
    let by_op: Vec<(String, [&OpReport; 4])> = runs
        .iter()
        .map(|(run, m)| (run.clone(), [&m.read, &m.write, &m.trim, &m.flush]))
        .collect();
    cdf_figure(name, title, title, cdf_panels(&by_op))
}

/// Headline numbers of several runs side by side, each with its ratio to the first run.
#[derive(Debug, Clone, PartialEq)]
pub struct RatioTable {
    pub runs: Vec<String>,
    /// `(metric, values per run)`.
    pub rows: Vec<(String, Vec<f64>)>,
}

impl RatioTable {
    /// Metrics of op types no run performed are left out.
    pub fn new(runs: &[(String, &RunReport)]) -> Self {
        type Metric = (&'static str, fn(&OpReport) -> f64);
        let metrics: [Metric; 5] = [
            ("IOPS", |o| o.iops),
            ("MB/s", |o| o.bandwidth_mb_s),
            ("mean µs", |o| o.latency_us.mean),
            ("p99 µs", |o| o.latency_us.p99),
            ("p99.9 µs", |o| o.latency_us.p999),
        ];
        let mut rows = Vec::new();
        for (op_index, (op_name, _)) in OP_COLORS.iter().enumerate() {
            if runs.iter().all(|(_, r)| ops(r)[op_index].2.ios == 0) {
                continue;
            }
            for (metric, value) in metrics {
                rows.push((
                    format!("{op_name} {metric}"),
                    runs.iter()
                        .map(|(_, r)| value(ops(r)[op_index].2))
                        .collect(),
                ));
            }
        }
        rows.push(("WAF".to_owned(), runs.iter().map(|(_, r)| r.waf).collect()));
        rows.push((
            "NAND page programs".to_owned(),
            runs.iter()
                .map(|(_, r)| r.nand.page_programs as f64)
                .collect(),
        ));
        Self {
            runs: runs.iter().map(|(name, _)| name.clone()).collect(),
            rows,
        }
    }

    /// The ratio of a value to the first run's, or `None` when the first run's is zero.
    pub fn ratio(values: &[f64], index: usize) -> Option<f64> {
        let base = *values.first()?;
        let value = *values.get(index)?;
        (base != 0.0).then(|| value / base)
    }

    /// The header of [`cells`](Self::cells): the metric, each run, and each later run's ratio.
    pub fn header(&self) -> Vec<String> {
        let mut header = vec!["metric".to_owned()];
        header.extend(self.runs.iter().cloned());
        for run in self.runs.iter().skip(1) {
            header.push(format!("{run} / {}", self.runs[0]));
        }
        header
    }

    /// Formatted cells, row by row, matching [`header`](Self::header).
    pub fn cells(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|(metric, values)| {
                let mut row = vec![metric.clone()];
                row.extend(values.iter().map(|v| format!("{v:.2}")));
                for i in 1..values.len() {
                    row.push(Self::ratio(values, i).map_or("-".to_owned(), |r| format!("{r:.3}")));
                }
                row
            })
            .collect()
    }

    /// A plain-text table with aligned columns.
    pub fn to_text(&self) -> String {
        let header = self.header();
        let cells = self.cells();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &cells {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&cells) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                let pad = " ".repeat(width - cell.chars().count());
                if i == 0 {
                    line.push_str(cell);
                    line.push_str(&pad);
                } else {
                    line.push_str("  ");
                    line.push_str(&pad);
                    line.push_str(cell);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Reproductions

/// One label of a reproduced experiment: the paper's figure and the measured one, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct PaperRow {
    pub label: String,
    pub paper: f64,
    pub measured: Option<f64>,
    /// The lowest and highest measured value over several runs (seeds), drawn as a whisker
    /// over the measured bar, which then shows their mean.
    pub measured_range: Option<(f64, f64)>,
}

/// The paper's figures next to the measured ones for one experiment, one bar pair per label,
/// with measured ÷ paper written next to each pair. The value axis is logarithmic when the
/// labels span more than two orders of magnitude, so small figures stay visible.
pub fn paper_vs_measured(id: &str, unit: &str, rows: &[PaperRow]) -> Result<Figure, PlotError> {
    let values = rows
        .iter()
        .flat_map(|r| std::iter::once(r.paper).chain(r.measured))
        .filter(|v| v.is_finite() && *v > 0.0);
    let log = bounds(values).is_some_and(|(lo, hi)| hi / lo > 100.0);
    let chart = BarChart {
        caption: format!("{id}: paper vs measured ({unit})"),
        value_desc: if log {
            format!("{unit} (log scale)")
        } else {
            unit.to_owned()
        },
        categories: rows.iter().map(|r| r.label.clone()).collect(),
        series: vec![
            BarSeries {
                name: "paper".into(),
                color: SERIES_COLORS[7],
                values: rows.iter().map(|r| r.paper).collect(),
                ranges: Vec::new(),
            },
            BarSeries {
                name: if rows.iter().any(|r| r.measured_range.is_some()) {
                    "measured: mean, whisker min–max".into()
                } else {
                    "measured".into()
                },
                color: SERIES_COLORS[0],
                values: rows.iter().map(|r| r.measured.unwrap_or(0.0)).collect(),
                ranges: rows.iter().map(|r| r.measured_range).collect(),
            },
        ],
        stacked: false,
        log,
        notes: rows
            .iter()
            .map(|r| match (r.measured, r.measured_range) {
                (Some(m), Some((low, high))) if r.paper != 0.0 => format!(
                    "×{:.2} (×{:.2}–{:.2})",
                    m / r.paper,
                    low / r.paper,
                    high / r.paper
                ),
                (Some(m), _) if r.paper != 0.0 => format!("×{:.2}", m / r.paper),
                (Some(_), _) => String::new(),
                (None, _) => "not measured".to_owned(),
            })
            .collect(),
    };
    render(id, &format!("{id}: paper vs measured"), &chart)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_ticks_are_nice_and_cover_the_range() {
        assert_eq!(
            linear_ticks(0.0, 10.0, 5),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        let ticks = linear_ticks(0.0, 1234.0, 8);
        assert_eq!(ticks.first(), Some(&0.0));
        assert!(ticks.windows(2).all(|w| (w[1] - w[0] - 200.0).abs() < 1e-9));
        assert_eq!(linear_ticks(3.0, 3.0, 5), vec![3.0]);
    }

    #[test]
    fn log_ticks_fall_on_one_two_five() {
        let ticks: Vec<f64> = log_ticks(0.0, 2.0)
            .iter()
            .map(|t| (10_f64.powf(*t) * 1e6).round() / 1e6)
            .collect();
        assert_eq!(ticks, vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        // Over many decades only the powers of ten remain.
        assert_eq!(log_ticks(0.0, 6.0).len(), 7);
    }

    #[test]
    fn nines_map_percentiles_evenly() {
        assert!((nines(0.9) - 1.0).abs() < 1e-9);
        assert!((nines(0.99) - 2.0).abs() < 1e-9);
        assert!((nines(0.999) - 3.0).abs() < 1e-9);
        assert_eq!(nines(1.0), MAX_NINES);
        assert_eq!(nines_label(2.0), "99%");
        assert_eq!(nines_label(3.0), "99.9%");
        assert_eq!(nines_label(1.0), "90%");
    }

    fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .expect("PNG header decodes");
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).expect("PNG data decodes");
        pixels.truncate(info.buffer_size());
        (info.width, info.height, pixels)
    }

    fn check(figure: &Figure, expected_width_px: u32) {
        let (width, height, pixels) = decode_png(&figure.png);
        assert_eq!(width, expected_width_px, "{}", figure.name);
        assert!(height >= 260, "{}", figure.name);
        assert_eq!(pixels.len(), width as usize * height as usize * 3);
        assert!(
            pixels.chunks(3).any(|p| p != [255, 255, 255]),
            "{} is blank",
            figure.name
        );
        assert!(figure.svg.starts_with("<svg") && figure.svg.contains("<text"));
    }

    fn array_report() -> RunReport {
        let mut report = crate::tests::sample_report();
        report.members = (0..6)
            .map(|i| crate::MemberReport {
                timeline: report
                    .timeline
                    .iter()
                    .map(|p| TimelinePoint {
                        write_mb_s: p.write_mb_s / 5.0 * (1.0 + f64::from(i) * 0.1),
                        ..p.clone()
                    })
                    .collect(),
                ..crate::MemberReport::default()
            })
            .collect();
        report
    }

    #[test]
    fn every_run_figure_renders_as_svg_and_png() {
        let figures = run_figures(&array_report()).unwrap();
        let names: Vec<&str> = figures.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["timeline", "latency_cdf", "members", "nand"]);
        for figure in &figures {
            let width = match figure.name.as_str() {
                "members" => 4 * 360,
                "nand" => FIGURE_PX.0 * 3 / 2,
                _ => FIGURE_PX.0,
            };
            check(figure, width);
        }
        // Six members in four columns: two rows of panels.
        let (_, height, _) = decode_png(&figures[2].png);
        assert_eq!(height, 2 * 260 + 40);
        assert!(figures[1].svg.contains("write p99.9 ="));
        assert!(figures[3].svg.contains("Write amplification 2.750"));
        // One SSD: no member figure.
        let single = run_figures(&crate::tests::sample_report()).unwrap();
        assert!(single.iter().all(|f| f.name != "members"));
    }

    /// An array report that lists cleaned victims gets SWAN's Figure 7, time measured from
    /// the run's epoch; one without them does not.
    #[test]
    fn victims_become_figure_7() {
        let mut report = array_report();
        report.array = Some(serde_json::json!({
            "epoch_ns": 1e9,
            "victims": [
                {"t_ns": 2e9, "group": 0, "utilization": 0.4, "free_segments": 50},
                {"t_ns": 3e9, "group": 1, "utilization": 0.5, "free_segments": 40},
            ],
        }));
        let chart = victims_chart(&report).expect("a victims chart");
        assert_eq!(chart.panels[0].lines[0].points, [(1.0, 0.4), (2.0, 0.5)]);
        assert_eq!(chart.panels[1].lines[0].points, [(1.0, 50.0), (2.0, 40.0)]);
        let figures = run_figures(&report).unwrap();
        let names: Vec<&str> = figures.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["timeline", "latency_cdf", "members", "victims", "nand"]
        );
        check(&figures[3], 2 * 480);
        report.array = Some(serde_json::json!({"victims": []}));
        assert!(victims_chart(&report).is_none());
    }

    /// A run whose jobs used fio's steady-state detection or latency-target search gets the
    /// `controls` figure: the window's samples with their mean (and fitted slope), and the
    /// search's depth as a step line that ends at its last completion.
    #[test]
    fn run_controls_become_a_figure() {
        let mut report = crate::tests::sample_report();
        assert!(run_controls_chart(&report).is_none());
        report.steady_state.push(crate::SteadyStateReport {
            job: "s".into(),
            ss: "iops_slope:1.000000%".into(),
            attained: true,
            attained_at_s: Some(0.5),
            slope: 2.0,
            interval_s: 0.01,
            window_samples: 3,
            iops: vec![98, 100, 102],
            bw_bytes_s: vec![0; 3],
            ..crate::SteadyStateReport::default()
        });
        report.latency_target.push(crate::LatencyTargetReport {
            job: "l".into(),
            depth: 4,
            converged: true,
            steps: vec![(0.0, 1), (0.1, 2), (0.2, 4)],
            last_completion_s: 0.3,
            ..crate::LatencyTargetReport::default()
        });
        let chart = run_controls_chart(&report).expect("a controls chart");
        let samples = &chart.panels[0].lines;
        assert_eq!(samples[0].points, [(0.0, 98.0), (1.0, 100.0), (2.0, 102.0)]);
        assert_eq!(samples[1].points, [(0.0, 100.0), (2.0, 100.0)]);
        assert_eq!(samples[2].points, [(0.0, 98.0), (2.0, 102.0)]);
        assert_eq!(
            chart.panels[1].lines[0].points,
            [
                (0.0, 1.0),
                (0.1, 1.0),
                (0.1, 2.0),
                (0.2, 2.0),
                (0.2, 4.0),
                (0.3, 4.0)
            ]
        );
        let figures = run_figures(&report).unwrap();
        let controls = figures.iter().find(|f| f.name == "controls").unwrap();
        check(controls, 2 * 560);
        assert!(controls.svg.contains("converged at depth 4"));
    }

    #[test]
    fn cdf_is_a_step_function_and_falls_back_to_percentiles() {
        let report = crate::tests::sample_report();
        let points = cdf_points(&report.write);
        assert!(points.len() >= 2);
        for pair in points.windows(2) {
            assert!(pair[1].0 >= pair[0].0 && pair[1].1 >= pair[0].1, "{pair:?}");
        }
        assert_eq!(points[0].1, 0.0, "starts from the axis");
        // A report without the CDF series is drawn through its percentiles.
        let mut old = report.write.clone();
        old.latency_cdf.clear();
        let points = cdf_points(&old);
        assert_eq!(points.len(), 5);
        assert!((points[2].1 - 2.0).abs() < 1e-9, "p99 at two nines");
    }

    #[test]
    fn comparisons_draw_one_line_per_run_and_compute_ratios() {
        let a = crate::tests::sample_report();
        let mut b = a.clone();
        b.waf = 5.5;
        b.read.iops *= 2.0;
        let runs = vec![("base".to_owned(), &a), ("other".to_owned(), &b)];
        let figures = compare_figures(&runs).unwrap();
        assert_eq!(figures.len(), 2);
        for figure in &figures {
            check(figure, 2 * 640);
            assert!(figure.svg.contains("base") && figure.svg.contains("other"));
        }
        let table = RatioTable::new(&runs);
        let waf = table.rows.iter().find(|r| r.0 == "WAF").unwrap();
        assert_eq!(RatioTable::ratio(&waf.1, 1), Some(2.0));
        let iops = table.rows.iter().find(|r| r.0 == "read IOPS").unwrap();
        assert_eq!(RatioTable::ratio(&iops.1, 1), Some(2.0));
        // No flushes in either run: no flush rows.
        assert!(table.rows.iter().all(|r| !r.0.starts_with("flush")));
        assert_eq!(RatioTable::ratio(&[0.0, 3.0], 1), None);
        let text = table.to_text();
        assert!(text.starts_with("metric"));
        assert!(text.contains("other / base"));
        assert!(text
            .lines()
            .any(|l| l.starts_with("WAF") && l.ends_with("2.000")));
    }

    #[test]
    fn paper_vs_measured_marks_ratios_and_missing_values() {
        let rows = [
            PaperRow {
                label: "rep_1t_gbps".into(),
                paper: 4.8,
                measured: Some(4.8),
                measured_range: None,
            },
            PaperRow {
                label: "conv_gbps".into(),
                paper: 0.55,
                measured: None,
                measured_range: None,
            },
        ];
        let figure = paper_vs_measured("scalaafa-fig3", "GB/s", &rows).unwrap();
        assert_eq!(figure.name, "scalaafa-fig3");
        check(&figure, FIGURE_PX.0);
        assert!(figure.svg.contains("×1.00"));
        assert!(figure.svg.contains("not measured"));
        assert!(figure.svg.contains("rep_1t_gbps"));
        assert!(
            !figure.svg.contains(r#"stroke-width="2""#),
            "no whiskers without ranges"
        );
    }

    #[test]
    fn a_measured_range_is_drawn_as_a_whisker_with_its_ratios() {
        let rows = [PaperRow {
            label: "rep_1t_gbps".into(),
            paper: 4.0,
            measured: Some(4.4),
            measured_range: Some((4.0, 6.0)),
        }];
        let figure = paper_vs_measured("scalaafa-fig3", "GB/s", &rows).unwrap();
        check(&figure, FIGURE_PX.0);
        assert!(figure.svg.contains("×1.10 (×1.00–1.50)"), "{}", figure.svg);
        assert!(figure.svg.contains("measured: mean, whisker min–max"));
        // The whisker's line and its two end ticks.
        assert_eq!(
            figure.svg.matches(r#"stroke-width="2""#).count(),
            3,
            "{}",
            figure.svg
        );
        // The axis reaches past the whisker's high end, not only the bar's.
        let chart = BarChart {
            caption: String::new(),
            value_desc: String::new(),
            categories: vec!["a".into()],
            series: vec![BarSeries {
                name: "measured".into(),
                color: SERIES_COLORS[0],
                values: vec![4.4],
                ranges: vec![Some((4.0, 6.0))],
            }],
            stacked: false,
            log: false,
            notes: Vec::new(),
        };
        assert_eq!(chart.whiskers(), [(0, 0, 4.0, 6.0)]);
        let log = BarChart { log: true, ..chart };
        let (low, high) = (log.whiskers()[0].2, log.whiskers()[0].3);
        assert!((low - 4f64.log10()).abs() < 1e-12 && (high - 6f64.log10()).abs() < 1e-12);
    }

    #[test]
    fn write_figures_names_the_path_it_cannot_write() {
        let file = std::env::temp_dir().join(format!("afa-plot-test-{}", std::process::id()));
        std::fs::write(&file, "a file, not a directory").unwrap();
        let figure = Figure {
            name: "x".into(),
            title: "x".into(),
            svg: String::new(),
            png: Vec::new(),
        };
        let err = write_figures(&file, &[figure]).unwrap_err().to_string();
        std::fs::remove_file(&file).unwrap();
        assert!(err.contains(&file.display().to_string()), "{err}");
    }

    #[test]
    fn numbers_format_compactly() {
        assert_eq!(format_number(0.0), "0");
        assert_eq!(format_number(2.5), "2.5");
        assert_eq!(format_number(1234.0), "1234");
        assert_eq!(format_number(45_600.0), "45.6k");
        assert_eq!(format_number(12_000_000.0), "12M");
    }

    /// A caption wider than the figure loses the unit in its closing parenthesis, nested
    /// parentheses and all, and a caption still too wide is cut with an ellipsis; one that
    /// fits is left alone.
    #[test]
    fn captions_wider_than_the_figure_are_shortened() {
        ensure_font().unwrap();
        let mut svg = String::new();
        let area = SVGBackend::with_string(&mut svg, FIGURE_PX).into_drawing_area();
        let short = "waflash-fig11: paper vs measured (fraction)";
        assert_eq!(fitted_caption(&area, short), short);
        let long = "waflash-fig11: paper vs measured (average-latency reduction of WAFLASH \
                    against the baseline (fraction), best over the request-size sweep)";
        assert_eq!(
            fitted_caption(&area, long),
            "waflash-fig11: paper vs measured"
        );
        let endless = "x".repeat(400);
        let cut = fitted_caption(&area, &endless);
        assert!(cut.ends_with('…') && cut.len() < endless.len(), "{cut}");
        assert_eq!(trailing_parenthesis("a (b (c) d)"), Some(2));
        assert_eq!(trailing_parenthesis("a (b) c"), None);
        assert_eq!(trailing_parenthesis("a b)"), None);
    }
}
