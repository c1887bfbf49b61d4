//! [`Buf`] is the send buffer of every zerocast transport.

use crate::Buf;

impl zerocast_core::TxBuffer for Buf {
    fn capacity(&self) -> usize {
        Buf::capacity(self)
    }
    fn set_len(&mut self, len: usize) {
        Buf::set_len(self, len);
    }
    fn spare_capacity(&mut self) -> &mut [u8] {
        Buf::spare_capacity(self)
    }
}
