//! The HTML report: one self-contained page per set of runs, with each run's configuration,
//! its summary tables and its figures as inline SVG. No scripts, style sheets, fonts or
//! images are fetched, so the page opens the same from a mail attachment as from a web
//! server, and a browser reports nothing on its console.

use std::fmt::Write as _;

use crate::plot::{self, Figure, PlotError, RatioTable};
use crate::RunReport;

const STYLE: &str = "
body { font-family: sans-serif; margin: 2em auto; max-width: 1500px; padding: 0 1em; color: #222; }
h1, h2, h3 { font-weight: 600; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #ddd; }
th { text-align: left; background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0 2em; }
figure svg { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; margin-top: 0.3em; }
pre { background: #f8f8f8; padding: 1em; overflow-x: auto; }
";

/// Escapes text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// The page for `runs` (name, report): a comparison section with the ratio table and overlay
/// figures when there is more than one run, then every run's summary, figures and
/// configuration.
pub fn report_html(runs: &[(String, &RunReport)]) -> Result<String, PlotError> {
    let mut page = String::new();
    let title = match runs {
        [(name, _)] => format!("afa run report: {name}"),
        _ => format!("afa run report: {} runs", runs.len()),
    };
    // Writing to a String cannot fail, so the fmt::Results below are ignored.
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<link rel=\"icon\" href=\"data:,\">\n<style>{STYLE}</style>\n\
         </head>\n<body>\n<h1>{}</h1>\n",
        escape(&title),
        escape(&title)
    );
    if runs.len() > 1 {
        page.push_str("<section id=\"comparison\">\n<h2>Comparison</h2>\n");
        let table = RatioTable::new(runs);
        page.push_str(&html_table(&table.header(), &table.cells()));
        for figure in plot::compare_figures(runs)? {
            push_figure(&mut page, &figure);
        }
        page.push_str("</section>\n");
    }
    for (index, (name, report)) in runs.iter().enumerate() {
        let _ = writeln!(
            page,
            "<section id=\"run-{index}\">\n<h2>{}</h2>",
            escape(name)
        );
        push_summary(&mut page, report);
        for figure in plot::run_figures(report)? {
            push_figure(&mut page, &figure);
        }
        let config = serde_json::to_string_pretty(&report.config).unwrap_or_default();
        let _ = writeln!(
            page,
            "<h3>Configuration</h3>\n<pre>{}</pre>\n</section>",
            escape(&config)
        );
    }
    page.push_str("</body>\n</html>\n");
    Ok(page)
}

fn push_figure(page: &mut String, figure: &Figure) {
    let _ = writeln!(
        page,
        "<figure id=\"{}\">\n{}\n<figcaption>{}</figcaption>\n</figure>",
        escape(&figure.name),
        inline_svg(&figure.svg),
        escape(&figure.title)
    );
}

/// The `<svg>` element of an SVG document, without any XML declaration, which is not allowed
/// inside HTML.
fn inline_svg(svg: &str) -> &str {
    svg.find("<svg").map_or(svg, |start| &svg[start..])
}

/// A table with a header row (left out when every header cell is empty); cells that parse
/// as numbers are right-aligned.
fn html_table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table>\n");
    if header.iter().any(|h| !h.is_empty()) {
        out.push_str("<tr>");
        for cell in header {
            let _ = write!(out, "<th>{}</th>", escape(cell));
        }
        out.push_str("</tr>\n");
    }
    for row in rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            if i > 0 && cell.parse::<f64>().is_ok() {
                let _ = write!(out, "<td class=\"num\">{}</td>", escape(cell));
            } else {
                let _ = write!(out, "<td>{}</td>", escape(cell));
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    out
}

fn push_summary(page: &mut String, r: &RunReport) {
    let _ = writeln!(
        page,
        "<p>Seed {}, {:.6} s simulated, {:.3} s of host time. Latencies in µs; MB = 10<sup>6</sup> bytes.</p>",
        r.seed,
        r.sim_time_ns as f64 / 1e9,
        r.host_time_s
    );
    let header: Vec<String> = [
        "op", "IOs", "bytes", "IOPS", "MB/s", "mean", "p50", "p90", "p99", "p99.9", "max",
    ]
    .iter()
    .map(|h| (*h).to_owned())
    .collect();
    let mut rows = Vec::new();
    for (name, op) in [
        ("read", &r.read),
        ("write", &r.write),
        ("trim", &r.trim),
        ("flush", &r.flush),
    ] {
        let l = &op.latency_us;
        rows.push(vec![
            name.to_owned(),
            op.ios.to_string(),
            op.bytes.to_string(),
            format!("{:.1}", op.iops),
            format!("{:.2}", op.bandwidth_mb_s),
            format!("{:.2}", l.mean),
            format!("{:.2}", l.p50),
            format!("{:.2}", l.p90),
            format!("{:.2}", l.p99),
            format!("{:.2}", l.p999),
            format!("{:.2}", l.max),
        ]);
    }
    page.push_str("<h3>Host I/O</h3>\n");
    page.push_str(&html_table(&header, &rows));

    let n = &r.nand;
    page.push_str("<h3>NAND</h3>\n");
    let _ = writeln!(
        page,
        "<p>Write amplification {:.3} ({} NAND page programs / {} host page writes).</p>",
        r.waf, n.page_programs, r.host_page_writes
    );
    let nand_rows = vec![
        vec![
            "SLC".to_owned(),
            n.slc_reads.to_string(),
            n.slc_programs.to_string(),
            n.slc_erases.to_string(),
        ],
        vec![
            "MLC/TLC".to_owned(),
            n.mlc_reads.to_string(),
            n.mlc_programs.to_string(),
            n.mlc_erases.to_string(),
        ],
        vec![
            "total".to_owned(),
            n.page_reads.to_string(),
            n.page_programs.to_string(),
            n.block_erases.to_string(),
        ],
    ];
    let nand_header: Vec<String> = ["cells", "page reads", "page programs", "block erases"]
        .iter()
        .map(|h| (*h).to_owned())
        .collect();
    page.push_str(&html_table(&nand_header, &nand_rows));

    let g = &r.gc;
    let w = &r.wear;
    let i = &r.integrity;
    let mut misc = vec![
        vec![
            "GC".to_owned(),
            format!(
                "{} runs ({} foreground, {} background), {} pages moved, {} SLC evictions",
                g.runs, g.foreground_runs, g.background_runs, g.pages_moved, g.slc_evictions
            ),
        ],
        vec![
            "Wear".to_owned(),
            format!(
                "erase count min {} / mean {:.2} / max {} ({:.2}% of rated life), {} static wear-levelling moves",
                w.erase_count_min,
                w.erase_count_mean,
                w.erase_count_max,
                w.life_used_fraction * 100.0,
                w.static_wl_moves
            ),
        ],
        vec![
            "Integrity".to_owned(),
            format!(
                "{} sectors read and checked, {} mismatches",
                i.reads_checked, i.mismatches
            ),
        ],
        vec!["Array members".to_owned(), r.members.len().to_string()],
    ];
    if let Some(faults) = w.faults_summary() {
        misc.insert(2, vec!["Faults".to_owned(), faults]);
    }
    page.push_str(&html_table(&["".to_owned(), "".to_owned()], &misc));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn one_run_page_is_self_contained() {
        let mut report = crate::tests::sample_report();
        report.config = serde_json::json!({ "note": "<script>alert(1)</script>" });
        let page = report_html(&[("run <1>".to_owned(), &report)]).unwrap();
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.trim_end().ends_with("</html>"));
        assert!(!page.contains("<script"), "the configuration is escaped");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains("run &lt;1&gt;"));
        // timeline, latency CDF and NAND, inline; no comparison for one run.
        assert_eq!(page.matches("<svg").count(), 3);
        assert!(!page.contains("<?xml"));
        assert!(!page.contains("id=\"comparison\""));
        assert!(page.contains("<td class=\"num\">100</td>"), "the write IOs");
    }

    #[test]
    fn several_runs_start_with_the_comparison() {
        let a = crate::tests::sample_report();
        let page = report_html(&[("a".to_owned(), &a), ("b".to_owned(), &a)]).unwrap();
        let comparison = page.find("id=\"comparison\"").unwrap();
        assert!(comparison < page.find("id=\"run-0\"").unwrap());
        assert!(page.contains("b / a"));
        assert_eq!(page.matches("<svg").count(), 2 + 3 + 3);
    }
}
