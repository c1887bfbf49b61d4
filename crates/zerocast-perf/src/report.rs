//! perftest's tables on stdout, and the same figures as JSON.

use std::io::{self, Write};

use serde::Serialize;

use crate::clock::ClockKind;
use crate::spec::{Mode, Spec};
use crate::stats::{BwRow, LatRow, SPREAD_PERCENTILES};

const RULE: &str = "---------------------------------------------------------------------------------------";

/// One result row.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub(crate) enum Row {
    Bw(BwRow),
    Lat(LatRow),
}

/// Every result of one transport.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Run {
    pub(crate) mode: &'static str,
    pub(crate) transport: String,
    pub(crate) typed: bool,
    pub(crate) poll: &'static str,
    /// Through the async API (`zerocast::tokio`).
    pub(crate) async_api: bool,
    /// The requested window; each row may have used less (bytes in flight are capped).
    pub(crate) inflight: u32,
    /// Latency runs: what timed the samples (`cycles` or `monotonic`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) clock: Option<&'static str>,
    pub(crate) results: Vec<Row>,
}

/// The whole JSON document.
#[derive(Debug, Serialize)]
pub(crate) struct Doc<'a> {
    pub(crate) tool: &'static str,
    pub(crate) version: &'static str,
    /// What the latency figures are.
    pub(crate) latency: &'static str,
    pub(crate) runs: &'a [Run],
}

impl Doc<'_> {
    pub(crate) const LATENCY: &'static str = "half the round trip, in microseconds, as ib_send_lat";
}

/// The table's header: a description of the test, then the column names.
pub(crate) fn header(out: &mut impl Write, mode: Mode, spec: &Spec, clock: ClockKind) -> io::Result<()> {
    let what = match mode {
        Mode::Bw => "Send BW",
        Mode::Lat => "Send Latency",
        Mode::Rate => "Send message rate",
    };
    writeln!(out, "{RULE}")?;
    writeln!(out, "                    zerocast {what} Test")?;
    writeln!(out, " Transport       : {}", spec.transport)?;
    let api = match (spec.typed, spec.async_api) {
        (true, _) => "typed Sender<T>",
        (false, false) => "raw buffers",
        (false, true) => "raw buffers, async (zerocast::tokio, current-thread runtime)",
    };
    writeln!(out, " API             : {api}")?;
    writeln!(out, " Poll            : {}", spec.poll.as_str())?;
    writeln!(out, " Inflight        : {} (capped at 32 MiB in flight)", spec.window)?;
    match spec.duration_ms {
        Some(ms) => writeln!(out, " Duration        : {:.1} s", ms as f64 / 1e3)?,
        None => writeln!(out, " Iterations      : {}", spec.iters)?,
    }
    if mode == Mode::Lat {
        writeln!(out, " Clock           : {}", clock.describe())?;
    }
    writeln!(out, "{RULE}")?;
    match mode {
        Mode::Lat => writeln!(
            out,
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
             t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        ),
        _ => writeln!(out, " #bytes     #iterations    BW peak[Gb/s]    BW average[Gb/s]   MsgRate[Mpps]"),
    }
}

/// One table row.
pub(crate) fn row(out: &mut impl Write, row: &Row) -> io::Result<()> {
    match row {
        Row::Bw(r) => {
            write!(
                out,
                " {:<10} {:<10}       {:<16.2} {:<18.2} {:.6}",
                r.bytes, r.iterations, r.bw_peak_gbps, r.bw_avg_gbps, r.msg_rate_mpps
            )?;
            if r.lost > 0 {
                write!(out, "   ({} lost)", r.lost)?;
            }
            writeln!(out)
        }
        Row::Lat(r) => writeln!(
            out,
            " {:<7} {:<10}   {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
            r.bytes,
            r.iterations,
            r.t_min_us,
            r.t_max_us,
            r.t_typical_us,
            r.t_avg_us,
            r.t_stdev_us,
            r.p99_us,
            r.p999_us
        ),
    }
}

/// The spread of a latency row, one line under it (`-H`): each percentile
/// of [`SPREAD_PERCENTILES`] and its half round trip. The line starts
/// with a word, so a parser that takes the row whose first field is the
/// size still finds the row.
pub(crate) fn spread(out: &mut impl Write, row: &Row) -> io::Result<()> {
    let Row::Lat(r) = row else { return Ok(()) };
    write!(out, " spread[usec]:")?;
    for (p, t) in SPREAD_PERCENTILES.iter().zip(&r.spread_us) {
        write!(out, "  p{p}={t:.2}")?;
    }
    writeln!(out)
}

/// The closing rule.
pub(crate) fn footer(out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "{RULE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_line_up_with_perftest_columns() {
        let mut out = Vec::new();
        let bw = BwRow {
            bytes: 65536,
            iterations: 5000,
            bw_peak_gbps: 9.5,
            bw_avg_gbps: 9.25,
            msg_rate_mpps: 0.017,
            seconds: 0.3,
            lost: 0,
        };
        row(&mut out, &Row::Bw(bw.clone())).unwrap();
        let text = String::from_utf8(out).unwrap();
        let cols: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(cols, ["65536", "5000", "9.50", "9.25", "0.017000"]);
        let mut out = Vec::new();
        spread(&mut out, &Row::Bw(bw)).unwrap();
        assert!(out.is_empty(), "bandwidth rows have no spread");
    }

    #[test]
    fn the_spread_line_names_each_percentile() {
        let lat = LatRow {
            bytes: 64,
            iterations: 1000,
            t_min_us: 1.0,
            t_max_us: 9.0,
            t_typical_us: 4.0,
            t_avg_us: 4.5,
            t_stdev_us: 1.0,
            p99_us: 8.0,
            p999_us: 8.5,
            spread_us: vec![1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        };
        let mut out = Vec::new();
        spread(&mut out, &Row::Lat(lat)).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            " spread[usec]:  p5=1.50  p10=2.00  p25=3.00  p50=4.00  p75=5.00  p90=6.00  p95=7.00\n"
        );
    }
}
