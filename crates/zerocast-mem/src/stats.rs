//! [`PoolStats`]: a snapshot of what the pool holds.

/// A snapshot of a pool's counters, summed over all classes.
///
/// Each class is read once, and its free count is derived from that one
/// reading of its in-use count, so `buffers_free + buffers_in_use ==
/// buffers_total` holds in every snapshot unless a region is added
/// concurrently. While buffers move, the snapshot is a moment's picture.
/// After every [`Buf`](crate::Buf) has dropped, `buffers_free ==
/// buffers_total` and `buffers_in_use == 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Regions mapped and registered.
    pub regions: usize,
    /// Bytes of all regions; never more than `PoolConfig::max_bytes`.
    pub bytes: usize,
    /// Buffers cut out of all regions.
    pub buffers_total: usize,
    /// Buffers on the free lists.
    pub buffers_free: usize,
    /// Buffers held by live [`Buf`](crate::Buf)s.
    pub buffers_in_use: usize,
}
