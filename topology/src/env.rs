//! Every `WM_*` environment variable wholemem reads, declared once.
//!
//! Each variable has a name, a default (or none) and one line of
//! documentation. The README's table is generated from [`ALL`] by hand; keep
//! the two in step. Readers live here too, so a typo in a name cannot
//! silently read nothing.

use std::time::Duration;

/// One environment variable the project reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvVar {
    /// The variable's name.
    pub name: &'static str,
    /// What is used when it is unset, in words.
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
}

impl EnvVar {
    /// The raw value, if the variable is set and not empty.
    pub fn get(&self) -> Option<String> {
        std::env::var(self.name).ok().filter(|v| !v.is_empty())
    }

    /// The value parsed as `T`.
    ///
    /// # Errors
    /// A message naming the variable and the bad value when it is set but
    /// does not parse.
    pub fn parse<T: std::str::FromStr>(&self) -> Result<Option<T>, String> {
        match self.get() {
            None => Ok(None),
            Some(v) => v.trim().parse::<T>().map(Some).map_err(|_| format!("{}={v:?} is not a valid value", self.name)),
        }
    }
}

/// This process's rank (0-based). Read before Slurm, Open MPI and PMI.
pub const WM_RANK: EnvVar = EnvVar { name: "WM_RANK", default: "from Slurm, Open MPI or PMI; else 0", doc: "this process's rank, 0-based" };
/// The number of ranks.
pub const WM_WORLD_SIZE: EnvVar =
    EnvVar { name: "WM_WORLD_SIZE", default: "from Slurm, Open MPI or PMI; else 1", doc: "the number of ranks" };
/// Where ranks meet: `host:port` or `dir:/shared/path`.
pub const WM_RENDEZVOUS: EnvVar = EnvVar {
    name: "WM_RENDEZVOUS",
    default: "none (required when the world has more than one rank)",
    doc: "`host:port` (rank 0 listens there) or `dir:/path` (a directory every rank can read and write)",
};
/// The address other nodes use to reach this rank over TCP.
pub const WM_HOST_ADDR: EnvVar = EnvVar {
    name: "WM_HOST_ADDR",
    default: "the local address of the connection to rank 0; with `dir:` the host name's address",
    doc: "the IP address other nodes use to reach this rank",
};
/// Overrides node identity (hostname + boot id).
pub const WM_NODE_ID: EnvVar = EnvVar {
    name: "WM_NODE_ID",
    default: "hostname + boot id",
    doc: "the node this rank claims to be on; ranks with equal ids share memory",
};
/// Seconds any blocking call may wait without progress.
pub const WM_TIMEOUT_S: EnvVar = EnvVar {
    name: "WM_TIMEOUT_S",
    default: "300",
    doc: "seconds a blocking call waits for a peer before failing with a timeout that names it",
};
/// The GPU this rank uses.
pub const WM_DEVICE: EnvVar = EnvVar {
    name: "WM_DEVICE",
    default: "local rank modulo the node's GPU count",
    doc: "the NVML index of the GPU this rank uses (several ranks may share one)",
};
/// Which communicator backend to use.
pub const WM_BACKEND: EnvVar = EnvVar {
    name: "WM_BACKEND",
    default: "auto: MPI when built with `mpi` and started by mpirun, else sockets",
    doc: "`auto`, `socket` or `mpi`",
};
/// Threads per rank for local row copies.
pub const WM_THREADS: EnvVar = EnvVar {
    name: "WM_THREADS",
    default: "the machine's cores divided by the ranks on this node",
    doc: "threads a rank uses to copy rows in gather and scatter, and to read and write files in load and store",
};
/// Whether shared host tables are built from huge pages.
pub const WM_HUGE_PAGES: EnvVar = EnvVar {
    name: "WM_HUGE_PAGES",
    default: "auto",
    doc: "`off` keeps shared host portions in ordinary pages; by default portions of 16 huge pages (32 MiB) or more are built from huge pages where the kernel allows (`MADV_COLLAPSE`)",
};
/// Forces GPU tests to fail rather than skip.
pub const WM_REQUIRE_GPU: EnvVar =
    EnvVar { name: "WM_REQUIRE_GPU", default: "0", doc: "`1` makes tests that need a GPU fail instead of skipping" };

/// Where compiled CUDA kernels are cached.
pub const WM_KERNEL_CACHE: EnvVar = EnvVar {
    name: "WM_KERNEL_CACHE",
    default: "$XDG_CACHE_HOME/wholemem/kernels, else ~/.cache/wholemem/kernels",
    doc: "directory of the NVRTC-compiled kernel cache; `off` disables it",
};

/// Set by the launcher (`wm-run`) for each rank it starts: a line the rank
/// writes that begins with this value is shown without it and without the
/// `[rank] ` tag — for a result line that scripts read.
pub const WM_UNTAGGED: EnvVar = EnvVar {
    name: "WM_UNTAGGED",
    default: "unset (set by wm-run for the ranks it starts)",
    doc: "a line of rank output beginning with this value is printed by wm-run without it and without the `[rank]` tag",
};

/// Where the multi-process tests find their rank programs when the test
/// executables run away from the build tree (the GPU check).
pub const WM_TEST_BIN_DIR: EnvVar = EnvVar {
    name: "WM_TEST_BIN_DIR",
    default: "unset: the programs cargo built",
    doc: "directory holding `wm-test-rank` and the other rank programs, for test executables copied to another machine",
};

/// Every variable, for documentation and `--help` output.
pub const ALL: &[EnvVar] = &[
    WM_RANK,
    WM_WORLD_SIZE,
    WM_RENDEZVOUS,
    WM_HOST_ADDR,
    WM_NODE_ID,
    WM_TIMEOUT_S,
    WM_BACKEND,
    WM_DEVICE,
    WM_THREADS,
    WM_HUGE_PAGES,
    WM_REQUIRE_GPU,
    WM_KERNEL_CACHE,
    WM_UNTAGGED,
    WM_TEST_BIN_DIR,
];

/// The default of [`WM_TIMEOUT_S`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The timeout from [`WM_TIMEOUT_S`] (fractions allowed), or the default.
///
/// # Errors
/// A message naming the bad value when it is not a positive number of
/// seconds up to [`MAX_SECONDS`].
pub fn timeout() -> Result<Duration, String> {
    match WM_TIMEOUT_S.get() {
        None => Ok(DEFAULT_TIMEOUT),
        Some(v) => seconds(WM_TIMEOUT_S.name, &v, false),
    }
}

/// The most seconds a duration setting takes (about 31 years): past any
/// job, and far from where adding it to an `Instant` would overflow.
pub const MAX_SECONDS: f64 = 1e9;

/// `raw` (a setting `name`, e.g. `WM_TIMEOUT_S` or `--grace-s`) as a
/// duration: a number of seconds, fractions allowed, up to
/// [`MAX_SECONDS`]; zero only when `zero_ok`.
///
/// # Errors
/// A message naming the setting and the bad value: not a number, NaN,
/// infinite, negative (or zero), or too large.
pub fn seconds(name: &str, raw: &str, zero_ok: bool) -> Result<Duration, String> {
    let least = if zero_ok { "0" } else { "more than 0" };
    let bad = |why: &str| format!("{name}={raw:?} {why}: expected a number of seconds, {least} and at most {MAX_SECONDS:e}");
    let s: f64 = raw.trim().parse().map_err(|_| bad("is not a number"))?;
    if s.is_nan() {
        return Err(bad("is not a number"));
    }
    if s > MAX_SECONDS {
        return Err(bad("is too large"));
    }
    if s < 0.0 || (s == 0.0 && !zero_ok) {
        return Err(bad("is too small"));
    }
    // Finite and within range now, so the conversion cannot fail; a
    // positive value too small for a nanosecond is still positive.
    let d = Duration::try_from_secs_f64(s).map_err(|_| bad("is out of range"))?;
    Ok(if d.is_zero() && s > 0.0 { Duration::from_nanos(1) } else { d })
}

/// Whether [`WM_REQUIRE_GPU`] asks for GPU tests to fail rather than skip.
pub fn require_gpu() -> bool {
    matches!(WM_REQUIRE_GPU.get().as_deref(), Some("1" | "true" | "yes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_checked_and_named() {
        assert_eq!(seconds("WM_TIMEOUT_S", "2.5", false), Ok(Duration::from_millis(2500)));
        assert_eq!(seconds("--grace-s", " 0 ", true), Ok(Duration::ZERO));
        assert_eq!(seconds("WM_TIMEOUT_S", "1e-300", false), Ok(Duration::from_nanos(1)));
        assert_eq!(seconds("WM_TIMEOUT_S", "1e9", false), Ok(Duration::from_secs(1_000_000_000)));
        for (raw, zero_ok, why) in [
            ("inf", true, "is too large"),
            ("1e300", false, "is too large"),
            ("1000000001", true, "is too large"),
            ("NaN", true, "is not a number"),
            ("-inf", true, "is too small"),
            ("-1", true, "is too small"),
            ("0", false, "is too small"),
            ("soon", true, "is not a number"),
            ("", true, "is not a number"),
        ] {
            let e = seconds("--grace-s", raw, zero_ok).unwrap_err();
            assert!(e.starts_with(&format!("--grace-s={raw:?} {why}")), "{raw}: {e}");
        }
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        let mut names: Vec<_> = ALL.iter().map(|v| v.name).collect();
        assert!(names.iter().all(|n| n.starts_with("WM_")));
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a variable is declared twice");
    }
}
