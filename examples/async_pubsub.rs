//! One publisher, many subscribers, in tokio: the publisher sends each
//! update to every subscriber's connection from its own task, and a slow
//! subscriber holds back only its own connection (its credits run out; the
//! others go on).
//!
//! ```text
//! cargo run --release --example async_pubsub                  # publisher + 50 subscribers over tcp://127.0.0.1
//! cargo run --release --example async_pubsub -- mem://pubsub  # any URI
//! ```

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use zerocast::tokio::{Listener, Sender, Zerocast};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Update {
    seq: u64,
    topic: String,
    price: f64,
}

const UPDATES: u64 = 2_000;

/// Accept `n` subscribers, then publish to all of them: one task per
/// subscriber takes updates from a broadcast channel and sends them.
async fn publish(listener: Listener, n: usize) -> Result<()> {
    let (fanout, _) = tokio::sync::broadcast::channel::<Update>(64);
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..n {
        let conn = listener.accept().await.context("accept")?;
        let (tx, _rx): (Sender<Update>, _) = conn.split::<Update, ()>();
        let mut updates = fanout.subscribe();
        senders.spawn(async move {
            while let Ok(u) = updates.recv().await {
                tx.send(u).await.map_err(|e| anyhow::anyhow!("send: {e}"))?;
            }
            anyhow::Ok(())
        });
    }
    for seq in 0..UPDATES {
        let update = Update { seq, topic: format!("ticker-{}", seq % 8), price: 100.0 + seq as f64 / 100.0 };
        // Waits while the slowest subscriber's task is a channel behind.
        while fanout.len() >= 60 {
            tokio::task::yield_now().await;
        }
        fanout.send(update).context("no subscriber left")?;
    }
    drop(fanout);
    while let Some(done) = senders.join_next().await {
        done.context("sender task")??;
    }
    Ok(())
}

/// Take every update, in order; every tenth subscriber is slow.
async fn subscribe(zc: Zerocast, uri: String, id: usize) -> Result<u64> {
    let conn = zc.connect(&uri).await.with_context(|| format!("connect to {uri}"))?;
    let (_tx, rx) = conn.split::<(), Update>();
    let mut next = 0u64;
    while let Ok(u) = rx.recv().await {
        if u.seq != next {
            bail!("subscriber {id}: update {} where {next} was due", u.seq);
        }
        next += 1;
        if id % 10 == 0 && next % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(next)
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let uri = std::env::args().nth(1).unwrap_or_else(|| "tcp://127.0.0.1:0".to_owned());
    let subscribers = 50;
    let zc = Zerocast::new();
    let listener = zc.listen(&uri).await.with_context(|| format!("listen at {uri}"))?;
    let at = listener.local_endpoint().to_string();
    let start = Instant::now();
    let publisher = tokio::spawn(publish(listener, subscribers));
    let subs: Vec<_> =
        (0..subscribers).map(|id| tokio::spawn(subscribe(zc.clone(), at.clone(), id))).collect();
    for (id, s) in subs.into_iter().enumerate() {
        let got = s.await.context("subscriber task")??;
        if got != UPDATES {
            bail!("subscriber {id} got {got} of {UPDATES} updates");
        }
    }
    publisher.await.context("publisher task")??;
    println!("{subscribers} subscribers each got all {UPDATES} updates, in order, in {:?}", start.elapsed());
    Ok(())
}
