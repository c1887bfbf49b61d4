//! Errors of device discovery and setup.
//!
//! Registration errors are [`zerocast_mem::RegisterError`], shared with every
//! other registrar, so a pool reports them the same way whatever the backend.

use std::io;

use crate::device::PortState;

/// Why a verbs device could not be found, opened or set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The verbs library found no device at all.
    #[error(
        "no RDMA device found; load rdma_rxe and `rdma link add rxe0 type rxe netdev eth0` \
         (or run the command under scripts/softroce-run)"
    )]
    NoDevice,

    /// Listing devices failed, usually because the kernel has no verbs support.
    #[error(
        "listing RDMA devices failed; load ib_uverbs and a provider (rdma_rxe for Soft-RoCE) \
         and check that /dev/infiniband is readable"
    )]
    List {
        /// The library's errno.
        #[source]
        source: io::Error,
    },

    /// The requested device does not exist.
    #[error(
        "RDMA device `{name}` not found (present: {}); check the name with `ibv_devices` \
         or `rdma link show`",
        fmt_names(.present)
    )]
    NotFound {
        /// The name asked for.
        name: String,
        /// The devices that do exist.
        present: Vec<String>,
    },

    /// Devices exist, but none has a port in the active state.
    #[error(
        "no RDMA device has an active port (present: {}); check `ibv_devinfo` and that the \
         network interface under the device is up",
        fmt_names(.present)
    )]
    NoActivePort {
        /// The devices that exist.
        present: Vec<String>,
    },

    /// The requested device has no port in the active state.
    #[error(
        "RDMA device `{device}` has no active port (port {port} is {state}); bring its network \
         interface up and check `ibv_devinfo -d {device}`"
    )]
    PortNotActive {
        /// Device name.
        device: String,
        /// The device's first port.
        port: u8,
        /// That port's state.
        state: PortState,
    },

    /// `ibv_open_device` failed.
    #[error("opening RDMA device `{device}` failed; check permissions on /dev/infiniband/uverbs*")]
    Open {
        /// Device name.
        device: String,
        /// The library's errno.
        #[source]
        source: io::Error,
    },

    /// A query (`ibv_query_device`, `ibv_query_port`) failed.
    #[error("querying {what} of RDMA device `{device}` failed")]
    Query {
        /// Device name.
        device: String,
        /// What was queried, such as `"port 1"`.
        what: String,
        /// The library's errno.
        #[source]
        source: io::Error,
    },

    /// `ibv_alloc_pd` failed.
    #[error(
        "allocating a protection domain on `{device}` failed; the device may be out of \
         resources (see max_pd in `ibv_devinfo -v`)"
    )]
    AllocPd {
        /// Device name.
        device: String,
        /// The library's errno.
        #[source]
        source: io::Error,
    },
}

fn fmt_names(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// An `io::Error` from a verbs return code: the errno itself when positive,
/// otherwise (`-1` with errno set, as some calls do) the thread's errno.
pub(crate) fn errno_from_rc(rc: i32) -> io::Error {
    if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    }
}

impl zerocast_core::Classify for DeviceError {
    /// A device that cannot be opened or used is a local problem.
    fn kind(&self) -> zerocast_core::ErrorKind {
        zerocast_core::ErrorKind::LocalResource
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_do() {
        assert!(DeviceError::NoDevice.to_string().contains("rdma link add rxe0"));
        let err = DeviceError::NotFound { name: "mlx5_0".into(), present: vec![] };
        assert!(err.to_string().contains("present: none"), "{err}");
        let err = DeviceError::PortNotActive { device: "rxe0".into(), port: 1, state: PortState::Down };
        assert!(err.to_string().contains("port 1 is PORT_DOWN"), "{err}");
    }

    #[test]
    fn positive_rc_is_the_errno() {
        assert_eq!(errno_from_rc(libc::EINVAL).raw_os_error(), Some(libc::EINVAL));
    }
}
