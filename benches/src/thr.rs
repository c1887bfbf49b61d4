//! The command line of libzmq's `perf/local_thr` and `perf/remote_thr`,
//! shared by the two-process tools that measure the way they do
//! (`zmq_local_thr`/`zmq_remote_thr` and the raw socket's
//! `raw_local_thr`/`raw_remote_thr`).

/// `ENDPOINT SIZE COUNT` from the command line. Exits with status 2 and a
/// message on anything else.
pub fn thr_args(tool: &str, endpoint: &str) -> (String, usize, u64) {
    let args: Vec<String> = std::env::args().collect();
    let [_, at, size, count] = &args[..] else {
        eprintln!("usage: {tool} {endpoint} MESSAGE-SIZE MESSAGE-COUNT");
        std::process::exit(2);
    };
    match (size.parse(), count.parse::<u64>()) {
        (Ok(size), Ok(count)) => (at.clone(), size, count.max(1)),
        _ => {
            eprintln!("{tool}: MESSAGE-SIZE and MESSAGE-COUNT must be numbers");
            std::process::exit(2);
        }
    }
}
