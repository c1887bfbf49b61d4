//! An async echo server: a tokio task per connection, on the engines of
//! one runtime (no thread per connection), and clients that check every
//! reply.
//!
//! ```text
//! cargo run --release --example async_echo                              # server + 100 clients over tcp://127.0.0.1
//! cargo run --release --example async_echo -- server tcp://0.0.0.0:7000
//! cargo run --release --example async_echo -- client tcp://127.0.0.1:7000 1000
//! cargo run --release --example async_echo -- mem://echo                # any URI, both sides here
//! ```

use std::time::Instant;

use anyhow::{bail, Context, Result};
use zerocast::tokio::{Listener, Zerocast};

/// Echo every message of every connection until its peer closes.
async fn serve(listener: Listener) -> Result<()> {
    loop {
        let conn = match listener.accept().await {
            Ok(conn) => conn,
            Err(zerocast::AcceptError::Closed) => return Ok(()),
            Err(e) => return Err(e).context("accept"),
        };
        tokio::spawn(async move {
            let (tx, rx) = conn.split::<Vec<u8>, Vec<u8>>();
            while let Ok(msg) = rx.recv().await {
                if tx.send(msg).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// `clients` clients at once, each sending `rounds` messages and checking
/// each echo.
async fn clients(zc: &Zerocast, uri: &str, clients: usize, rounds: usize) -> Result<()> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (zc, uri) = (zc.clone(), uri.to_owned());
        tasks.spawn(async move {
            let conn = zc.connect(&uri).await.with_context(|| format!("connect to {uri}"))?;
            let (tx, rx) = conn.split::<Vec<u8>, Vec<u8>>();
            for r in 0..rounds {
                let msg: Vec<u8> = (0..(16 + (c + r) % 200)).map(|i| (i + c + r) as u8).collect();
                tx.send(msg.clone()).await.map_err(|e| anyhow::anyhow!("send: {e}"))?;
                let back = rx.recv().await.context("receive echo")?;
                if back != msg {
                    bail!("client {c}: echo {r} differs");
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("client task")??;
    }
    let n = clients * rounds;
    println!("{clients} clients x {rounds} echoes checked in {:?} ({n} round trips)", start.elapsed());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let zc = Zerocast::new();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["server", uri] => {
            let listener = zc.listen(uri).await.with_context(|| format!("listen at {uri}"))?;
            println!("echoing at {}", listener.local_endpoint());
            serve(listener).await
        }
        ["client", uri] => clients(&zc, uri, 100, 100).await,
        ["client", uri, n] => clients(&zc, uri, n.parse().context("number of clients")?, 100).await,
        rest => {
            let uri = rest.first().copied().unwrap_or("tcp://127.0.0.1:0");
            let listener = zc.listen(uri).await.with_context(|| format!("listen at {uri}"))?;
            let at = listener.local_endpoint().to_string();
            let server = tokio::spawn(serve(listener));
            clients(&zc, &at, 100, 100).await?;
            server.abort();
            Ok(())
        }
    }
}
