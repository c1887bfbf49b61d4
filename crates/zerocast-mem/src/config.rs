//! Pool configuration and the per-class layout derived from it.

use crate::error::{fmt_bytes, PoolError};

/// Granularity of region sizes. Regions are `mmap`ed, so they start on a page
/// boundary; their length is rounded up to a multiple of this.
pub(crate) const PAGE: usize = 4096;

/// Every buffer starts on a multiple of this many bytes from its region's
/// (page-aligned) base: a class's slot stride is its size rounded up to it.
pub(crate) const SLOT_ALIGN: usize = 64;

/// How a [`Pool`](crate::Pool) is shaped and how big it may grow.
///
/// ```
/// use zerocast_mem::PoolConfig;
/// let cfg = PoolConfig::default()
///     .with_classes([256, 4096])
///     .with_max_bytes(16 << 20);
/// cfg.validate().unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Buffer sizes of the size classes, strictly ascending and non-zero,
    /// e.g. `[512, 8192, 65_536 + 64]`. A request is served by the smallest
    /// class at least as big as it.
    ///
    /// Buffers are laid out at a stride of the class size rounded up to 64
    /// bytes, so every buffer starts 64-byte aligned; a class size that is a
    /// multiple of 64 wastes nothing.
    pub classes: Vec<usize>,
    /// Bytes per region (default 4 MiB). A region is one `mmap`, registered
    /// once, cut into buffers of one class.
    ///
    /// A class holds `region_size / stride` buffers per region, and its
    /// regions are trimmed to exactly that many buffers, rounded up to whole
    /// 4 KiB pages. A class whose buffers are bigger than `region_size` gets
    /// regions of exactly one buffer each, again rounded up to whole pages.
    pub region_size: usize,
    /// Cap on the bytes of all regions of all classes (default 256 MiB). The
    /// pool never maps past it; [`Pool::alloc`](crate::Pool::alloc) waits or
    /// fails instead. Every class must fit at least one region under it.
    ///
    /// Regions are never given back while the pool lives, and a class's
    /// regions serve only that class. Besides the cap, each class keeps a
    /// free list sized for every buffer it could ever hold, allocated up front
    /// on the heap: 16 bytes per `max_bytes / stride` buffers.
    pub max_bytes: usize,
    /// Touch every page of a region when it is created (default `true`), so
    /// the first use of a buffer takes no page fault.
    pub prefault: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            classes: vec![512, 8192, 65_536 + 64],
            region_size: 4 << 20,
            max_bytes: 256 << 20,
            prefault: true,
        }
    }
}

impl PoolConfig {
    /// Replace the size classes.
    #[must_use]
    pub fn with_classes(mut self, classes: impl Into<Vec<usize>>) -> Self {
        self.classes = classes.into();
        self
    }

    /// Replace the region size.
    #[must_use]
    pub fn with_region_size(mut self, region_size: usize) -> Self {
        self.region_size = region_size;
        self
    }

    /// Replace the cap on mapped bytes.
    #[must_use]
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Turn prefaulting on or off.
    #[must_use]
    pub fn with_prefault(mut self, prefault: bool) -> Self {
        self.prefault = prefault;
        self
    }

    /// Check the configuration; the error says what to change.
    pub fn validate(&self) -> Result<(), PoolError> {
        self.layouts().map(|_| ())
    }

    /// Validate and derive the layout of every class.
    pub(crate) fn layouts(&self) -> Result<Vec<ClassLayout>, PoolError> {
        let bad = |msg: String| Err(PoolError::Config(msg));
        if self.classes.is_empty() {
            return bad("`classes` is empty; give at least one buffer size".into());
        }
        if self.classes.len() > u32::MAX as usize {
            return bad("too many classes".into());
        }
        if self.region_size < PAGE {
            return bad(format!("`region_size` {} is below one page ({PAGE} bytes)", self.region_size));
        }
        let mut prev = 0;
        let mut out = Vec::with_capacity(self.classes.len());
        for &size in &self.classes {
            if size == 0 {
                return bad("`classes` contains 0; every class size must be at least 1 byte".into());
            }
            if size <= prev {
                return bad(format!("`classes` must be strictly ascending, but {size} follows {prev}"));
            }
            prev = size;
            let layout = ClassLayout::new(size, self.region_size, self.max_bytes)
                .ok_or_else(|| PoolError::Config(format!("class {size} is too large to lay out")))?;
            if layout.max_regions == 0 {
                return bad(format!(
                    "`max_bytes` {} is smaller than one region of class {size} ({}); raise max_bytes, \
                     lower region_size, or drop the class",
                    fmt_bytes(self.max_bytes),
                    fmt_bytes(layout.region_bytes)
                ));
            }
            if layout.max_regions > u32::MAX as usize
                || layout.slots_per_region > u32::MAX as usize
                || layout.max_buffers() >= u32::MAX as usize
            {
                return bad(format!(
                    "class {size} could hold {} regions of {} buffers under max_bytes {}; \
                     raise region_size or the class size, or lower max_bytes",
                    layout.max_regions,
                    layout.slots_per_region,
                    fmt_bytes(self.max_bytes)
                ));
            }
            out.push(layout);
        }
        Ok(out)
    }
}

/// How one class is cut out of regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClassLayout {
    /// Capacity of each buffer, as configured.
    pub(crate) size: usize,
    /// Distance between consecutive buffers: `size` rounded up to [`SLOT_ALIGN`].
    pub(crate) stride: usize,
    /// Buffers per region.
    pub(crate) slots_per_region: usize,
    /// Bytes mapped per region: a multiple of [`PAGE`], at least `slots_per_region * stride`.
    pub(crate) region_bytes: usize,
    /// Regions this class could have if it alone used the whole cap.
    pub(crate) max_regions: usize,
}

impl ClassLayout {
    /// `None` on arithmetic overflow.
    pub(crate) fn new(size: usize, region_size: usize, max_bytes: usize) -> Option<Self> {
        let stride = round_up(size, SLOT_ALIGN)?;
        let slots_per_region = (region_size / stride).max(1);
        let region_bytes = round_up(slots_per_region.checked_mul(stride)?, PAGE)?;
        if region_bytes > isize::MAX as usize {
            return None;
        }
        Some(Self { size, stride, slots_per_region, region_bytes, max_regions: max_bytes / region_bytes })
    }

    /// Buffers this class could hold if it alone used the whole cap.
    pub(crate) fn max_buffers(&self) -> usize {
        self.max_regions.saturating_mul(self.slots_per_region)
    }
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    Some(n.checked_add(to - 1)? / to * to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(cfg: PoolConfig) -> String {
        match cfg.validate() {
            Err(PoolError::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn default_is_valid() {
        let cfg = PoolConfig::default();
        let l = cfg.layouts().unwrap();
        assert_eq!(l.len(), 3);
        // 512-byte class: 8192 buffers in a 4 MiB region, 64 regions under 256 MiB.
        assert_eq!(
            l[0],
            ClassLayout {
                size: 512,
                stride: 512,
                slots_per_region: 8192,
                region_bytes: 4 << 20,
                max_regions: 64
            }
        );
        // 65_600-byte class: 63 buffers, trimmed to whole pages.
        assert_eq!(l[2].slots_per_region, 63);
        assert_eq!(l[2].region_bytes, (63 * 65_600usize).div_ceil(PAGE) * PAGE);
        assert!(l[2].region_bytes <= 4 << 20);
    }

    #[test]
    fn odd_sizes_get_aligned_strides() {
        let l = ClassLayout::new(1500, 4 << 20, 64 << 20).unwrap();
        assert_eq!(l.stride, 1536);
        assert_eq!(l.slots_per_region, (4 << 20) / 1536);
        assert_eq!(l.region_bytes % PAGE, 0);
    }

    #[test]
    fn class_bigger_than_region_gets_one_buffer_regions() {
        let l = ClassLayout::new(10 << 20, 4 << 20, 64 << 20).unwrap();
        assert_eq!(l.slots_per_region, 1);
        assert_eq!(l.region_bytes, 10 << 20);
        assert_eq!(l.max_regions, 6);
        let l = ClassLayout::new(5000, 4096, 1 << 20).unwrap();
        assert_eq!((l.slots_per_region, l.region_bytes), (1, 8192));
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(err(PoolConfig::default().with_classes(vec![])).contains("empty"));
        assert!(err(PoolConfig::default().with_classes([0, 512])).contains("0"));
        assert!(err(PoolConfig::default().with_classes([512, 512])).contains("ascending"));
        assert!(err(PoolConfig::default().with_classes([1024, 512])).contains("ascending"));
        assert!(err(PoolConfig::default().with_region_size(100)).contains("region_size"));
        let m = err(PoolConfig::default().with_max_bytes(1 << 20));
        assert!(m.contains("raise max_bytes"), "{m}");
        assert!(err(PoolConfig::default().with_classes([usize::MAX])).contains("too large"));
    }

    #[test]
    fn builders_set_fields() {
        let c = PoolConfig::default()
            .with_classes([64])
            .with_region_size(8192)
            .with_max_bytes(1 << 16)
            .with_prefault(false);
        assert_eq!(c.classes, [64]);
        assert_eq!((c.region_size, c.max_bytes, c.prefault), (8192, 1 << 16, false));
        c.validate().unwrap();
    }
}
