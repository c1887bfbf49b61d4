//! What the RC guest tests share: the address the guest's rxe device is
//! bound to, and the byte pattern their messages carry.

/// The guest's RDMA address (`ZEROCAST_RDMA_ADDR`, as `scripts/softroce-run`
/// sets it).
pub(super) fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

/// Byte `i` of the message seeded `seed`.
pub(super) fn pattern(i: usize, seed: u32) -> u8 {
    (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed).to_le_bytes()[1]
}
