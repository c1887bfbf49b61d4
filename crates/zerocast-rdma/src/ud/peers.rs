//! Per-peer state keyed by socket address, with the most recently used
//! entry kept outside the hash map.
//!
//! A socket's routes and sequence trackers are looked up once per datagram.
//! The map keeps SipHash (the keys of received datagrams come from the
//! network), whose cost per lookup is a few hundred instructions; a stream
//! to or from one peer finds it in the front slot with one comparison.

use std::collections::HashMap;
use std::net::SocketAddr;

/// A map from addresses to `V` whose last-used entry is held apart: every
/// key is either in `front` or in `rest`, never both.
#[derive(Debug)]
pub(super) struct Peers<V> {
    front: Option<(SocketAddr, V)>,
    rest: HashMap<SocketAddr, V>,
}

impl<V> Default for Peers<V> {
    fn default() -> Self {
        Self { front: None, rest: HashMap::new() }
    }
}

impl<V> Peers<V> {
    /// The entry for `key`, which becomes the front one.
    pub(super) fn get_mut(&mut self, key: &SocketAddr) -> Option<&mut V> {
        if self.front.as_ref().is_some_and(|(k, _)| k == key) {
            return self.front.as_mut().map(|(_, v)| v);
        }
        let v = self.rest.remove(key)?;
        if let Some((k, old)) = self.front.replace((*key, v)) {
            self.rest.insert(k, old);
        }
        self.front.as_mut().map(|(_, v)| v)
    }

    pub(super) fn get(&self, key: &SocketAddr) -> Option<&V> {
        match &self.front {
            Some((k, v)) if k == key => Some(v),
            _ => self.rest.get(key),
        }
    }

    /// Insert or replace the entry for `key`.
    pub(super) fn insert(&mut self, key: SocketAddr, v: V) {
        match &mut self.front {
            Some((k, old)) if *k == key => *old = v,
            _ => {
                self.rest.insert(key, v);
            }
        }
    }

    /// The entry for `key`, made with `make` if there is none.
    pub(super) fn get_or_insert_with(&mut self, key: SocketAddr, make: impl FnOnce() -> V) -> &mut V {
        if self.get(&key).is_none() {
            self.rest.insert(key, make());
        }
        self.get_mut(&key).expect("just inserted")
    }

    pub(super) fn remove(&mut self, key: &SocketAddr) -> Option<V> {
        if self.front.as_ref().is_some_and(|(k, _)| k == key) {
            return self.front.take().map(|(_, v)| v);
        }
        self.rest.remove(key)
    }

    pub(super) fn len(&self) -> usize {
        usize::from(self.front.is_some()) + self.rest.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn every_key_lives_in_one_place_whatever_the_order_of_operations() {
        let mut p = Peers::default();
        p.insert(a(1), 10);
        p.insert(a(2), 20);
        assert_eq!(p.get_mut(&a(1)).copied(), Some(10));
        *p.get_mut(&a(2)).unwrap() += 1; // a(1) goes back to the map
        assert_eq!((p.get(&a(1)), p.get(&a(2))), (Some(&10), Some(&21)));
        p.insert(a(2), 5); // replaces the front entry in place
        assert_eq!(p.get(&a(2)), Some(&5));
        assert_eq!(*p.get_or_insert_with(a(3), || 30), 30);
        assert_eq!(*p.get_or_insert_with(a(1), || 99), 10, "an existing entry is kept");
        assert_eq!((p.len(), p.get(&a(1)), p.get(&a(2)), p.get(&a(3))), (3, Some(&10), Some(&5), Some(&30)));
        assert_eq!(p.remove(&a(1)), Some(10)); // the front one
        assert_eq!(p.remove(&a(2)), Some(5)); // one in the map
        assert_eq!(p.remove(&a(2)), None);
        assert_eq!(p.get_mut(&a(9)), None);
        assert_eq!(p.len(), 1);
    }
}
