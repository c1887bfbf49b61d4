//! Entry points for fuzzing the parts of the core that face the peer: the
//! frame decoder over a byte stream, and the credit machine driven by a
//! hostile peer. The `fuzz/` targets call them with libFuzzer's inputs;
//! `cargo test` replays the committed corpus and a seeded run through the
//! same functions on stable.
//!
//! Each function panics only when an invariant is broken: malformed input
//! must come back as a typed error, never as a panic or an allocation.

use crate::credit::{Credits, MAX_WINDOW, MIN_WINDOW};
use crate::frame::{FrameKind, Header, HEADER_LEN};

/// Decode `data` as a receiver reads a stream: header, payload, header, …
/// until the input ends or a header is refused. The first byte picks the
/// payload limit. A decoded header re-encodes to the same bytes and
/// respects the limit; nothing is allocated from a length the input claims.
pub fn frame_stream(data: &[u8]) {
    let Some((&pick, mut rest)) = data.split_first() else { return };
    let max_payload = [0, 1, 16, 4096, 1 << 20, u64::from(u32::MAX)][usize::from(pick) % 6];
    while rest.len() >= HEADER_LEN {
        let h = match Header::decode(rest, max_payload) {
            Ok(h) => h,
            Err(e) => {
                // Every refusal says why in words.
                assert!(!e.to_string().is_empty());
                return;
            }
        };
        assert!(h.len <= max_payload, "{h:?} passed a limit of {max_payload}");
        assert_eq!(h.encode()[..], rest[..HEADER_LEN], "decode/encode round trip");
        let Some(after) = usize::try_from(h.len).ok().and_then(|n| rest.get(HEADER_LEN + n..)) else {
            return; // Truncated payload: the reader waits for more, or reports truncation.
        };
        rest = after;
    }
    assert!(Header::decode(rest, max_payload).is_err(), "a short header must not decode");
}

/// Drive one side's credit machine with `data`: the first two bytes pick
/// the windows (and, by their high bits, whether each side weighs its
/// credits by 1 KiB), then each byte is an event — a frame from a peer that may
/// lie about sequence numbers and credits, the application releasing a
/// message, a send, or a credit frame. The machine must refuse every lie
/// with a typed error (after which the connection is closed: the run
/// stops), and its counters must stay within the windows.
pub fn credit_peer(data: &[u8]) {
    let [a, b, rest @ ..] = data else { return };
    let span = MAX_WINDOW.min(64) - MIN_WINDOW + 1;
    let local = MIN_WINDOW + u32::from(*a) % span;
    let peer = MIN_WINDOW + u32::from(*b) % span;
    let unit_of = |byte: u8| if byte & 0x80 != 0 { 1024 } else { 0 };
    let mut c = Credits::weighted((local, unit_of(*a)), (peer, unit_of(*b))).expect("windows within range");
    // The credits of each frame the application holds, oldest first.
    let mut held: Vec<u32> = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        let op = rest[i];
        i += 1;
        match op % 4 {
            0 => {
                // A frame from the peer: kind, credits and a sequence number
                // that is right, or off by what the input says.
                let arg = rest.get(i..i + 3).unwrap_or(&[0, 0, 0]);
                i += 3;
                let kind = [FrameKind::Data, FrameKind::Credit, FrameKind::Control, FrameKind::Rendezvous]
                    [usize::from(arg[0] % 4)];
                let credits = u16::from(arg[1] % 8);
                let seq = c.next_rx_seq().wrapping_add(u32::from(arg[2] / 200));
                // A length of up to 31.5 KiB: up to 32 credits on a
                // weighing side, more than a small window holds.
                let len = u64::from(arg[0] / 4) * 512;
                let h = Header::new(kind, credits, seq, len);
                let before = (c.outstanding(), c.held(), c.owed());
                match c.on_receive(&h) {
                    Ok(()) => {
                        assert!(u32::from(credits) <= before.0, "returned more credits than outstanding");
                        if kind.holds_buffer() {
                            held.push(c.cost_of(len));
                        }
                    }
                    Err(e) => {
                        assert!(!e.to_string().is_empty());
                        return;
                    }
                }
            }
            1 => {
                if held.is_empty() {
                    assert!(c.release().is_err(), "release with nothing held");
                } else {
                    let cost = held.remove(0);
                    c.release_many(cost).expect("releasing a held message");
                }
            }
            2 => {
                let len = u64::from(rest.get(i).copied().unwrap_or(0)) * 256;
                i += 1;
                if let Ok(r) = c.reserve_for(len) {
                    let _ = c.commit(r);
                }
            }
            _ => {
                let _ = c.poll_credit_frame();
            }
        }
        assert_eq!(c.held(), held.iter().sum::<u32>());
        assert!(c.outstanding() <= c.peer_window());
        assert!(c.held() + c.owed() <= c.window());
    }
}

#[cfg(test)]
mod tests;
