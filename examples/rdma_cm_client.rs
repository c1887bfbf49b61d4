//! The active side of the classic rdma_cm send/receive tutorial, on
//! zerocast's RC backend (`rc://`: rdma_cm underneath).
//!
//! ```text
//! rdma_cm_client <server-address> <port>
//! ```
//!
//! Connecting resolves the address and the route, then connects with
//! receives already posted. The client sends its message, prints the
//! server's, and disconnects. Needs an RDMA device: run it inside the
//! Soft-RoCE guest (`scripts/softroce-run`).

use anyhow::{anyhow, bail, Context, Result};
use zerocast::RecvError;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, port] = args.as_slice() else {
        bail!("usage: rdma_cm_client <server-address> <port>");
    };
    let conn = zerocast::connect(&format!("rc://{addr}:{port}")).context("connect")?;
    // `connect` resolved the address, then the route, then connected.
    println!("address resolved.");
    println!("route resolved.");
    println!("connected. posting send...");
    let text = format!("message from active/client side with pid {}", std::process::id());
    let mut buf = conn.alloc(text.len()).context("alloc")?;
    buf.copy_from_slice(text.as_bytes());
    conn.send(buf).map_err(|e| anyhow!("send: {e}"))?;
    println!("send completed successfully.");
    let msg = conn.recv().context("receive the server's message")?;
    println!("received message: {}", String::from_utf8_lossy(&msg));
    drop(msg);
    conn.close();
    match conn.recv() {
        Err(RecvError::Disconnected) => println!("disconnected."),
        Ok(extra) => println!("unexpected message of {} bytes", extra.len()),
        Err(e) => return Err(e).context("waiting for the disconnect"),
    }
    Ok(())
}
