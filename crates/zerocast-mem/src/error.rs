//! Errors of the pool.

use std::time::Duration;

use crate::registrar::RegisterError;

/// Why a pool could not be built or a buffer could not be handed out.
///
/// Every message says which knob to turn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// No size class is big enough for the request.
    #[error(
        "requested {requested} bytes but the largest buffer class holds {max} bytes; \
         add a larger size to PoolConfig::classes"
    )]
    TooLarge {
        /// Bytes asked for.
        requested: usize,
        /// The largest class size ([`Pool::max_buf_size`](crate::Pool::max_buf_size)).
        max: usize,
    },
    /// The pool is at its cap and the caller asked not to wait ([`Wait::No`](crate::Wait::No)).
    #[error(
        "pool at its cap of {}; raise PoolConfig::max_bytes or release buffers sooner",
        fmt_bytes(*.cap)
    )]
    Exhausted {
        /// The cap, `PoolConfig::max_bytes`.
        cap: usize,
    },
    /// The pool stayed at its cap for as long as the caller was willing to wait.
    #[error(
        "no buffer was released within {waited:?} and the pool is at its cap of {}; \
         raise PoolConfig::max_bytes, release buffers sooner, or wait longer",
        fmt_bytes(*.cap)
    )]
    Timeout {
        /// How long the caller waited.
        waited: Duration,
        /// The cap, `PoolConfig::max_bytes`.
        cap: usize,
    },
    /// The registrar refused a new region. The pool is unchanged and still usable.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// The [`PoolConfig`](crate::PoolConfig) is invalid; the message says what to change.
    #[error("invalid PoolConfig: {0}")]
    Config(String),
    /// The operating system refused to map a new region.
    #[error(
        "the OS refused to map a {}-byte pool region ({}); free memory, or lower \
         PoolConfig::region_size or PoolConfig::max_bytes",
        .bytes,
        fmt_bytes(*.bytes)
    )]
    Alloc {
        /// Size of the region that could not be mapped.
        bytes: usize,
    },
    /// A length larger than the buffer's capacity was asked for.
    #[error(
        "length {len} exceeds the buffer's capacity of {capacity} bytes; \
         allocate a buffer of at least {len} bytes"
    )]
    LenOverCapacity {
        /// The length asked for.
        len: usize,
        /// The buffer's capacity.
        capacity: usize,
    },
}

/// `bytes` in the largest binary unit that keeps it readable.
pub(crate) fn fmt_bytes(bytes: usize) -> String {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;
    match bytes {
        b if b >= GIB && b % GIB == 0 => format!("{} GiB", b / GIB),
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= MIB => format!("{:.1} MiB", b as f64 / MIB as f64),
        b if b >= KIB && b % KIB == 0 => format!("{} KiB", b / KIB),
        b => format!("{b} bytes"),
    }
}

impl zerocast_core::Classify for PoolError {
    /// A pool that cannot give a buffer is a local resource problem, with
    /// two exceptions: a request the pool could never satisfy (larger than
    /// its largest class, or than the buffer) is the caller's input.
    fn kind(&self) -> zerocast_core::ErrorKind {
        match self {
            PoolError::TooLarge { .. } | PoolError::LenOverCapacity { .. } => {
                zerocast_core::ErrorKind::InvalidInput
            }
            _ => zerocast_core::ErrorKind::LocalResource,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;
    use std::io;

    #[test]
    fn fmt_bytes_units() {
        assert_eq!(fmt_bytes(256 << 20), "256 MiB");
        assert_eq!(fmt_bytes(2 << 30), "2 GiB");
        assert_eq!(fmt_bytes(3 << 19), "1.5 MiB");
        assert_eq!(fmt_bytes(8192), "8 KiB");
        assert_eq!(fmt_bytes(1000), "1000 bytes");
    }

    #[test]
    fn messages_name_the_knob() {
        let e = PoolError::Exhausted { cap: 256 << 20 };
        assert_eq!(
            e.to_string(),
            "pool at its cap of 256 MiB; raise PoolConfig::max_bytes or release buffers sooner"
        );
        let e = PoolError::TooLarge { requested: 70_000, max: 65_600 };
        assert!(e.to_string().contains("PoolConfig::classes"), "{e}");
        let e = PoolError::Timeout { waited: Duration::from_millis(5), cap: 1 << 20 };
        assert!(e.to_string().contains("PoolConfig::max_bytes"), "{e}");
        let e = PoolError::LenOverCapacity { len: 10, capacity: 8 };
        assert!(e.to_string().contains("capacity of 8"), "{e}");
        let e = PoolError::Alloc { bytes: 4 << 20 };
        assert!(e.to_string().contains("region_size"), "{e}");
    }

    #[test]
    fn register_error_is_transparent() {
        let io = io::Error::from_raw_os_error(libc::ENOMEM);
        let e = PoolError::from(RegisterError::from_os("fake", 4096, io));
        assert!(e.to_string().contains("ulimit -l"), "{e}");
        // The io::Error stays reachable as the source.
        assert!(e.source().is_some());
    }
}
