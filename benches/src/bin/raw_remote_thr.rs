//! The batched raw socket, sending side, as `raw_local_thr` receives it: a
//! TCP connection to `CONNECT` (`host:port`) with `TCP_NODELAY`, frames (an
//! 8-byte length, then the payload) built in place in one 64 KiB buffer and
//! sent with one `write_all` per full buffer, `COUNT` messages, then close.
//!
//! `raw_remote_thr CONNECT SIZE COUNT`.

use std::net::{Shutdown, TcpStream};
use std::process::ExitCode;

use zerocast_benches::{thr_main, FrameWriter};

fn main() -> ExitCode {
    thr_main("raw_remote_thr", "CONNECT-TO", |connect, size, count| {
        let s = TcpStream::connect(connect)?;
        s.set_nodelay(true)?;
        FrameWriter::batched(size).send(&s, count)?;
        Ok(s.shutdown(Shutdown::Write)?)
    })
}
