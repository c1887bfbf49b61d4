//! [`PoolStats`]: a snapshot of what the pool holds.

/// A snapshot of a pool's counters, summed over all classes.
///
/// Each counter is an atomic read, so the snapshot is exact whenever no
/// allocation or release runs concurrently; while they do, `buffers_free +
/// buffers_in_use` may briefly differ from `buffers_total` by the buffers in
/// flight. After every [`Buf`](crate::Buf) has dropped, `buffers_free ==
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
