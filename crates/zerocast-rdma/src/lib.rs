//! RDMA verbs backend for zerocast.
//!
//! What it does today:
//! - finds and opens a verbs device ([`Device::open`]), by name or as the first
//!   device with an active port, and reports its port state and MTU;
//! - owns the verbs objects with the right drop order: a [`MemoryRegion`] holds
//!   its [`ProtectionDomain`], which holds its [`Context`], so the region is
//!   deregistered before the PD is freed and the PD before the device closes;
//! - registers memory, directly or through [`VerbsRegistrar`], the
//!   [`zerocast_mem::Registrar`] that makes a zerocast pool's regions usable by
//!   the device.
//!
//! What it does not do yet: queue pairs, completion queues, connection setup
//! (`rdma_cm`), reliable, unreliable-datagram or multicast transports. Nothing
//! here posts work requests.
//!
//! Testing: this crate's tests need a verbs device. They are `#[ignore]`d on a
//! plain `cargo test`; `scripts/test` runs them inside a QEMU guest with
//! Soft-RoCE (`rdma_rxe`), see `scripts/softroce-run`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod device;
mod error;
mod mr;

pub use device::{Context, Device, DeviceAttr, PortAttr, PortState, ProtectionDomain};
pub use error::DeviceError;
pub use mr::{MemoryRegion, VerbsRegistrar};
