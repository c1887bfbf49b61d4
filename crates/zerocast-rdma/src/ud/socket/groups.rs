//! A [`UdSocket`]'s multicast groups: join, leave, and the send-only
//! routes to groups it does not receive.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use super::super::io::lock;
use super::super::UdError;
use super::{dest_key, Dest, Group, UdSocket};
use crate::verbs::AddressHandle;

impl UdSocket {
    /// Join `group` (its port is ignored: RDMA multicast has none) and
    /// receive what is sent to it. Joining a group this socket is in
    /// already does nothing; joining one that failed joins it again.
    ///
    /// # Errors
    ///
    /// [`UdError::NotMulticast`], [`UdError::TooManyGroups`] at the
    /// device's `max_mcast_grp`, [`UdError::Join`] when rdma_cm or the
    /// attach refuses.
    pub fn join(&self, group: &SocketAddr) -> Result<(), UdError> {
        let deadline = Instant::now() + self.cfg.resolve_timeout;
        crate::cm::wait_until(self.membership(group, true), deadline).unwrap_or_else(|| {
            Err(UdError::Join { group: group.ip(), reason: "no answer within the resolve timeout".into() })
        })
    }

    /// [`UdSocket::join`] for a task: the same rdma_cm exchange, awaited
    /// rather than waited for. rdma_cm bounds the address's resolution by
    /// [`super::super::UdConfig::resolve_timeout`]; bound the whole with
    /// a timer of the caller's. Dropping it abandons the join (a join
    /// that completed meanwhile is left again).
    ///
    /// # Errors
    ///
    /// As [`UdSocket::join`].
    pub async fn join_async(&self, group: &SocketAddr) -> Result<(), UdError> {
        self.membership(group, true).await
    }

    /// Under the groups' lock: whether `ip` is a member already (attached
    /// now if `attach` asks), else make room for it: a failed membership
    /// is dropped, and a join past the device's limit refused.
    fn member_already(&self, ip: IpAddr, attach: bool) -> Result<bool, UdError> {
        let mut groups = lock(&self.groups);
        if let Some(g) = groups.get_mut(&ip) {
            if !g.failed.load(Relaxed) {
                if attach && !g.attached {
                    self.io
                        .qp
                        .attach_mcast(&g.mgid, g.mlid)
                        .map_err(|e| UdError::Join { group: ip, reason: format!("ibv_attach_mcast: {e}") })?;
                    g.attached = true;
                }
                return Ok(true);
            }
            let old = groups.remove(&ip).expect("present");
            self.drop_group(old);
        }
        let attached = groups.values().filter(|g| g.attached).count();
        if attach && attached >= self.max_groups as usize {
            return Err(UdError::TooManyGroups { joined: attached, max: self.max_groups });
        }
        Ok(false)
    }

    /// Join (`attach`: receive too) or make a send-only route to `group`.
    /// No lock is held while rdma_cm answers: a join of the same group
    /// that finished meanwhile is kept, and ours left.
    pub(super) async fn membership(&self, group: &SocketAddr, attach: bool) -> Result<(), UdError> {
        let ip = group.ip();
        if !ip.is_multicast() {
            return Err(UdError::NotMulticast(ip));
        }
        if self.member_already(ip, attach)? {
            return Ok(());
        }
        let addr = SocketAddr::new(ip, group.port());
        let (id, p, failed) = self.cm.join(self.local, addr, self.cfg.resolve_timeout).await?;
        let left = |e: UdError| {
            self.cm.leave(&id, addr);
            Err(e)
        };
        let mut groups = lock(&self.groups);
        if groups.get(&ip).is_some_and(|g| !g.failed.load(Relaxed)) {
            drop(groups);
            self.cm.leave(&id, addr);
            return self.member_already(ip, attach).map(drop);
        }
        if let Some(old) = groups.remove(&ip) {
            self.drop_group(old);
        }
        let attached = groups.values().filter(|g| g.attached).count();
        if attach && attached >= self.max_groups as usize {
            return left(UdError::TooManyGroups { joined: attached, max: self.max_groups });
        }
        let mgid = p.ah_attr.grh.dgid;
        let mlid = p.ah_attr.dlid;
        let ah = match AddressHandle::new(&self.io.pd, &p.ah_attr) {
            Ok(ah) => ah,
            Err(e) => return left(UdError::Join { group: ip, reason: format!("ibv_create_ah: {e}") }),
        };
        if attach {
            if let Err(e) = self.io.qp.attach_mcast(&mgid, mlid) {
                return left(UdError::Join { group: ip, reason: format!("ibv_attach_mcast: {e}") });
            }
        }
        lock(&self.dests).insert(
            dest_key(group),
            Dest { ah: Arc::new(ah), qpn: p.qpn, qkey: p.qkey, seq: 0, learned: false },
        );
        tracing::debug!(local = %self.local, group = %ip, attach, qkey = p.qkey, "ud multicast joined");
        groups.insert(ip, Group { id, addr, mgid, mlid, attached: attach, failed });
        Ok(())
    }

    /// Detach from and leave a group's membership.
    pub(super) fn drop_group(&self, g: Group) {
        if g.attached {
            if let Err(e) = self.io.qp.detach_mcast(&g.mgid, g.mlid) {
                tracing::debug!(group = %g.addr, error = %e, "ibv_detach_mcast failed");
            }
        }
        self.cm.leave(&g.id, g.addr);
        lock(&self.dests).remove(&dest_key(&g.addr));
    }

    /// Leave `group`: detach the QP and leave through rdma_cm. Datagrams
    /// to it stop arriving (some already received may still be returned).
    pub fn leave(&self, group: &SocketAddr) -> Result<(), UdError> {
        let ip = group.ip();
        if !ip.is_multicast() {
            return Err(UdError::NotMulticast(ip));
        }
        let mut groups = lock(&self.groups);
        match groups.get(&ip) {
            Some(g) if g.attached => {}
            _ => return Err(UdError::NotMember { group: ip }),
        }
        let g = groups.remove(&ip).expect("present");
        self.drop_group(g);
        tracing::debug!(local = %self.local, group = %ip, "ud multicast left");
        Ok(())
    }

    /// Groups whose membership failed (MULTICAST_ERROR) since they were
    /// joined; [`join`](Self::join) each again to recover.
    pub fn failed_groups(&self) -> Vec<IpAddr> {
        lock(&self.groups).iter().filter(|(_, g)| g.failed.load(Relaxed)).map(|(ip, _)| *ip).collect()
    }

    /// The groups this socket receives.
    pub fn groups(&self) -> Vec<IpAddr> {
        lock(&self.groups).iter().filter(|(_, g)| g.attached).map(|(ip, _)| *ip).collect()
    }
}
