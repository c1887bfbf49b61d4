//! perftest's tables on stdout, and the same figures as JSON.

use std::io::{self, Write};

use serde::Serialize;

use crate::spec::{Mode, Spec};
use crate::stats::{BwRow, LatRow};

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
    /// The requested window; each row may have used less (bytes in flight are capped).
    pub(crate) inflight: u32,
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
pub(crate) fn header(out: &mut impl Write, mode: Mode, spec: &Spec) -> io::Result<()> {
    let what = match mode {
        Mode::Bw => "Send BW",
        Mode::Lat => "Send Latency",
        Mode::Rate => "Send message rate",
    };
    writeln!(out, "{RULE}")?;
    writeln!(out, "                    zerocast {what} Test")?;
    writeln!(out, " Transport       : {}", spec.transport)?;
    writeln!(out, " API             : {}", if spec.typed { "typed Sender<T>" } else { "raw buffers" })?;
    writeln!(out, " Poll            : {}", spec.poll.as_str())?;
    writeln!(out, " Inflight        : {} (capped at 32 MiB in flight)", spec.window)?;
    match spec.duration_ms {
        Some(ms) => writeln!(out, " Duration        : {:.1} s", ms as f64 / 1e3)?,
        None => writeln!(out, " Iterations      : {}", spec.iters)?,
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
        row(&mut out, &Row::Bw(bw)).unwrap();
        let text = String::from_utf8(out).unwrap();
        let cols: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(cols, ["65536", "5000", "9.50", "9.25", "0.017000"]);
    }
}
