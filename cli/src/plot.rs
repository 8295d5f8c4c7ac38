//! `afa plot`, `afa compare` and `afa report`: figures, comparisons and the HTML page drawn
//! from run reports written by `afa run --json`, and the fio json+ output of `afa run`.

use std::path::{Path, PathBuf};

use afa_report::plot::{self, RatioTable};
use afa_report::{fio_json, html, RunReport};

#[derive(Debug, clap::Args)]
pub struct PlotArgs {
    /// A run report written by `afa run --json`.
    pub run: PathBuf,
    /// The directory the SVG and PNG files are written to (created if missing).
    #[arg(short, long, default_value = "plots")]
    pub output: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Two or more run reports; the first is the baseline of the ratios.
    #[arg(required = true, num_args = 2..)]
    pub runs: Vec<PathBuf>,
    /// The directory the overlay figures are written to (created if missing).
    #[arg(short, long, default_value = "plots")]
    pub output: PathBuf,
    /// A name per run for legends and the table, in order (default: the file names).
    #[arg(long = "label")]
    pub labels: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// One or more run reports; with several, the page starts with a comparison.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// A name per run, in order (default: the file names).
    #[arg(long = "label")]
    pub labels: Vec<String>,
}

/// How `afa run` writes its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// The human summary table.
    #[default]
    Human,
    /// fio 3.x json+ (see docs/plots.md).
    FioJson,
}

/// Reads a run report, naming the file and the problem when it is not one.
pub fn load_run(path: &Path) -> Result<RunReport, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read run report {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not an afa run report (as written by `afa run --json PATH`): {e}",
            path.display()
        )
    })
}

/// Loads every run and names it by its label, or else by its file stem; repeated names get
/// their position appended so that legends stay unambiguous.
fn load_named(paths: &[PathBuf], labels: &[String]) -> Result<Vec<(String, RunReport)>, String> {
    if !labels.is_empty() && labels.len() != paths.len() {
        return Err(format!(
            "{} labels given for {} runs; give one --label per run or none",
            labels.len(),
            paths.len()
        ));
    }
    let mut runs: Vec<(String, RunReport)> = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let mut name = labels.get(i).cloned().unwrap_or_else(|| {
            path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            )
        });
        if runs.iter().any(|(other, _)| *other == name) {
            name = format!("{name} ({})", i + 1);
        }
        runs.push((name, load_run(path)?));
    }
    Ok(runs)
}

fn borrowed(runs: &[(String, RunReport)]) -> Vec<(String, &RunReport)> {
    runs.iter().map(|(name, r)| (name.clone(), r)).collect()
}

pub fn plot(args: PlotArgs) -> Result<(), String> {
    let report = load_run(&args.run)?;
    let figures = plot::run_figures(&report).map_err(|e| e.to_string())?;
    let written = plot::write_figures(&args.output, &figures).map_err(|e| e.to_string())?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

pub fn compare(args: CompareArgs) -> Result<(), String> {
    let runs = load_named(&args.runs, &args.labels)?;
    let runs = borrowed(&runs);
    print!("{}", RatioTable::new(&runs).to_text());
    let figures = plot::compare_figures(&runs).map_err(|e| e.to_string())?;
    let written = plot::write_figures(&args.output, &figures).map_err(|e| e.to_string())?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

pub fn report(args: ReportArgs) -> Result<(), String> {
    let runs = load_named(&args.runs, &args.labels)?;
    let page = html::report_html(&borrowed(&runs)).map_err(|e| e.to_string())?;
    std::fs::write(&args.output, page)
        .map_err(|e| format!("cannot write {}: {e}", args.output.display()))?;
    println!("{}", args.output.display());
    Ok(())
}

/// Writes `report` as fio json+ to `path`, or to stdout when there is none. The job is named
/// after the configuration file.
pub fn write_fio_json(
    report: &RunReport,
    config_path: Option<&Path>,
    path: Option<&Path>,
) -> Result<(), String> {
    let job_name = config_path
        .and_then(|p| p.file_stem())
        .map_or_else(|| "afa".to_owned(), |s| s.to_string_lossy().into_owned());
    let value = fio_json::to_fio_json(report, &job_name);
    let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())? + "\n";
    match path {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
        }
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Writes `ID.svg` and `ID.png` into `dir`: the paper's figures next to the measured ones.
pub fn write_reproduction_chart(
    dir: &Path,
    r: &crate::reproduce::Reproduction,
) -> Result<Vec<PathBuf>, String> {
    write_reproduction_chart_with_ranges(dir, r, |_| None)
}

/// The same chart, with `range(label)` (the lowest and highest value over several seeds)
/// drawn as a whisker over the measured bar, which then holds their mean.
pub fn write_reproduction_chart_with_ranges(
    dir: &Path,
    r: &crate::reproduce::Reproduction,
    range: impl Fn(&str) -> Option<(f64, f64)>,
) -> Result<Vec<PathBuf>, String> {
    let figure = plot::paper_vs_measured(&r.id, &r.unit, &paper_rows(r, range))
        .map_err(|e| e.to_string())?;
    plot::write_figures(dir, &[figure]).map_err(|e| e.to_string())
}

/// The paper's labels in order, with the measured value under the same label when there is
/// one, and its range when `range` knows one.
fn paper_rows(
    r: &crate::reproduce::Reproduction,
    range: impl Fn(&str) -> Option<(f64, f64)>,
) -> Vec<plot::PaperRow> {
    r.paper
        .iter()
        .map(|(label, paper)| plot::PaperRow {
            label: label.clone(),
            paper: *paper,
            measured: r.measured.get(label).copied(),
            measured_range: range(label),
        })
        .collect()
}

/// Writes `dir/README.md`: the gallery index, with every experiment's chart and its table of
/// paper vs measured figures. Returns the index's path.
pub fn write_gallery_index(
    dir: &Path,
    results: &[(&str, &str, crate::reproduce::Reproduction)],
    quick: bool,
    seed: u64,
) -> Result<PathBuf, String> {
    let mut text = String::from("# Reproduction gallery\n\n");
    text.push_str(&format!(
        "Generated by `afa reproduce --all{} --seed {seed} --plots DIR`; do not edit by hand. \
         Each chart puts the paper's figures (grey) next to the measured ones (blue), with \
         measured ÷ paper beside each pair.\n",
        if quick { " --quick" } else { "" }
    ));
    let judged: Vec<_> = results
        .iter()
        .flat_map(|(_, _, r)| crate::reproduce::claims::evaluate(r))
        .collect();
    let (holding, missing, unmeasured) = crate::reproduce::claims::tally(&judged);
    text.push_str(&format!(
        "\nBelow each chart, the claims the experiment is judged by (the paper's statements and \
         the issue's acceptance tests, each with its threshold): {holding} hold, {missing} miss, \
         {unmeasured} not measured in this run.\n"
    ));
    for (id, what, r) in results {
        text.push_str(&format!("\n## `{id}`\n\n{what}\n\n![{id}]({id}.svg)\n\n"));
        for figure in own_figures(dir, id)? {
            text.push_str(&format!("![{figure}]({figure})\n\n"));
        }
        let unit = markdown_unit(&r.unit);
        text.push_str(&format!(
            "| Label | Paper ({unit}) | Measured ({unit}) | Ratio |\n"
        ));
        text.push_str("|---|---|---|---|\n");
        for row in paper_rows(r, |_| None) {
            let (measured, ratio) = match row.measured {
                Some(m) if row.paper != 0.0 => (format!("{m:.3}"), format!("{:.2}", m / row.paper)),
                Some(m) => (format!("{m:.3}"), "-".to_owned()),
                None => ("not measured".to_owned(), "-".to_owned()),
            };
            text.push_str(&format!(
                "| `{}` | {:.3} | {measured} | {ratio} |\n",
                row.label, row.paper
            ));
        }
        let claims = crate::reproduce::claims::evaluate(r);
        if !claims.is_empty() {
            text.push_str("\n| Claim | Verdict | Values |\n|---|---|---|\n");
            for c in claims {
                text.push_str(&format!(
                    "| {} | {} | {} |\n",
                    c.claim.replace('|', "\\|"),
                    c.verdict(),
                    c.values.replace('|', "\\|")
                ));
            }
        }
    }
    write_index(dir, &text)
}

/// The figures an experiment drew itself into the gallery's directory beside its chart
/// (`swan-fig6`'s per-SSD bandwidth, `swan-fig12`'s latency CDF): every `ID.*.svg`, in name
/// order.
fn own_figures(dir: &Path, id: &str) -> Result<Vec<String>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // The index is written into a directory it creates: nothing was drawn there yet.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
    };
    let prefix = format!("{id}.");
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".svg") && name != format!("{id}.svg") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// A unit as a Markdown table cell: units such as "GB/s for *_gbps" would otherwise turn
/// into emphasis or split the cell.
pub fn markdown_unit(unit: &str) -> String {
    unit.replace('|', "\\|")
        .replace('*', "\\*")
        .replace('_', "\\_")
}

/// Writes a gallery index as `dir/README.md` and returns its path.
pub fn write_index(dir: &Path, text: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join("README.md");
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::reproduce::Reproduction;

    #[test]
    fn gallery_has_a_chart_and_a_table_row_per_label() {
        let dir = std::env::temp_dir().join(format!("afa-gallery-test-{}", std::process::id()));
        let r = Reproduction {
            id: "demo-fig1".into(),
            unit: "MB/s".into(),
            paper: BTreeMap::from([("after".to_owned(), 525.0), ("before".to_owned(), 1120.0)]),
            measured: BTreeMap::from([("before".to_owned(), 1167.0)]),
            context: BTreeMap::new(),
        };
        let written = write_reproduction_chart(&dir, &r).unwrap();
        assert_eq!(
            written,
            [dir.join("demo-fig1.svg"), dir.join("demo-fig1.png")]
        );
        assert!(std::fs::metadata(&written[1]).unwrap().len() > 5_000);
        // A figure the experiment drew itself is shown under its chart; another
        // experiment's, whose id merely starts alike, is not.
        std::fs::write(dir.join("demo-fig1.latency_cdf.svg"), "<svg/>").unwrap();
        std::fs::write(dir.join("demo-fig10.svg"), "<svg/>").unwrap();
        let index =
            write_gallery_index(&dir, &[("demo-fig1", "A demo experiment", r)], true, 7).unwrap();
        let text = std::fs::read_to_string(&index).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(text.contains("afa reproduce --all --quick --seed 7"));
        assert!(text.contains("![demo-fig1](demo-fig1.svg)"));
        assert!(text.contains("![demo-fig1.latency_cdf.svg](demo-fig1.latency_cdf.svg)"));
        assert!(!text.contains("demo-fig10"), "{text}");
        assert!(
            text.contains("| `before` | 1120.000 | 1167.000 | 1.04 |"),
            "{text}"
        );
        assert!(
            text.contains("| `after` | 525.000 | not measured | - |"),
            "{text}"
        );
    }

    #[test]
    fn gallery_lists_each_claim_with_its_verdict() {
        let dir = std::env::temp_dir().join(format!("afa-gallery-claims-{}", std::process::id()));
        let r = Reproduction {
            id: "swan-fig4b".into(),
            unit: "MB/s".into(),
            paper: BTreeMap::from([
                ("log-raid0_3".to_owned(), 600.0),
                ("log-raid0_6".to_owned(), 550.0),
                ("log-raid0_9".to_owned(), 500.0),
            ]),
            measured: BTreeMap::from([
                ("log-raid0_3".to_owned(), 240.0),
                ("log-raid0_6".to_owned(), 397.0),
                ("log-raid0_9".to_owned(), 630.0),
            ]),
            context: BTreeMap::new(),
        };
        let index = write_gallery_index(&dir, &[("swan-fig4b", "Fig. 4b", r)], true, 1).unwrap();
        let text = std::fs::read_to_string(&index).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(text.contains("0 hold, 1 miss, 1 not measured"), "{text}");
        assert!(
            text.contains("| Log-RAID0 falls as SSDs are added (log-raid0_3 > log-raid0_6 > log-raid0_9) | MISS | 240 > 397 > 630 |"),
            "{text}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_run_report_is_named() {
        let path = std::env::temp_dir().join(format!("afa-not-report-{}.json", std::process::id()));
        std::fs::write(&path, "[1, 2, 3]").unwrap();
        let err = load_run(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(err.contains("is not an afa run report"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        let err = load_named(&[path.clone(), path], &["one".into()]).unwrap_err();
        assert!(err.contains("1 labels given for 2 runs"), "{err}");
    }
}
