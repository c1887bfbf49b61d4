//! What the example tests share.

use std::path::PathBuf;

/// An example binary built beside the calling test
/// (`target/<profile>/examples/`): `cargo test` builds the examples its
/// features allow.
pub(crate) fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<the test> -> target/<profile>/examples/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target profile directory");
    let path = dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo test -p zerocast-examples --no-run` (and `--features rdma` for the RDMA ones)",
        path.display()
    );
    path
}
