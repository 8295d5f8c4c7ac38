//! End-to-end tests of `afa plot`, `afa compare`, `afa report` and `afa run --output-format
//! fio-json` on real runs: every figure exists, is not trivially small and decodes; the HTML
//! page renders in headless Chromium without console messages; fio's own json+ tool reads
//! the fio output.

mod common;
use common::{afa, fixture, have};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("plot-{}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `config` with `--output-format fio-json --output PATH` and returns the document.
fn fio_json_of(config: &str, path: &Path) -> serde_json::Value {
    let out = afa(&[
        "run",
        config,
        "--quiet",
        "--output-format",
        "fio-json",
        "--output",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn run_to_json(config: Option<&str>, name: &str) -> PathBuf {
    let json = scratch("runs").join(format!("{name}.json"));
    let mut args = vec!["run"];
    if let Some(config) = config {
        args.push(config);
    }
    args.extend(["--quiet", "--json", json.to_str().unwrap()]);
    let out = afa(&args);
    assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    json
}

/// The RAID 5 fixture's run report (five members, a failure and a rebuild), made once.
fn array_run() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| run_to_json(Some(&fixture("raid5.toml")), "raid5"))
}

/// The embedded default run's report (one SSD), made once.
fn ssd_run() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| run_to_json(None, "default"))
}

/// Checks that `dir/NAME.svg` and `dir/NAME.png` exist, are not trivially small, that the
/// PNG decodes to an image with more than one colour, and that the SVG is an SVG document.
fn check_figure(dir: &Path, name: &str) {
    let svg_path = dir.join(format!("{name}.svg"));
    let svg = std::fs::read_to_string(&svg_path)
        .unwrap_or_else(|e| panic!("{}: {e}", svg_path.display()));
    assert!(svg.len() > 4_000, "{name}.svg has only {} bytes", svg.len());
    assert!(
        svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
        "{name}.svg"
    );
    assert!(svg.contains("<text"), "{name}.svg has no text");

    let png_path = dir.join(format!("{name}.png"));
    let bytes = std::fs::read(&png_path).unwrap_or_else(|e| panic!("{}: {e}", png_path.display()));
    assert!(
        bytes.len() > 10_000,
        "{name}.png has only {} bytes",
        bytes.len()
    );
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap_or_else(|e| panic!("{name}.png does not decode: {e}"));
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut pixels)
        .unwrap_or_else(|e| panic!("{name}.png does not decode: {e}"));
    assert!(
        info.width >= 600 && info.height >= 200,
        "{name}.png is {}x{}",
        info.width,
        info.height
    );
    let pixels = &pixels[..info.buffer_size()];
    let background = pixels.chunks(3).filter(|p| *p == [255, 255, 255]).count();
    let total = pixels.len() / 3;
    // A chart is mostly white background with axes, text and lines on it.
    assert!(
        background < total && background > total / 4,
        "{name}.png: {background} of {total} pixels are white"
    );
    let coloured = pixels
        .chunks(3)
        .filter(|p| p[0].abs_diff(p[1]) > 60 || p[1].abs_diff(p[2]) > 60)
        .count();
    assert!(
        coloured > 200,
        "{name}.png has only {coloured} coloured pixels (no data drawn?)"
    );
}

#[test]
fn plot_draws_every_figure_of_an_array_run() {
    let dir = scratch("plot-array");
    let out = afa(&[
        "plot",
        array_run().to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for name in ["timeline", "latency_cdf", "members", "nand"] {
        check_figure(&dir, name);
    }
    // Small multiples: one panel per member, titled by its index.
    let members = std::fs::read_to_string(dir.join("members.svg")).unwrap();
    for i in 0..5 {
        assert!(members.contains(&format!("member {i}")), "panel {i}");
    }
    let cdf = std::fs::read_to_string(dir.join("latency_cdf.svg")).unwrap();
    assert!(
        cdf.contains("p99 =") && cdf.contains("p99.9 ="),
        "p99 and p99.9 are marked"
    );
}

#[test]
fn plot_of_one_ssd_has_no_member_figure() {
    let dir = scratch("plot-ssd");
    let out = afa(&[
        "plot",
        ssd_run().to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for name in ["timeline", "latency_cdf", "nand"] {
        check_figure(&dir, name);
    }
    assert!(!dir.join("members.png").exists());
}

#[test]
fn compare_overlays_runs_and_prints_ratios() {
    let dir = scratch("compare");
    let out = afa(&[
        "compare",
        ssd_run().to_str().unwrap(),
        array_run().to_str().unwrap(),
        "--label",
        "ssd",
        "--label",
        "raid5",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("raid5 / ssd"), "{stdout}");
    let waf_row = stdout
        .lines()
        .find(|l| l.starts_with("WAF"))
        .expect("a WAF row");
    let cells: Vec<f64> = waf_row
        .split_whitespace()
        .skip(1)
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(cells.len(), 3, "{waf_row}");
    // The values are printed to two decimals, so the ratio recomputed from them is close.
    let recomputed = cells[1] / cells[0];
    assert!(
        (recomputed - cells[2]).abs() < 0.02 * cells[2],
        "ratio column: {waf_row}"
    );
    for name in ["compare_throughput", "compare_latency_cdf"] {
        check_figure(&dir, name);
    }
    let cdf = std::fs::read_to_string(dir.join("compare_latency_cdf.svg")).unwrap();
    assert!(
        cdf.contains("ssd (p99") && cdf.contains("raid5 (p99"),
        "one line per run"
    );
}

#[test]
fn bad_inputs_are_named_not_panicked_on() {
    let dir = scratch("bad");
    let not_report = dir.join("not-a-report.json");
    std::fs::write(&not_report, "{\"jobs\": []}").unwrap();
    let out = afa(&[
        "plot",
        not_report.to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("not-a-report.json is not an afa run report"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let missing = dir.join("missing.json");
    let out = afa(&[
        "report",
        missing.to_str().unwrap(),
        "-o",
        dir.join("r.html").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot read run report"),
        "{}",
        text(&out.stderr)
    );

    let out = afa(&[
        "compare",
        ssd_run().to_str().unwrap(),
        not_report.to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("is not an afa run report"));
}

/// Opens `page` in headless Chromium and returns the serialised DOM and every console
/// message Chromium logged while loading it.
fn chromium_console(page: &Path, profile: &Path) -> (String, Vec<String>) {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            &format!("--user-data-dir={}", profile.display()),
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            &format!("file://{}", page.display()),
        ])
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        text(&out.stderr)
    );
    // Chromium logs every console message (console.log/error, uncaught exceptions,
    // blocked resources) as a line with "CONSOLE" in its log prefix.
    let console = text(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect();
    (text(&out.stdout), console)
}

#[test]
fn html_report_renders_in_chromium_without_console_messages() {
    let dir = scratch("report");
    let page = dir.join("report.html");
    let out = afa(&[
        "report",
        ssd_run().to_str().unwrap(),
        array_run().to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: no scripts and nothing fetched from elsewhere.
    assert!(!html.contains("<script"), "no scripts");
    assert!(
        !html.contains("src=") && !html.contains("href=\"http"),
        "nothing fetched"
    );
    // Two runs: comparison (2 figures) + single SSD (3) + array (4).
    assert_eq!(html.matches("<svg").count(), 9);

    if !have("chromium", "command -v chromium") {
        return;
    }
    // The checker must see console messages when there are some, or its silence means
    // nothing: a page that logs an error has to be caught.
    let broken = dir.join("broken.html");
    std::fs::write(
        &broken,
        "<!DOCTYPE html><html><head><title>x</title></head><body>\
         <script>console.error('deliberate');</script></body></html>",
    )
    .unwrap();
    let (_, console) = chromium_console(&broken, &dir.join("profile-broken"));
    assert!(
        console.iter().any(|l| l.contains("deliberate")),
        "console messages are not captured: {console:?}"
    );

    let (dom, console) = chromium_console(&page, &dir.join("profile"));
    assert!(console.is_empty(), "console messages: {console:#?}");
    assert_eq!(
        dom.matches("<svg").count(),
        9,
        "every figure is in the rendered DOM"
    );
    assert!(dom.contains("Comparison") && dom.contains("Configuration"));
}

#[test]
fn fio_json_is_read_by_fios_own_jsonplus_tool() {
    let dir = scratch("fio");
    let fio_json = dir.join("run.fio.json");
    let value = fio_json_of(&fixture("raid5.toml"), &fio_json);
    let job = &value["jobs"][0];
    let writes = job["write"]["total_ios"].as_u64().unwrap();
    assert!(writes > 0 && job["read"]["total_ios"].as_u64().unwrap() > 0);
    assert_eq!(job["job options"]["rw"], "randwrite");

    // fio_jsonplus_clat2csv ships with Debian's fio package and turns json+ latency bins
    // into one CSV per job; --validate rebuilds the bins from the CSV and compares them.
    if !have(
        "fio_jsonplus_clat2csv (Debian fio, with python3-six)",
        "command -v fio_jsonplus_clat2csv && python3 -c 'import six'",
    ) {
        return;
    }
    let csv = dir.join("lat.csv");
    for extra in [None, Some("--validate")] {
        let mut tool = Command::new("fio_jsonplus_clat2csv");
        tool.arg(&fio_json).arg(&csv);
        if let Some(flag) = extra {
            tool.arg(flag);
        }
        let out = tool.output().expect("fio_jsonplus_clat2csv runs");
        assert!(
            out.status.success(),
            "fio_jsonplus_clat2csv {extra:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let table = std::fs::read_to_string(dir.join("lat_job0.csv")).unwrap();
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').map(str::trim).collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (cumulative, percentile) = (
        column("write_lat_ns_cumulative"),
        column("write_lat_ns_percentile"),
    );
    let last = lines
        .rev()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split(',').map(str::trim).collect();
            let c = cells.get(cumulative)?.parse::<u64>().ok()?;
            Some((c, cells[percentile].parse::<f64>().unwrap()))
        })
        .next()
        .expect("write latency rows");
    assert_eq!(last, (writes, 1.0), "the tool counts every write");
}

#[test]
fn fio_json_to_stdout_is_the_only_stdout() {
    let out = afa(&["run", "--output-format", "fio-json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).starts_with("seed: 1\n"),
        "the seed still comes first"
    );
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(value["fio version"], "fio-3.33");
    assert_eq!(value["jobs"][0]["jobname"], "afa");
}

/// fio's steady-state detection and latency-target search from a job file to every output:
/// the run report's entries, the summary's lines, fio's `steadystate` object and
/// `latency_depth` in the fio output, and the `controls` figure.
#[test]
fn run_controls_reach_the_report_the_summary_fio_json_and_the_plots() {
    let dir = scratch("controls");
    let config = dir.join("controls.toml");
    std::fs::write(
        &config,
        r#"seed = 3
[workload]
job = """
[global]
bs=4k
size=16m
time_based
runtime=3s
[fill]
rw=write
bs=128k
iodepth=8
time_based=0
[lat]
stonewall
rw=randread
iodepth=32
latency_target=150us
latency_window=10ms
latency_percentile=99
[steady]
stonewall
rw=randwrite
iodepth=8
ss=iops:5%
ss_dur=50ms
ss_interval=10ms
"""
"#,
    )
    .unwrap();
    let json = dir.join("run.json");
    let out = afa(&[
        "run",
        config.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary = text(&out.stdout);
    assert!(
        summary.contains("Steady state of steady (iops:5.000000%, a 0.05 s window of 5 samples"),
        "{summary}"
    );
    assert!(
        summary.contains("Latency target of lat (150 µs"),
        "{summary}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let search = &report["latency_target"][0];
    assert_eq!(search["converged"], true, "{search}");
    let depth = search["depth"].as_u64().unwrap();
    assert!((1..=32).contains(&depth), "{depth}");
    assert_eq!(report["steady_state"][0]["attained"], true);
    // Both jobs ended long before their three seconds.
    assert!(report["sim_time_ns"].as_u64().unwrap() < 2_000_000_000);

    let fio = fio_json_of(config.to_str().unwrap(), &dir.join("run.fio.json"));
    let job = &fio["jobs"][0];
    assert_eq!(job["latency_depth"].as_u64(), Some(depth));
    assert_eq!(job["latency_target"], 150_000);
    assert_eq!(job["latency_window"], 10_000);
    assert_eq!(job["steadystate"]["ss"], "iops:5.000000%");
    assert_eq!(job["steadystate"]["attained"], 1);
    assert_eq!(
        job["steadystate"]["data"]["iops"].as_array().unwrap().len(),
        5
    );

    let plots = dir.join("plots");
    let out = afa(&[
        "plot",
        json.to_str().unwrap(),
        "-o",
        plots.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    check_figure(&plots, "controls");
}
