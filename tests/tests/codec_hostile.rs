//! Random bytes fed to the typed decoder: a typed error or a value, never a
//! panic, a hang or a huge allocation.

use proptest::prelude::*;
use zerocast::{Bincode, Codec};
use zerocast_tests::suite::{order, Order};

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Bincode.decode::<Order>(&bytes);
        let _ = Bincode.decode::<Vec<String>>(&bytes);
        let _ = Bincode.decode::<(u64, &str, &[u8])>(&bytes);
    }

    #[test]
    fn corrupted_messages_never_panic(i in 0u64..50, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let o = order(i, (i as usize) * 7);
        let mut buf = vec![0u8; Bincode.encoded_len(&o).expect("len")];
        let n = Bincode.encode(&o, &mut buf).expect("encode");
        prop_assert_eq!(Bincode.decode::<Order>(&buf[..n]).expect("intact decodes"), o);
        for (at, x) in flips {
            let k = at % n;
            buf[k] ^= x | 1;
        }
        let _ = Bincode.decode::<Order>(&buf[..n]);
    }
}
