//! Typed request/reply over any transport.
//!
//! ```text
//! cargo run --release --example hello                          # server + client in one process over tcp://127.0.0.1
//! cargo run --release --example hello -- server tcp://0.0.0.0:7000
//! cargo run --release --example hello -- client tcp://127.0.0.1:7000
//! cargo run --release --example hello -- mem://hello           # any URI, both sides in one process
//! ```

use std::thread;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use zerocast::Listener;

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    from: String,
    pid: u32,
    numbers: Vec<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    greeting: String,
    sum: u64,
}

fn serve(listener: Listener) -> Result<()> {
    let conn = listener.accept().context("accept")?;
    let (tx, rx) = conn.split::<Reply, Request>();
    // Answer every request until the client disconnects.
    for req in rx.iter() {
        let reply = Reply {
            greeting: format!("hello {} (pid {}), from pid {}", req.from, req.pid, std::process::id()),
            sum: req.numbers.iter().sum(),
        };
        tx.send(reply).map_err(|e| anyhow::anyhow!("send reply: {e}"))?;
    }
    Ok(())
}

fn client(uri: &str) -> Result<()> {
    let conn = zerocast::connect(uri).with_context(|| format!("connect to {uri}"))?;
    println!("connected to {} over {}", conn.peer(), conn.scheme());
    let (tx, rx) = conn.split::<Request, Reply>();
    let req = Request { from: "client".into(), pid: std::process::id(), numbers: (1..=10).collect() };
    tx.send(req).map_err(|e| anyhow::anyhow!("send request: {e}"))?;
    let reply = rx.recv().context("receive reply")?;
    println!("reply: {} (sum = {})", reply.greeting, reply.sum);
    if reply.sum != 55 {
        bail!("wrong sum {}", reply.sum);
    }
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["server", uri] => {
            let listener = zerocast::listen(uri)?;
            println!("listening on {}", listener.local_endpoint());
            serve(listener)
        }
        ["client", uri] => client(uri),
        [] | [_] => {
            let uri = args.first().map_or("tcp://127.0.0.1:0", String::as_str);
            let listener = zerocast::listen(uri)?;
            let at = listener.local_endpoint().to_string();
            println!("listening on {at}");
            let server = thread::spawn(move || serve(listener));
            client(&at)?;
            server.join().map_err(|_| anyhow::anyhow!("server thread panicked"))??;
            Ok(())
        }
        _ => bail!("usage: hello [URI] | hello server URI | hello client URI"),
    }
}
