//! Random alloc/write/drop sequences checked against a model.

use std::sync::atomic::Ordering;

use proptest::prelude::*;

use crate::{Buf, Pool, PoolConfig, PoolError, Wait};

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Drop(usize),
    Write(usize, u8),
    SetLen(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..=5200).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Drop),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Op::Write(i, b)),
        1 => (any::<usize>(), 0usize..=6000).prop_map(|(i, l)| Op::SetLen(i, l)),
    ]
}

fn config() -> PoolConfig {
    // 100 -> 64 per region, 1000 -> 8 per region, 5000 -> 1 per region;
    // every region is 8 KiB and the cap holds 8 of them.
    PoolConfig::default()
        .with_classes([100, 1000, 5000])
        .with_region_size(8192)
        .with_max_bytes(64 << 10)
        .with_prefault(false)
}

/// A live buffer and the byte its whole capacity is filled with.
struct Live {
    buf: Buf,
    fill: u8,
}

fn fill(live: &mut Live, byte: u8) {
    live.fill = byte;
    live.buf.spare_capacity().fill(byte);
}

fn check(pool: &Pool, live: &mut [Live]) -> Result<(), TestCaseError> {
    let cap = pool.config().max_bytes;
    let s = pool.stats();
    prop_assert!(s.bytes <= cap, "cap exceeded: {s:?}");
    prop_assert_eq!(s.bytes, pool.inner.budget_reserved());
    prop_assert_eq!(s.buffers_in_use, live.len());
    prop_assert_eq!(s.buffers_free + s.buffers_in_use, s.buffers_total);

    // No two live buffers overlap.
    let mut ranges: Vec<(u64, u64)> =
        live.iter().map(|l| (l.buf.addr(), l.buf.addr() + l.buf.capacity() as u64)).collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        prop_assert!(w[0].1 <= w[1].0, "overlap: {:?}", w);
    }
    // Writes to one buffer never show up in another.
    for l in live.iter_mut() {
        let want = l.fill;
        prop_assert!(l.buf.spare_capacity().iter().all(|&b| b == want), "buffer contents clobbered");
        prop_assert!(l.buf.len() <= l.buf.capacity());
    }
    Ok(())
}

proptest! {
    #[test]
    fn model(ops in prop::collection::vec(op(), 1..150)) {
        let pool = Pool::unregistered(config()).unwrap();
        let mut live: Vec<Live> = Vec::new();
        let mut tag = 0u8;
        for op in ops {
            match op {
                Op::Alloc(size) => match pool.alloc(size, Wait::No) {
                    Ok(buf) => {
                        prop_assert_eq!(buf.len(), size);
                        prop_assert_eq!(Some(buf.capacity()), pool.class_for(size));
                        tag = tag.wrapping_add(1);
                        let mut l = Live { buf, fill: 0 };
                        fill(&mut l, tag);
                        live.push(l);
                    }
                    Err(PoolError::TooLarge { requested, max }) => {
                        prop_assert_eq!((requested, max), (size, 5000));
                        prop_assert!(size > 5000);
                    }
                    Err(PoolError::Exhausted { cap }) => {
                        // Only when the class has nothing free and one more
                        // region would pass the cap.
                        prop_assert_eq!(cap, 64 << 10);
                        let idx = pool.inner.classes.iter().position(|c| c.layout.size >= size).unwrap();
                        let class = &pool.inner.classes[idx];
                        prop_assert_eq!(class.buffers_free(), 0);
                        prop_assert!(pool.stats().bytes + class.layout.region_bytes > cap);
                    }
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                },
                Op::Drop(i) if !live.is_empty() => {
                    let i = i % live.len();
                    live.swap_remove(i);
                }
                Op::Write(i, byte) if !live.is_empty() => {
                    let i = i % live.len();
                    fill(&mut live[i], byte);
                }
                Op::SetLen(i, len) if !live.is_empty() => {
                    let i = i % live.len();
                    let b = &mut live[i].buf;
                    let (before, capacity) = (b.len(), b.capacity());
                    match b.try_set_len(len) {
                        Ok(()) => prop_assert!(len <= capacity && b.len() == len),
                        Err(PoolError::LenOverCapacity { .. }) => {
                            prop_assert!(len > capacity && b.len() == before)
                        }
                        Err(e) => prop_assert!(false, "unexpected error {e}"),
                    }
                }
                _ => {}
            }
            check(&pool, &mut live)?;
        }
        drop(live);
        let s = pool.stats();
        prop_assert_eq!(s.buffers_in_use, 0);
        prop_assert_eq!(s.buffers_free, s.buffers_total);
    }
}

impl crate::pool::PoolInner {
    fn budget_reserved(&self) -> usize {
        self.budget.reserved.load(Ordering::Acquire)
    }
}
