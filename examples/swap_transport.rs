//! One piece of application code, run over every transport built in.
//!
//! The pipeline below is written once against `zerocast::Connection`; only
//! the URI changes. This is how an application tests over `mem://` or
//! `tcp://` on a laptop and runs over `rc://` on an RDMA cluster.

use std::thread;

use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Sample {
    seq: u64,
    values: Vec<f64>,
}

/// The application: a producer streams samples, a consumer sums them.
fn pipeline(uri: &str, n: u64) -> Result<f64> {
    let listener = zerocast::listen(uri)?;
    let at = listener.local_endpoint().to_string();
    let producer = thread::spawn(move || -> Result<()> {
        let (tx, _rx) = zerocast::connect(&at)?.split::<Sample, ()>();
        for seq in 0..n {
            tx.send(Sample { seq, values: vec![seq as f64; 4] }).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        Ok(())
    });
    let (_tx, rx) = listener.accept()?.split::<(), Sample>();
    let mut total = 0.0;
    for (expected, s) in rx.iter().enumerate() {
        ensure!(s.seq == expected as u64, "out of order: {} != {expected}", s.seq);
        total += s.values.iter().sum::<f64>();
    }
    producer.join().map_err(|_| anyhow::anyhow!("producer panicked"))??;
    Ok(total)
}

fn main() -> Result<()> {
    let n = 10_000;
    let expected = 4.0 * (n * (n - 1) / 2) as f64;
    let mut uris = vec!["mem://swap-demo".to_owned(), "tcp://127.0.0.1:0".to_owned()];
    if let Ok(rc) = std::env::var("ZEROCAST_RC_URI") {
        uris.push(rc);
    }
    for uri in uris {
        let total = pipeline(&uri, n)?;
        ensure!(total == expected, "{uri}: total {total} != {expected}");
        println!("{uri:<24} {n} samples, total {total}: ok");
    }
    Ok(())
}
