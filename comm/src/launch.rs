//! Starting local ranks: what `wm-run`, `wm-bench` and the multi-process
//! tests use.
//!
//! Each rank is a real process with `WM_RANK`, `WM_WORLD_SIZE` and
//! `WM_RENDEZVOUS` set (and `WM_NODE_ID=node<r/K>` when posing as nodes of
//! `K` ranks), the leader of a process group of its own, which dies with the
//! launcher. Output lines are prefixed with the rank. When a rank fails the
//! others get a grace period to report the failure themselves (they will name
//! the lost rank), then every rank's group gets `SIGTERM` and, shortly after,
//! `SIGKILL`; what ranks leave running in their groups is stopped the same
//! way when the launch ends, and the launch never waits on an output pipe
//! that something outside the ranks still holds. [`forward_signals`] makes
//! `SIGINT`/`SIGTERM`/`SIGHUP` to the launcher stop the ranks the same way.
//!
//! A rank can have one of its lines shown without the tag — a result line a
//! script reads with `tail -1` — by printing [`untagged`]`(line)`.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use wm_topology::env::{
    WM_HOST_ADDR, WM_IFACE, WM_JOB_KEY, WM_NODE_ID, WM_RANK, WM_RENDEZVOUS, WM_RENDEZVOUS_PORT_FILE, WM_UNTAGGED, WM_WORLD_SIZE,
};

use crate::JobKey;

// Process groups, signals and reaping: killpg, waitid, prctl in pre_exec.
#[allow(unsafe_code)]
mod group;
mod supervise;

pub use supervise::{PUMP_IDLE, REAP, SWEEP, TERM_TO_KILL, forward_signals};

/// How the started ranks meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Meet {
    /// A fresh private directory (`dir:`), removed afterwards.
    #[default]
    Dir,
    /// TCP on 127.0.0.1: rank 0 listens on a port the kernel picks and
    /// publishes it in the launcher's private directory.
    Tcp,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Number of ranks.
    pub ranks: usize,
    /// Ranks per simulated node (`None`: one real node).
    pub node_size: Option<usize>,
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment for every rank.
    pub env: Vec<(OsString, OsString)>,
    /// How ranks meet.
    pub meet: Meet,
    /// Print each line with a `[rank]` prefix as it arrives.
    pub echo: bool,
    /// How long the others may run on after a rank fails; and, after a
    /// forwarded signal or the time limit, from `SIGTERM` to `SIGKILL`.
    pub grace: Duration,
    /// Stop everything after this long (`None`: no limit).
    pub limit: Option<Duration>,
}

impl Launch {
    /// `ranks` copies of `program args…`, echoing output, 5 s grace.
    pub fn new(ranks: usize, program: impl Into<OsString>, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        Self {
            ranks,
            node_size: None,
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            meet: Meet::Dir,
            echo: true,
            grace: Duration::from_secs(5),
            limit: None,
        }
    }
}

/// How one rank ended.
#[derive(Debug)]
pub struct RankOutcome {
    /// The rank.
    pub rank: usize,
    /// Its exit status.
    pub status: ExitStatus,
    /// Whether it ended after the launcher signalled its group (after
    /// another rank failed, a forwarded signal, or the limit).
    pub killed: bool,
    /// Its output lines, stdout and stderr interleaved as they arrived.
    pub output: Vec<String>,
    /// When it ended, from the start of the launch.
    pub ended_after: Duration,
}

/// How all ranks ended.
#[derive(Debug)]
pub struct Report {
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankOutcome>,
    /// The first rank that failed on its own, if any.
    pub first_failure: Option<usize>,
    /// Whether the time limit stopped the launch.
    pub hit_limit: bool,
    /// The signal the launcher received that stopped the launch (see
    /// [`forward_signals`]).
    pub signal: Option<i32>,
}

impl Report {
    /// Whether every rank exited with status 0.
    pub fn success(&self) -> bool {
        self.ranks.iter().all(|r| r.status.success())
    }

    /// One line per failed rank, for messages.
    pub fn failures(&self) -> Vec<String> {
        self.ranks
            .iter()
            .filter(|r| !r.status.success())
            .map(|r| {
                let how = describe(r.status);
                if r.killed { format!("rank {} {how} (stopped by the launcher)", r.rank) } else { format!("rank {} {how}", r.rank) }
            })
            .collect()
    }

    /// The exit code a launcher should return: 128 + the signal that
    /// stopped the launch, else 0, or the first failure's code (1 when it
    /// died of a signal).
    pub fn exit_code(&self) -> i32 {
        if let Some(sig) = self.signal {
            return 128 + sig;
        }
        match self.first_failure {
            None if self.success() => 0,
            None => 1,
            Some(r) => self.ranks[r].status.code().filter(|&c| c != 0).unwrap_or(1),
        }
    }
}

/// "exited with status 3" or "was killed by signal 9 (SIGKILL)".
pub fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => match signal_name(sig) {
            Some(name) => format!("was killed by signal {sig} ({name})"),
            None => format!("was killed by signal {sig}"),
        },
        _ => "ended".to_owned(),
    }
}

/// The name of a common signal.
fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
}

/// What the launcher puts in [`WM_UNTAGGED`] for its ranks.
pub(crate) const UNTAGGED_MARKER: &str = "\u{1}wm-untagged\u{1}";

/// `line` as a rank prints it so that the launcher that started it shows
/// it as it is, without the `[rank] ` tag (the launcher tells its ranks how
/// in `WM_UNTAGGED`). Unchanged when the rank was started otherwise.
///
/// ```no_run
/// println!("{}", wm_comm::launch::untagged("auc=0.93"));
/// ```
pub fn untagged(line: &str) -> String {
    match WM_UNTAGGED.get() {
        Some(marker) => format!("{marker}{line}"),
        None => line.to_owned(),
    }
}

struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory only this user can enter (mode 700).
    fn new() -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for i in 0..100u32 {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
            let p = base.join(format!("wm-run.{}.{nanos:x}.{i}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&p) {
                Ok(()) => return Ok(Self(p)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("cannot create a rendezvous directory"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The key of a launch: the launcher's own `WM_JOB_KEY` when it has one
/// (so an outside process the user gives that key can join), else a fresh one.
fn launch_key(l: &Launch) -> io::Result<String> {
    let given = l.env.iter().rev().find(|(k, _)| k == WM_JOB_KEY.name).map(|(_, v)| v.to_string_lossy().into_owned());
    let key = match given.or_else(|| WM_JOB_KEY.get()) {
        Some(v) => JobKey::from_hex(&v, WM_JOB_KEY.name),
        None => JobKey::generate(),
    };
    key.map(|k| k.to_hex()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

/// Starts the ranks and waits for all of them (and for nothing else: see
/// the module documentation for how they are stopped).
///
/// # Errors
/// When a process cannot be started or watched (the others are killed
/// first).
pub fn run(l: &Launch) -> io::Result<Report> {
    if l.ranks == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "at least one rank is needed"));
    }
    if let Some(k) = l.node_size
        && (k == 0 || l.ranks % k != 0)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--node-size {k} does not divide {} ranks into whole nodes", l.ranks),
        ));
    }
    let dir = TempDir::new()?;
    let key = launch_key(l)?;
    let rendezvous = match l.meet {
        Meet::Dir => format!("dir:{}", dir.0.display()),
        Meet::Tcp => "127.0.0.1:0".to_owned(),
    };
    let port_file = dir.0.join("port");
    let mut commands = Vec::with_capacity(l.ranks);
    for r in 0..l.ranks {
        let mut cmd = Command::new(&l.program);
        cmd.args(&l.args)
            .env(WM_RANK.name, r.to_string())
            .env(WM_WORLD_SIZE.name, l.ranks.to_string())
            .env(WM_RENDEZVOUS.name, &rendezvous)
            .env(WM_RENDEZVOUS_PORT_FILE.name, &port_file)
            .env(WM_UNTAGGED.name, UNTAGGED_MARKER);
        match l.node_size {
            Some(k) => cmd.env(WM_NODE_ID.name, format!("node{}", r / k)),
            None => cmd.env_remove(WM_NODE_ID.name),
        };
        for (k, v) in &l.env {
            cmd.env(k, v);
        }
        // After the caller's environment: the key it gave, or a fresh one.
        cmd.env(WM_JOB_KEY.name, &key);
        // Every rank runs here: listen on loopback only, unless told where.
        let chosen = |v: &wm_topology::env::EnvVar| v.get().is_some() || l.env.iter().any(|(k, _)| k == v.name);
        if !chosen(&WM_HOST_ADDR) && !chosen(&WM_IFACE) {
            cmd.env(WM_HOST_ADDR.name, "127.0.0.1");
        }
        commands.push(cmd);
    }
    supervise::supervise(l, commands)
}
