//! `--plot`: bandwidth or latency against message size, one line per run.

use std::path::Path;

use anyhow::{anyhow, bail};
use plotters::prelude::*;

use crate::report::{Row, Run};

/// Line colours, one per run, in order.
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The y value of a row and the axis it belongs on.
fn y_of(row: &Row) -> f64 {
    match row {
        Row::Bw(r) => r.bw_avg_gbps,
        Row::Lat(r) => r.t_typical_us,
    }
}

/// The x value: log2 of the size, so that axis labels fall on powers of two.
fn x_of(row: &Row) -> i32 {
    let bytes = match row {
        Row::Bw(r) => r.bytes,
        Row::Lat(r) => r.bytes,
    };
    bytes.max(1).ilog2() as i32
}

/// Draw every run into an SVG at `path`.
pub(crate) fn svg(path: &Path, runs: &[Run], title: &str) -> anyhow::Result<()> {
    let points: Vec<(i32, f64)> =
        runs.iter().flat_map(|r| r.results.iter().map(|p| (x_of(p), y_of(p)))).collect();
    if points.is_empty() {
        bail!("nothing to plot");
    }
    let lat = matches!(runs[0].results.first(), Some(Row::Lat(_)));
    let (xmin, xmax) = points.iter().fold((i32::MAX, i32::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (ymin, ymax) = points.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (xmin, xmax) = (xmin - 1, xmax + 1);
    let ylabel = if lat { "t_typical [usec] (half round trip)" } else { "BW average [Gb/s]" };
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());

    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut b = ChartBuilder::on(&root);
    b.caption(title, ("sans-serif", 20)).margin(16).x_label_area_size(44).y_label_area_size(64);
    let fmt_size = |x: &i32| if *x >= 0 { human_size(1u64 << x) } else { String::new() };
    // Both span decades across a sweep (and zero-copy mem:// "bandwidth"
    // grows with the size): a log axis.
    let floor = if lat { 1e-3 } else { 1e-4 };
    let mut chart = b
        .build_cartesian_2d(xmin..xmax, (ymin.max(floor) / 1.5..ymax.max(floor) * 1.5).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("message size [bytes]")
        .y_desc(ylabel)
        .x_label_formatter(&fmt_size)
        .x_labels((xmax - xmin + 1) as usize)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, run) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let series: Vec<(i32, f64)> = run.results.iter().map(|p| (x_of(p), y_of(p).max(floor))).collect();
        let label = format!("{}{}", run.transport, if run.typed { " (typed)" } else { "" });
        chart
            .draw_series(LineSeries::new(series.clone(), colour.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart
            .draw_series(series.into_iter().map(|p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// 2, 64, 4K, 1M.
fn human_size(x: u64) -> String {
    match x {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::BwRow;

    #[test]
    fn sizes_read_as_powers_of_two() {
        assert_eq!(human_size(2), "2");
        assert_eq!(human_size(4096), "4K");
        assert_eq!(human_size(8388608), "8M");
    }

    #[test]
    fn an_svg_has_one_line_per_run() {
        let run = |name: &str, k: f64| Run {
            mode: "bw",
            transport: name.to_owned(),
            typed: false,
            poll: "event",
            async_api: false,
            inflight: 64,
            clock: None,
            results: (1..=10)
                .map(|i| {
                    Row::Bw(BwRow {
                        bytes: 1 << i,
                        iterations: 10,
                        bw_peak_gbps: k * i as f64,
                        bw_avg_gbps: k * i as f64,
                        msg_rate_mpps: 1.0,
                        seconds: 1.0,
                        lost: 0,
                    })
                })
                .collect(),
        };
        let dir = std::env::temp_dir().join(format!("zerocast-perf-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.svg");
        svg(&path, &[run("tcp", 1.0), run("mem", 2.0)], "test").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..40]);
        // Per run: its line and its legend mark, in its own colour.
        for colour in ["#1F77B4", "#FF7F0E"] {
            let lines = text.lines().filter(|l| l.starts_with("<polyline") && l.contains(colour)).count();
            assert_eq!(lines, 2, "{colour}");
        }
        assert!(text.contains("\ntcp\n") && text.contains("\nmem\n"), "legend labels");
        assert!(text.contains("\n1K\n"), "size labels on powers of two");
    }
}
