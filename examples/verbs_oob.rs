//! The verbs client/server with a TCP side channel, on zerocast's RC
//! backend (`rc+oob://`): the server posts a send, the client receives it.
//!
//! ```text
//! verbs_oob [-p PORT]                   # server (no host): waits for one client
//! verbs_oob [-p PORT] <server-address>  # client
//! ```
//!
//! The port defaults to 6543; the server takes `-p 0` to mean any free
//! port, and prints the one it bound. As in the classic program, the two
//! sides exchange their QP number, LID (and here PSN and GID) over a TCP
//! socket, drive their QPs INIT → RTR → RTS by hand, and then the server
//! posts one send, which lands in a receive the client posted before it
//! said it was ready. zerocast does all of that in `listen`/`accept` and
//! `connect`; the lines printed follow the original's steps. Needs an RDMA
//! device: run it inside the Soft-RoCE guest (`scripts/softroce-run`).

use anyhow::{anyhow, bail, Context, Result};
use zerocast::{Connection, RecvError, Scheme};

const DEFAULT_PORT: u16 = 6543;
const SERVER_TEXT: &str = "hello from server";

struct Args {
    port: u16,
    host: Option<String>,
}

fn args() -> Result<Args> {
    const USAGE: &str = "usage: verbs_oob [-p PORT] [server-address]";
    let mut port = DEFAULT_PORT;
    let mut host = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-p" | "--port" => {
                port = it.next().context(USAGE)?.parse().context(USAGE)?;
            }
            "-h" | "--help" => bail!(USAGE),
            _ if host.is_none() && !a.starts_with('-') => host = Some(a),
            _ => bail!(USAGE),
        }
    }
    Ok(Args { port, host })
}

/// What the device steps of the original print: the device, its port, and
/// that the connection is an out-of-band RC one.
fn describe_device() -> Result<()> {
    let rc = zerocast::global().rc().context("open the RDMA device")?;
    let dev = rc.device();
    println!("[OK] open device {}.", dev.name());
    let port = dev.port_attr().context("query port")?;
    println!("[OK] query port {}.", port.port);
    println!("\tlid: {}, active mtu: {}", port.lid, port.active_mtu);
    Ok(())
}

fn describe_connection(conn: &Connection) -> Result<()> {
    if conn.scheme() != Scheme::RcOob {
        bail!("expected an rc+oob connection, got {:?}", conn.scheme());
    }
    // `accept`/`connect` created the CQ and QP, moved the QP to INIT,
    // posted the receives, exchanged QP number, PSN, LID and GID over the
    // socket, and moved the QP to RTR and RTS.
    println!("[OK] create cq.");
    println!("[OK] create qp.");
    println!("[OK] modify qp to INIT state.");
    println!("remote peer: {}", conn.peer());
    println!("[OK] modify qp to RTR state.");
    println!("[OK] modify qp to RTS state.");
    Ok(())
}

fn server(port: u16) -> Result<()> {
    describe_device()?;
    let listener = zerocast::listen(&format!("rc+oob://0.0.0.0:{port}")).context("listen")?;
    let bound = listener.local_endpoint().port().unwrap_or(port);
    println!("start to listen on port {bound}...");
    let conn = listener.accept().context("accept")?;
    println!("successfully accept client, {}", conn.peer());
    describe_connection(&conn)?;
    let mut buf = conn.alloc(SERVER_TEXT.len()).context("alloc")?;
    buf.copy_from_slice(SERVER_TEXT.as_bytes());
    println!("[OK] reg mr.");
    println!("\tva: {:#x}, len: {}, lkey: {:#x}", buf.addr(), buf.len(), buf.keys().lkey);
    conn.send(buf).map_err(|e| anyhow!("post send: {e}"))?;
    println!("[OK] post send.");
    // The client closes once it has the message; its goodbye arrives after
    // our send completed (RC delivers in order and acknowledges).
    match conn.recv() {
        Err(RecvError::Disconnected) => println!("[OK] poll cq: send completed."),
        Ok(extra) => bail!("unexpected message of {} bytes from the client", extra.len()),
        Err(e) => return Err(e).context("waiting for the client to finish"),
    }
    println!("[OK] destroy qp.");
    Ok(())
}

fn client(host: &str, port: u16) -> Result<()> {
    describe_device()?;
    let conn = zerocast::connect(&format!("rc+oob://{host}:{port}")).context("connect")?;
    println!("successfully connect to server, ip: {host}, port: {port}");
    describe_connection(&conn)?;
    // The receives were posted before the QP was declared ready.
    println!("[OK] post recv.");
    let msg = conn.recv().context("receive the server's send")?;
    println!("[OK] poll cq.");
    println!("\tbuf: {}", String::from_utf8_lossy(&msg));
    if &msg[..] != SERVER_TEXT.as_bytes() {
        bail!("the server sent {:?}, not {SERVER_TEXT:?}", String::from_utf8_lossy(&msg));
    }
    drop(msg);
    conn.close();
    match conn.recv() {
        Err(RecvError::Disconnected) => {}
        Ok(extra) => bail!("unexpected message of {} bytes", extra.len()),
        Err(e) => return Err(e).context("waiting for the disconnect"),
    }
    println!("[OK] destroy qp.");
    Ok(())
}

fn main() -> Result<()> {
    let a = args()?;
    match &a.host {
        None => server(a.port),
        Some(host) => client(host, a.port),
    }
}
