//! One-sided RDMA on zerocast's RC backend, after the RC example of the
//! Mellanox RDMA programming manual: the server exposes a buffer and sends
//! its `RemoteRegion` (address, length, rkey) in a typed message; the
//! client RDMA-READs the buffer, then RDMA-WRITEs into it, and says so; the
//! server prints what was written. The server's CPU takes no part in the
//! READ or the WRITE.
//!
//! ```text
//! rdma_read_write                       # both roles, in one process
//! rdma_read_write server [port]         # port 0 (default): any free port
//! rdma_read_write client <server-address> <port>
//! ```
//!
//! The one-process mode listens on `rc://$ZEROCAST_RDMA_ADDR:0` (default
//! 10.0.2.15, the Soft-RoCE guest's address). Set `ZEROCAST_SCHEME=rc+oob`
//! to connect over the TCP side channel instead of rdma_cm. Needs an RDMA
//! device: run it inside the Soft-RoCE guest (`scripts/softroce-run`).

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use zerocast::rdma::{OneSided, RemoteRegion};
use zerocast::{Connection, Receiver, Sender};

/// What the two sides tell each other.
#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    /// The server's exposed buffer.
    Region(RemoteRegion),
    /// The client wrote into it.
    Written,
}

const SIZE: usize = 4096;
const SERVER_TEXT: &str = "hello from the server's exposed buffer";
const CLIENT_TEXT: &str = "written by the client with RDMA WRITE";

fn scheme() -> String {
    std::env::var("ZEROCAST_SCHEME").unwrap_or_else(|_| "rc".to_owned())
}

fn typed(conn: &Connection) -> (Sender<Msg>, Receiver<Msg>) {
    conn.clone().split::<Msg, Msg>()
}

/// Text up to the first zero byte.
fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn server(conn: &Connection) -> Result<()> {
    let rc = conn.as_rc().ok_or_else(|| anyhow!("not an RC connection"))?;
    let (tx, rx) = typed(conn);
    let mut buf = conn.alloc(SIZE).context("alloc")?;
    buf.fill(0);
    buf[..SERVER_TEXT.len()].copy_from_slice(SERVER_TEXT.as_bytes());
    // The peer may read and write exactly these bytes until `exposure`
    // drops; the buffer stays borrowed until then.
    let exposure = rc.expose_writable(&mut buf).context("expose")?;
    let region = exposure.region();
    println!("server: exposing {} bytes at {:#x}, rkey {:#x}", region.len, region.addr, region.rkey);
    tx.send(Msg::Region(region)).map_err(|e| anyhow!("send the region: {e}"))?;
    let reply = rx.recv().context("wait for the client")?;
    exposure.revoke();
    match reply {
        Msg::Written => println!("server: buffer now holds: {}", text(&buf)),
        other => bail!("unexpected message {other:?}"),
    }
    Ok(())
}

fn client(conn: &Connection) -> Result<()> {
    let rc = conn.as_rc().ok_or_else(|| anyhow!("not an RC connection"))?;
    let (tx, rx) = typed(conn);
    let region = match rx.recv().context("wait for the region")? {
        Msg::Region(r) => r,
        other => bail!("unexpected message {other:?}"),
    };
    println!("client: got region {region:?}");
    let local = conn.alloc(SIZE).context("alloc")?;
    let local = rc.read(local, region).map_err(|e| anyhow!("RDMA READ: {}", e.error()))?;
    println!("client: RDMA READ: {}", text(&local));
    let mut local = local;
    local.fill(0);
    local[..CLIENT_TEXT.len()].copy_from_slice(CLIENT_TEXT.as_bytes());
    let local = rc.write(local, region).map_err(|e| anyhow!("RDMA WRITE: {}", e.error()))?;
    drop(local);
    println!("client: RDMA WRITE done");
    tx.send(Msg::Written).map_err(|e| anyhow!("send: {e}"))?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scheme = scheme();
    match args.first().map(String::as_str) {
        Some("server") => {
            let port = args.get(1).map_or(Ok(0), |p| p.parse()).context("usage: server [port]")?;
            let listener = zerocast::listen(&format!("{scheme}://0.0.0.0:{port}")).context("listen")?;
            println!("server: listening on {}", listener.local_endpoint());
            server(&listener.accept().context("accept")?)
        }
        Some("client") => {
            let [_, addr, port] = args.as_slice() else { bail!("usage: client <server-address> <port>") };
            client(&zerocast::connect(&format!("{scheme}://{addr}:{port}")).context("connect")?)
        }
        Some(other) => bail!("unknown role `{other}`: use `server [port]` or `client <address> <port>`"),
        None => {
            let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
            let listener = zerocast::listen(&format!("{scheme}://{addr}:0")).context("listen")?;
            let at = listener.local_endpoint().to_string();
            println!("server: listening on {at}");
            let peer = std::thread::spawn(move || -> Result<()> {
                client(&zerocast::connect(&at).context("connect")?)
            });
            let conn = listener.accept().context("accept")?;
            server(&conn)?;
            peer.join().map_err(|_| anyhow!("client thread panicked"))?
        }
    }
}
