//! What a process uses, as the scale tests measure it: its threads
//! (`/proc/PID/task`), open descriptors (`/proc/PID/fd`), resident memory (`VmRSS`), CPU time (`utime` and
//! `stime` of `/proc/PID/stat`); and the open-files limit that a test with
//! thousands of sockets raises first.

use std::time::Duration;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// A process whose use is read from `/proc`: this one, or a child.
#[derive(Debug, Clone)]
pub struct Proc {
    dir: String,
}

impl Proc {
    /// This process.
    pub fn me() -> Self {
        Proc { dir: "/proc/self".to_owned() }
    }

    /// The process `pid` (a child this test started).
    pub fn pid(pid: u32) -> Self {
        Proc { dir: format!("/proc/{pid}") }
    }

    fn read(&self, file: &str) -> String {
        let path = format!("{}/{file}", self.dir);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
    }

    /// Its number of threads.
    pub fn threads(&self) -> usize {
        let path = format!("{}/task", self.dir);
        std::fs::read_dir(&path).unwrap_or_else(|e| panic!("reading {path}: {e}")).count()
    }

    /// Its open file descriptors.
    pub fn fds(&self) -> usize {
        let path = format!("{}/fd", self.dir);
        std::fs::read_dir(&path).unwrap_or_else(|e| panic!("reading {path}: {e}")).count()
    }

    /// Its resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = self.read("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {}/status:\n{status}", self.dir))
    }

    /// The CPU time it has used, user and system, all threads (counted in
    /// clock ticks, so to 1/100 s on most kernels).
    pub fn cpu_time(&self) -> Duration {
        let stat = self.read("stat");
        // Fields 14 and 15 (utime, stime); the name in field 2 may hold
        // spaces, so count from the `)` that ends it: next is field 3.
        let after_name = &stat[stat.rfind(')').expect("a ) in stat") + 1..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks = |field: usize| -> u64 {
            fields[field - 3]
                .parse()
                .unwrap_or_else(|e| panic!("field {field} of {}/stat: {e}: {stat}", self.dir))
        };
        let hz = rustix::param::clock_ticks_per_second();
        Duration::from_nanos((ticks(14) + ticks(15)) * 1_000_000_000 / hz)
    }
}

/// Raise this process's soft limit of open files to its hard limit, first
/// raising the hard limit to `need` if it is lower (which takes root, or
/// `CAP_SYS_RESOURCE`). Fails, saying what to do, if the limit stays below
/// `need`. Returns the soft limit now in force.
pub fn raise_open_files(need: u64) -> u64 {
    let old = getrlimit(Resource::Nofile);
    let mut hard = old.maximum.unwrap_or(u64::MAX);
    if hard < need {
        match setrlimit(Resource::Nofile, Rlimit { current: Some(need), maximum: Some(need) }) {
            Ok(()) => hard = need,
            Err(e) => panic!(
                "this test opens sockets for {need} descriptors, but the hard limit of open files \
                 (RLIMIT_NOFILE) is {hard} and raising it failed ({e}): run it as root, or after \
                 `ulimit -Hn {need}` in a shell allowed to"
            ),
        }
    }
    // An unlimited hard limit: ask for what is needed (the kernel caps
    // descriptors at fs.nr_open anyway).
    let (soft, maximum) = if hard == u64::MAX { (need, None) } else { (hard, Some(hard)) };
    setrlimit(Resource::Nofile, Rlimit { current: Some(soft), maximum }).unwrap_or_else(|e| {
        panic!("raising the soft limit of open files from {:?} to {soft}: {e}", old.current)
    });
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    assert!(
        now >= need,
        "the limit of open files is {now} after raising it, below the {need} this test needs"
    );
    now
}
