//! Many clients, two serving threads: a typed echo service on a
//! `zerocast::Poller` instead of a thread per connection.
//!
//! ```text
//! cargo run -p zerocast-examples --example poll_server            # 1,000 clients over tcp://
//! cargo run -p zerocast-examples --example poll_server -- 200 mem://poll-demo
//! ```
//!
//! Every accepted connection's receiver is registered with its index as
//! the token. A serving thread waits for ready tokens, answers every
//! request of each with `try_recv` until `Empty` (which arms it for the
//! next arrival), and goes back to waiting. The process's thread count
//! does not grow with the clients.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;

use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};
use zerocast::{Events, Poller, Receiver, RecvError, Sender, TypedRecvError};

#[derive(Debug, Serialize, Deserialize)]
struct Ping {
    client: u64,
    n: u64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Pong {
    client: u64,
    n: u64,
}

/// A token no connection has: stop serving.
const STOP: usize = usize::MAX;
const SERVING_THREADS: usize = 2;
const PINGS: u64 = 20;

type Slot = OnceLock<(Sender<Pong>, Receiver<Ping>)>;

fn serve(poller: &Poller, slots: &[Slot], ended: &AtomicUsize) {
    let mut events = Events::with_capacity(64);
    loop {
        poller.wait(&mut events, None);
        for token in events.iter() {
            if token == STOP {
                poller.wake(STOP); // for the other serving threads
                return;
            }
            let Some((tx, rx)) = slots.get(token).and_then(OnceLock::get) else { continue };
            loop {
                match rx.try_recv() {
                    Ok(Ping { client, n }) => {
                        if tx.send(Pong { client, n }).is_err() {
                            break;
                        }
                    }
                    Err(TypedRecvError::Recv(RecvError::Empty)) => break,
                    // The client closed (or failed): this connection is done.
                    Err(_) => {
                        if ended.fetch_add(1, Ordering::Relaxed) + 1 == slots.len() {
                            poller.wake(STOP);
                        }
                        break;
                    }
                }
            }
        }
    }
}

fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: usize = args.next().map(|s| s.parse()).transpose().context("CLIENTS")?.unwrap_or(1_000);
    let uri = args.next().unwrap_or_else(|| "tcp://127.0.0.1:0".to_owned());

    let listener = zerocast::listen(&uri)?;
    let at = listener.local_endpoint().to_string();
    let poller = Poller::new();
    let slots: Arc<Vec<Slot>> = Arc::new((0..clients).map(|_| OnceLock::new()).collect());
    let ended = Arc::new(AtomicUsize::new(0));
    let servers: Vec<_> = (0..SERVING_THREADS)
        .map(|_| {
            let (poller, slots, ended) = (poller.clone(), slots.clone(), ended.clone());
            thread::spawn(move || serve(&poller, &slots, &ended))
        })
        .collect();

    // The clients: each connects, and the server registers it as accepted.
    let mut conns = Vec::with_capacity(clients);
    for (token, slot) in slots.iter().enumerate() {
        conns.push(zerocast::connect(&at)?.split::<Ping, Pong>());
        let (tx, rx) = listener.accept()?.split::<Pong, Ping>();
        let rx = &slot.get_or_init(|| (tx, rx)).1;
        poller.register(rx.connection(), token)?;
    }
    let threads = threads_now();
    for n in 0..PINGS {
        for (client, (tx, _)) in conns.iter().enumerate() {
            tx.send(Ping { client: client as u64, n }).map_err(|e| anyhow::anyhow!("send: {e}"))?;
        }
        for (client, (_, rx)) in conns.iter().enumerate() {
            let pong = rx.recv()?;
            ensure!(pong == Pong { client: client as u64, n }, "client {client}: a wrong reply {pong:?}");
        }
    }
    drop(conns);
    for s in servers {
        s.join().map_err(|_| anyhow::anyhow!("a serving thread panicked"))?;
    }
    println!(
        "{clients} clients x {PINGS} pings over {uri}: every reply right; {threads} threads in this process \
         (clients included), {SERVING_THREADS} of them serving"
    );
    Ok(())
}
