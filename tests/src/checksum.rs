//! Self-checking messages: sequence number, length and checksum in front
//! of a payload derived from the sequence number.

/// Header bytes: seq (8), len (4), checksum (8).
pub const HEADER: usize = 20;

/// FNV-1a over `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The size of message `seq` in a mixed-size stream: mostly small, some
/// medium, a few large, all at least [`HEADER`].
pub fn size_for(seq: u64, max: usize) -> usize {
    let r = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    let size = match r % 100 {
        0 => 16 * 1024 + (r as usize % (48 * 1024)),
        1..=9 => 512 + (r as usize % 3584),
        _ => r as usize % 256,
    };
    size.clamp(HEADER, max)
}

/// Fill `out` with message `seq`.
pub fn write(seq: u64, out: &mut [u8]) {
    let (head, body) = out.split_at_mut(HEADER);
    let mut x = seq.wrapping_add(0x1234_5678);
    for b in body.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    head[..8].copy_from_slice(&seq.to_le_bytes());
    head[8..12].copy_from_slice(&(body.len() as u32).to_le_bytes());
    head[12..20].copy_from_slice(&fnv1a(body).to_le_bytes());
}

/// Check a message; return its sequence number.
pub fn verify(msg: &[u8]) -> Result<u64, String> {
    if msg.len() < HEADER {
        return Err(format!("message of {} bytes is shorter than its header", msg.len()));
    }
    let (head, body) = msg.split_at(HEADER);
    let seq = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    let sum = u64::from_le_bytes(head[12..20].try_into().expect("8 bytes"));
    if len != body.len() {
        return Err(format!("seq {seq}: length {} != {len}", body.len()));
    }
    if fnv1a(body) != sum {
        return Err(format!("seq {seq}: checksum mismatch"));
    }
    Ok(seq)
}
