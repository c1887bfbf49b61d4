use std::thread;

use super::Chunk;
use crate::{Pool, PoolConfig, Wait};

fn pool() -> Pool {
    Pool::unregistered(
        PoolConfig::default().with_classes([64, 4096]).with_region_size(8192).with_max_bytes(64 << 10),
    )
    .unwrap()
}

fn in_use(p: &Pool) -> usize {
    p.stats().buffers_in_use
}

#[test]
fn parts_are_the_bytes_where_they_lie() {
    let p = pool();
    let whole = p.alloc(4000, Wait::No).unwrap();
    let (addr, keys, region) = (whole.addr(), whole.keys(), whole.region_id());
    let mut c = Chunk::new(whole);
    assert_eq!((c.capacity(), c.lent()), (4096, 0));
    c.bytes_mut(0..11).copy_from_slice(b"headerhello");
    let mut part = c.lend(6..11);
    assert_eq!(c.lent(), 11);
    assert_eq!(&*part, b"hello");
    assert_eq!((part.len(), part.capacity()), (5, 5));
    assert_eq!(part.addr(), addr + 6, "lent where it lies, not copied");
    assert_eq!((part.keys(), part.region_id()), (keys, region), "the whole buffer's registration");
    part[0] = b'j';
    part.spare_capacity().copy_from_slice(b"jelly");
    part.set_len(3);
    assert_eq!(&*part, b"jel");
    assert!(part.try_set_len(6).is_err(), "a part cannot grow into its neighbour");
    let dbg = format!("{part:?}");
    assert!(dbg.contains("capacity: 5"), "{dbg}");
}

#[test]
fn the_whole_buffer_goes_back_with_the_last_reference() {
    let p = pool();
    let mut c = Chunk::new(p.alloc(4096, Wait::No).unwrap());
    let a = c.lend(0..10);
    let b = c.lend(20..30);
    assert_eq!(in_use(&p), 1, "one pool buffer, however many parts");
    drop(c);
    assert_eq!(in_use(&p), 1, "parts keep it");
    drop(a);
    assert_eq!(in_use(&p), 1);
    drop(b);
    assert_eq!(in_use(&p), 0, "the last part gave it back");

    let mut c = Chunk::new(p.alloc(4096, Wait::No).unwrap());
    drop(c.lend(0..1));
    drop(c);
    assert_eq!(in_use(&p), 0, "the chunk gave it back after its parts");
}

#[test]
fn a_chunk_is_reused_only_once_its_parts_are_gone() {
    let p = pool();
    let mut c = Chunk::new(p.alloc(4096, Wait::No).unwrap());
    assert!(!c.in_use());
    let a = c.lend(0..100);
    let empty = c.lend(100..100);
    assert!(c.in_use());
    assert!(!c.reuse(), "a part is alive");
    assert_eq!(c.lent(), 100, "a refused reuse changes nothing");
    drop(a);
    assert!(c.in_use(), "an empty part counts too");
    drop(empty);
    assert!(c.reuse());
    assert_eq!(c.lent(), 0);
    c.bytes_mut(0..4).copy_from_slice(b"next");
    assert_eq!(&*c.lend(0..4), b"next");
}

#[test]
fn parts_dropped_on_other_threads_free_the_chunk_for_reuse() {
    let p = pool();
    let mut c = Chunk::new(p.alloc(4096, Wait::No).unwrap());
    for round in 0..50u8 {
        assert!(c.reuse(), "round {round}");
        c.bytes_mut(0..64).fill(round);
        let parts: Vec<_> = (0..8).map(|i| c.lend(i * 8..i * 8 + 8)).collect();
        thread::spawn(move || {
            for part in parts {
                assert!(part.iter().all(|&b| b == round));
            }
        })
        .join()
        .unwrap();
    }
    drop(c);
    assert_eq!(in_use(&p), 0);
}

#[test]
fn the_reserve_tops_up_past_its_size() {
    let p = pool();
    let mut c = Chunk::new(p.alloc(64, Wait::No).unwrap());
    let kept = c.lend(0..0);
    for _ in 0..super::RESERVE + 10 {
        drop(c.lend(0..0));
    }
    assert!(c.in_use(), "the part kept is counted across the top-up");
    drop(kept);
    assert!(!c.in_use());
    drop(c);
    assert_eq!(in_use(&p), 0);
}

#[test]
#[should_panic(expected = "lent up to 10")]
fn bytes_before_what_was_lent_are_not_shown() {
    let p = pool();
    let mut c = Chunk::new(p.alloc(64, Wait::No).unwrap());
    let _part = c.lend(0..10);
    let _ = c.bytes(9..12);
}

#[test]
#[should_panic(expected = "bytes 60..65 of 64")]
fn bytes_past_the_capacity_are_not_shown() {
    let p = pool();
    let mut c = Chunk::new(p.alloc(64, Wait::No).unwrap());
    let _ = c.bytes_mut(60..65);
}

#[test]
fn a_part_outlives_its_pool_handle() {
    let p = pool();
    let mut c = Chunk::new(p.alloc(64, Wait::No).unwrap());
    c.bytes_mut(0..3).copy_from_slice(b"abc");
    let part = c.lend(0..3);
    drop(c);
    drop(p);
    let part = thread::spawn(move || part).join().unwrap();
    assert_eq!(&*part, b"abc");
}
