//! Multicast datagrams, with the options of rdma-core's `mckey` (the
//! multicast example of the RDMA programming manual): over RDMA UD when a
//! device serves the bind address, over UDP multicast otherwise, and says
//! which.
//!
//! ```text
//! multicast -m GROUP [-b BIND_ADDR] [-s] [-C COUNT] [-S SIZE] [-p PORT] [--raw]
//!   -m  multicast group address (e.g. 239.1.2.3)
//!   -b  address of the interface to use (default 127.0.0.1: UDP on loopback)
//!   -s  send (default: receive)
//!   -C  datagrams to send or receive (default 10)
//!   -S  payload bytes (default 100)
//!   -p  port (UDP only; RDMA multicast has none; default 7174)
//!   --raw  no zerocast header, to talk to `mckey` itself (RDMA only)
//! ```
//!
//! Try it in the Soft-RoCE guest, against `mckey` or itself:
//!
//! ```sh
//! cargo build -p zerocast-examples --features rdma --examples
//! scripts/softroce-run bash -c 'target/debug/examples/multicast -m 239.1.1.1 -b 10.0.2.15 -C 5 &
//!     sleep 3; target/debug/examples/multicast -m 239.1.1.1 -b 10.0.2.15 -s -C 5; wait'
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use zerocast::datagram::{Backend, DatagramSocket};

struct Opts {
    group: String,
    bind: String,
    sender: bool,
    count: u64,
    size: usize,
    port: u16,
    raw: bool,
}

fn parse() -> Result<Opts> {
    let mut o = Opts {
        group: String::new(),
        bind: "127.0.0.1".into(),
        sender: false,
        count: 10,
        size: 100,
        port: 7174,
        raw: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "-m" => o.group = val("-m")?,
            "-b" => o.bind = val("-b")?,
            "-s" => o.sender = true,
            "-C" => o.count = val("-C")?.parse().context("-C takes a count")?,
            "-S" => o.size = val("-S")?.parse().context("-S takes a size in bytes")?,
            "-p" => o.port = val("-p")?.parse().context("-p takes a port")?,
            "--raw" => o.raw = true,
            other => bail!("unknown option {other}; see the header of examples/multicast.rs"),
        }
    }
    if o.group.is_empty() {
        bail!("usage: multicast -m GROUP [-b BIND_ADDR] [-s] [-C COUNT] [-S SIZE] [-p PORT] [--raw]");
    }
    Ok(o)
}

/// A raw RDMA socket: a member of the group, or a sender bound at `-b`.
#[cfg(feature = "rdma")]
fn open_raw(o: &Opts) -> Result<DatagramSocket> {
    use zerocast::datagram::UdConfig;
    let ud = zerocast::global().ud().context("--raw needs an RDMA device")?;
    let cfg = UdConfig::default().with_raw(true);
    let s = if o.sender {
        ud.bind_with(&format!("ud://{}:0", o.bind).parse()?, cfg)?
    } else {
        ud.multicast_with(&format!("mcast://{}:{}?iface={}", o.group, o.port, o.bind).parse()?, cfg)?
    };
    Ok(DatagramSocket::from_ud(s))
}

#[cfg(not(feature = "rdma"))]
fn open_raw(_: &Opts) -> Result<DatagramSocket> {
    bail!("--raw talks to RDMA programs; build with `--features rdma`")
}

fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let o = parse()?;
    let group: SocketAddr = format!("{}:{}", o.group, o.port).parse().context("-m takes an IP address")?;
    let sock = if o.raw {
        open_raw(&o)?
    } else if o.sender {
        zerocast::datagram::bind(&format!("ud://{}:0", o.bind))?
    } else {
        zerocast::datagram::bind(&format!("mcast://{group}?iface={}", o.bind))?
    };
    let over = match sock.backend() {
        Backend::RdmaUd => "RDMA UD",
        _ => "UDP multicast",
    };
    println!(
        "multicast: {} over {over} at {}",
        if o.sender { "sending" } else { "receiving" },
        sock.local_addr()
    );
    if o.size > sock.max_datagram() {
        bail!("-S {} is over the {}-byte datagram limit here", o.size, sock.max_datagram());
    }
    if o.sender {
        for i in 0..o.count {
            let mut b = sock.alloc(o.size, None)?;
            b.fill((i % 251) as u8);
            sock.send_to(b, &group).map_err(|(_, e)| e)?;
            std::thread::sleep(Duration::from_millis(1));
        }
        sock.flush(Duration::from_secs(5));
        println!("multicast: sent {} datagrams of {} bytes to {}", o.count, o.size, o.group);
        return Ok(());
    }
    let start = Instant::now();
    let mut got = 0;
    while got < o.count {
        let (d, from) = sock.recv_from(Some(Instant::now() + Duration::from_secs(30)))?;
        got += 1;
        if got == 1 {
            println!("multicast: first datagram ({} bytes) from {from}", d.len());
        }
    }
    println!("multicast: received {got} datagrams in {:?}", start.elapsed());
    for (src, st) in sock.sources() {
        println!(
            "multicast: from {src}: received {} lost {} reordered {}",
            st.received, st.lost, st.reordered
        );
    }
    Ok(())
}
