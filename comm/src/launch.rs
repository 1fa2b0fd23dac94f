//! Starting local ranks: what `wm-run`, `wm-bench` and the multi-process
//! tests use.
//!
//! Each rank is a real process with `WM_RANK`, `WM_WORLD_SIZE` and
//! `WM_RENDEZVOUS` set (and `WM_NODE_ID=node<r/K>` when posing as nodes of
//! `K` ranks). Output lines are prefixed with the rank. When a rank fails the
//! others get a grace period to report the failure themselves (they will name
//! the lost rank), then they are killed.
//!
//! A rank can have one of its lines shown without the tag — a result line a
//! script reads with `tail -1` — by printing [`untagged`]`(line)`.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use wm_topology::env::{
    WM_HOST_ADDR, WM_IFACE, WM_JOB_KEY, WM_NODE_ID, WM_RANK, WM_RENDEZVOUS, WM_RENDEZVOUS_PORT_FILE, WM_UNTAGGED, WM_WORLD_SIZE,
};

use crate::JobKey;

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
    /// How long the others may run on after a rank fails.
    pub grace: Duration,
    /// Kill everything after this long (`None`: no limit).
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
    /// Whether the launcher killed it (after another rank failed, or the limit).
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

    /// The exit code a launcher should return: 0, or the first failure's
    /// code (1 when it died of a signal).
    pub fn exit_code(&self) -> i32 {
        match self.first_failure {
            None if self.success() => 0,
            None => 1,
            Some(r) => self.ranks[r].status.code().filter(|&c| c != 0).unwrap_or(1),
        }
    }
}

/// "exited with status 3" or "was killed by signal 9".
pub fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "ended".to_owned(),
    }
}

/// What the launcher puts in [`WM_UNTAGGED`] for its ranks.
const UNTAGGED_MARKER: &str = "\u{1}wm-untagged\u{1}";

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

fn pump(
    rank: usize,
    src: impl io::Read + Send + 'static,
    to_stderr: bool,
    echo: bool,
    sink: Arc<Mutex<Vec<String>>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(src).lines() {
            let Ok(mut line) = line else { break };
            let tagged = match line.strip_prefix(UNTAGGED_MARKER) {
                Some(rest) => {
                    line = rest.to_owned();
                    false
                }
                None => true,
            };
            if echo {
                let text = if tagged { format!("[{rank}] {line}\n") } else { format!("{line}\n") };
                // A closed terminal is not a reason to stop collecting.
                let _ =
                    if to_stderr { io::stderr().lock().write_all(text.as_bytes()) } else { io::stdout().lock().write_all(text.as_bytes()) };
            }
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    })
}

/// Starts the ranks and waits for all of them.
///
/// # Errors
/// When a process cannot be started (the others are killed first).
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
    let start = Instant::now();
    let mut children: Vec<Child> = Vec::with_capacity(l.ranks);
    let mut pumps = Vec::new();
    let mut sinks = Vec::new();
    for r in 0..l.ranks {
        let mut cmd = Command::new(&l.program);
        cmd.args(&l.args)
            .env(WM_RANK.name, r.to_string())
            .env(WM_WORLD_SIZE.name, l.ranks.to_string())
            .env(WM_RENDEZVOUS.name, &rendezvous)
            .env(WM_RENDEZVOUS_PORT_FILE.name, &port_file)
            .env(WM_UNTAGGED.name, UNTAGGED_MARKER)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
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
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(io::Error::new(e.kind(), format!("cannot start {:?}: {e}", l.program)));
            }
        };
        let sink = Arc::new(Mutex::new(Vec::new()));
        pumps.push(pump(r, child.stdout.take().expect("piped"), false, l.echo, sink.clone()));
        pumps.push(pump(r, child.stderr.take().expect("piped"), true, l.echo, sink.clone()));
        sinks.push(sink);
        children.push(child);
    }

    let mut done: Vec<Option<(ExitStatus, bool, Duration)>> = vec![None; l.ranks];
    let mut first_failure = None;
    let mut failed_at: Option<Instant> = None;
    let mut hit_limit = false;
    while done.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if done[r].is_none()
                && let Some(st) = c.try_wait()?
            {
                done[r] = Some((st, false, start.elapsed()));
                if !st.success() && first_failure.is_none() {
                    first_failure = Some(r);
                    failed_at = Some(Instant::now());
                }
            }
        }
        let over_limit = l.limit.is_some_and(|t| start.elapsed() >= t);
        let past_grace = failed_at.is_some_and(|t| t.elapsed() >= l.grace);
        if over_limit || past_grace {
            hit_limit |= over_limit;
            for (r, c) in children.iter_mut().enumerate() {
                if done[r].is_none() {
                    let _ = c.kill();
                    let st = c.wait()?;
                    done[r] = Some((st, true, start.elapsed()));
                }
            }
        }
        thread::sleep(Duration::from_millis(5));
    }
    for p in pumps {
        let _ = p.join();
    }
    let ranks = done
        .into_iter()
        .zip(sinks)
        .enumerate()
        .map(|(rank, (d, sink))| {
            let (status, killed, ended_after) = d.expect("every rank ended");
            let output = std::mem::take(&mut *sink.lock().unwrap_or_else(|p| p.into_inner()));
            RankOutcome { rank, status, killed, output, ended_after }
        })
        .collect();
    Ok(Report { ranks, first_failure, hit_limit })
}
