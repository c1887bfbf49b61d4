//! The passive side of the classic rdma_cm send/receive tutorial, on
//! zerocast's RC backend (`rc://`: rdma_cm underneath).
//!
//! ```text
//! rdma_cm_server [port]                 # port 0 (default): any free port
//! rdma_cm_client <server-address> <port>
//! ```
//!
//! It waits for one client, prints its message, answers with its own, and
//! exits when the client disconnects. Needs an RDMA device: run it inside
//! the Soft-RoCE guest (`scripts/softroce-run`).

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use zerocast::RecvError;

fn main() -> Result<()> {
    let port: u16 = match std::env::args().nth(1) {
        Some(p) => p.parse().context("usage: rdma_cm_server [port]")?,
        None => 0,
    };
    let listener = zerocast::listen(&format!("rc://0.0.0.0:{port}")).context("listen")?;
    let bound = listener.local_endpoint().port().unwrap_or(port);
    println!("listening on port {bound}.");
    let conn = listener.accept().context("accept")?;
    println!("received connection request.");
    let msg = conn.recv().context("receive the client's message")?;
    println!("received message: {}", String::from_utf8_lossy(&msg));
    drop(msg);
    println!("connected. posting send...");
    let text = format!("message from passive/server side with pid {}", std::process::id());
    let mut buf = conn.alloc(text.len()).context("alloc")?;
    buf.copy_from_slice(text.as_bytes());
    conn.send(buf).map_err(|e| anyhow!("send: {e}"))?;
    // Accepted by the connection: the peer has a receive posted for it
    // (credits), and RC delivers it reliably.
    println!("send completed successfully.");
    match conn.recv() {
        Err(RecvError::Disconnected) => println!("peer disconnected."),
        Ok(extra) => println!("unexpected message of {} bytes", extra.len()),
        Err(e) => return Err(e).context("waiting for the disconnect"),
    }
    // Say goodbye too, and let it be acknowledged before the process exits.
    if !conn.close_and_wait(Duration::from_secs(5)) {
        bail!("the connection did not close cleanly");
    }
    Ok(())
}
