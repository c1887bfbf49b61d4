//! Typed messages of any size: a sequence number and a byte string, sent
//! by reference (`send_borrowed`: one encode into the pool buffer) and
//! received borrowed (`recv_ref`: no copy out of the receive buffer).

use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize, Serializer};
use zerocast::Sender;

use crate::zc::{spawn_receiver, zc_pair_with};
use crate::{link_for, BoxError, Pipe};

/// A typed message: `data` is one bincode byte string (a `memcpy` each
/// way), not a sequence of `u8`.
#[derive(Debug, Serialize, Deserialize, yoke::Yokeable)]
pub struct Blob<'a> {
    /// The sequence number the receiver checks.
    pub seq: u64,
    /// The payload, borrowed on both ends.
    #[serde(borrow, serialize_with = "as_bytes")]
    pub data: &'a [u8],
}

fn as_bytes<S: Serializer>(data: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(data)
}

/// zerocast's typed API with [`Blob`]s of a given size.
#[derive(Debug)]
pub struct TypedBytesPipe {
    tx: Sender<Blob<'static>>,
    payload: Vec<u8>,
    n: u64,
    seq: u64,
    done: Receiver<()>,
    receiver: Option<JoinHandle<()>>,
}

impl TypedBytesPipe {
    /// A pipe at `uri` sending `n` blobs of `size` payload bytes per batch.
    pub fn new(uri: &str, size: usize, n: u64) -> Result<Self, BoxError> {
        let (conn, server) = zc_pair_with(uri, link_for(size))?;
        let (tx, _) = conn.split::<Blob<'static>, ()>();
        let (_, rx) = server.split::<(), Blob<'static>>();
        let (done, h) = spawn_receiver(n, move |expect| match rx.recv_ref() {
            Ok(g) => {
                assert_eq!(g.get().seq, expect, "typed receiver: message out of order");
                assert_eq!(g.get().data.len(), size, "typed receiver: wrong size");
                true
            }
            Err(_) => false,
        })?;
        Ok(Self { tx, payload: vec![7u8; size], n, seq: 0, done, receiver: Some(h) })
    }
}

impl Pipe for TypedBytesPipe {
    fn batch(&mut self) -> Duration {
        let start = Instant::now();
        for _ in 0..self.n {
            self.tx.send_borrowed(&Blob { seq: self.seq, data: &self.payload }).expect("typed send");
            self.seq += 1;
        }
        self.done.recv().expect("typed receiver stopped");
        start.elapsed()
    }

    fn msgs(&self) -> u64 {
        self.n
    }

    fn bytes(&self) -> u64 {
        self.n * self.payload.len() as u64
    }
}

impl Drop for TypedBytesPipe {
    fn drop(&mut self) {
        self.tx.connection().close();
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
    }
}
