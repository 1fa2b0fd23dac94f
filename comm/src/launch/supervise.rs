//! Running the ranks to the end: start each in a process group of its own,
//! watch them, stop them, sweep up what they left, and collect their
//! output without waiting on pipes that something else still holds.
//!
//! Stopping is always the same two steps, to every rank's group: a polite
//! signal (`SIGTERM`, or the `SIGINT`/`SIGTERM`/`SIGHUP` the launcher
//! received), then `SIGKILL`. When it starts:
//!
//! - a rank failed: the others have the grace period to end on their own
//!   (they report the lost rank), then `SIGTERM`, then `SIGKILL`
//!   [`TERM_TO_KILL`] later;
//! - the launcher received a signal (with [`forward_signals`]) or the time
//!   limit passed: at once, and `SIGKILL` after the grace period.
//!
//! When every rank has ended, anything still in their groups (a background
//! job, a child that ignored the signal) gets `SIGTERM`, then `SIGKILL`
//! [`SWEEP`] later at most. Output pumps are then given until they have
//! been quiet for [`PUMP_IDLE`]; a pump still blocked reading a pipe that a
//! process outside the groups holds is left behind (its thread ends when
//! the pipe closes or the process exits). So a launch returns within the
//! grace period and about a second after its trigger, whatever the ranks
//! left running — except for processes that left their group
//! (`setsid`, `setpgid`), which the launcher cannot tell from strangers.

use std::io::{self, BufRead, BufReader, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::group::{self, Ended, SIGHUP, SIGINT, SIGKILL, SIGTERM};
use super::{Launch, RankOutcome, Report, UNTAGGED_MARKER};

/// After a failure and the grace period: from `SIGTERM` to `SIGKILL`.
pub const TERM_TO_KILL: Duration = Duration::from_millis(300);
/// Leftovers of ended ranks: from `SIGTERM` to `SIGKILL`, at most.
pub const SWEEP: Duration = Duration::from_millis(250);
/// After `SIGKILL`, how long a rank may take to die (a process stuck in
/// the kernel may take longer; it is then reported as killed and left).
pub const REAP: Duration = Duration::from_millis(250);
/// How long output pumps may be quiet, once the ranks are gone, before the
/// launcher stops waiting for them.
pub const PUMP_IDLE: Duration = Duration::from_millis(200);
const TICK: Duration = Duration::from_millis(5);

/// The signal forwarded signals set (0: none yet).
fn received() -> &'static Arc<AtomicUsize> {
    static RECEIVED: OnceLock<Arc<AtomicUsize>> = OnceLock::new();
    RECEIVED.get_or_init(|| Arc::new(AtomicUsize::new(0)))
}

/// From now on, `SIGINT`, `SIGTERM` and `SIGHUP` delivered to this process
/// no longer end it: they stop every launch of this process — now and
/// later — by sending the same signal to every rank's process group, then
/// `SIGKILL` after the grace period. [`Report::signal`] says which arrived,
/// and [`Report::exit_code`] is then 128 + its number. For a tool whose job
/// is a launch (`wm-run`, `wm-bench`); the handlers only record the signal.
///
/// Without it, ranks still die with the launcher (`SIGKILL` from the
/// kernel when it exits), but what they started may not.
///
/// # Errors
/// When a handler cannot be installed.
pub fn forward_signals() -> io::Result<()> {
    static INSTALLED: Mutex<bool> = Mutex::new(false);
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if !*installed {
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            signal_hook::flag::register_usize(sig, received().clone(), sig as usize)?;
        }
        *installed = true;
    }
    Ok(())
}

fn signal_received() -> Option<i32> {
    match received().load(Ordering::SeqCst) {
        0 => None,
        s => i32::try_from(s).ok(),
    }
}

/// One rank while it runs.
struct Rank {
    child: Child,
    pid: u32,
    /// Whether it succeeded, and when it ended.
    ended: Option<(bool, Duration)>,
    /// Whether its group had been signalled when it ended.
    signalled: bool,
}

/// Where an output pump is, for deciding whether waiting for it can help.
#[derive(Default)]
struct PumpState {
    lines: AtomicU64,
    reading: AtomicBool,
}

struct Pump {
    handle: thread::JoinHandle<()>,
    state: Arc<PumpState>,
}

fn pump(rank: usize, src: impl io::Read + Send + 'static, to_stderr: bool, echo: bool, sink: Arc<Mutex<Vec<String>>>) -> io::Result<Pump> {
    let state = Arc::new(PumpState::default());
    let st = state.clone();
    let handle = thread::Builder::new().name(format!("wm-launch-out-{rank}")).spawn(move || {
        let mut src = BufReader::new(src);
        let mut raw = Vec::new();
        loop {
            raw.clear();
            st.reading.store(true, Ordering::SeqCst);
            let n = src.read_until(b'\n', &mut raw);
            st.reading.store(false, Ordering::SeqCst);
            if !matches!(n, Ok(1..)) {
                break;
            }
            if raw.last() == Some(&b'\n') {
                raw.pop();
                if raw.last() == Some(&b'\r') {
                    raw.pop();
                }
            }
            // Not UTF-8 is still output: shown, not a reason to stop reading.
            let mut line = String::from_utf8_lossy(&raw).into_owned();
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
            st.lines.fetch_add(1, Ordering::SeqCst);
        }
    })?;
    Ok(Pump { handle, state })
}

/// Waits for the pumps to reach the end of their pipes, but no longer than
/// [`PUMP_IDLE`] of silence while every unfinished one is blocked reading
/// (a pipe some process outside the ranks' groups still holds). Pumps
/// blocked writing to this process's own output are waited for.
fn drain(pumps: Vec<Pump>) {
    let lines = |ps: &[Pump]| ps.iter().map(|p| p.state.lines.load(Ordering::SeqCst)).sum::<u64>();
    let mut seen = lines(&pumps);
    let mut quiet_since = Instant::now();
    loop {
        let open: Vec<&Pump> = pumps.iter().filter(|p| !p.handle.is_finished()).collect();
        if open.is_empty() {
            break;
        }
        let now = lines(&pumps);
        if now != seen {
            (seen, quiet_since) = (now, Instant::now());
        } else if quiet_since.elapsed() >= PUMP_IDLE && open.iter().all(|p| p.state.reading.load(Ordering::SeqCst)) {
            break;
        }
        thread::sleep(TICK);
    }
    for p in pumps {
        if p.handle.is_finished() {
            let _ = p.handle.join();
        }
        // Otherwise detached: it ends when its pipe closes.
    }
}

fn signal_all(ranks: &[Rank], sig: i32) {
    for r in ranks {
        group::signal_group(r.pid, sig);
    }
}

/// Kills what was started so far (after a failed start or a failed wait)
/// and collects it, within bounds.
fn abandon(mut ranks: Vec<Rank>, pumps: Vec<Pump>) {
    signal_all(&ranks, SIGKILL);
    let t = Instant::now();
    for r in &mut ranks {
        while !matches!(r.child.try_wait(), Ok(Some(_)) | Err(_)) && t.elapsed() < REAP {
            thread::sleep(TICK);
        }
    }
    drain(pumps);
}

/// Starts `commands` (rank `r` is `commands[r]`), one process group each,
/// and runs them to the end as the module documentation says.
pub(super) fn supervise(l: &Launch, commands: Vec<Command>) -> io::Result<Report> {
    let start = Instant::now();
    let (mut ranks, pumps, sinks) = start_ranks(l, commands)?;
    let watched = match watch(l, start, &mut ranks) {
        Ok(w) => w,
        Err(e) => {
            abandon(ranks, pumps);
            return Err(e);
        }
    };
    sweep(&ranks, pumps, watched.killed);
    reap(ranks, sinks, start, watched)
}

/// Where each rank's output lines are collected.
type Sink = Arc<Mutex<Vec<String>>>;

/// Starts the ranks and the pumps of their output; on a failure, kills
/// what was started.
fn start_ranks(l: &Launch, commands: Vec<Command>) -> io::Result<(Vec<Rank>, Vec<Pump>, Vec<Sink>)> {
    let mut ranks: Vec<Rank> = Vec::with_capacity(commands.len());
    let mut pumps = Vec::with_capacity(2 * commands.len());
    let mut sinks = Vec::with_capacity(commands.len());
    for (r, mut cmd) in commands.into_iter().enumerate() {
        group::own_group(&mut cmd);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                abandon(ranks, pumps);
                return Err(io::Error::new(e.kind(), format!("cannot start {:?}: {e}", l.program)));
            }
        };
        let pid = child.id();
        let sink = Arc::new(Mutex::new(Vec::new()));
        let (out, err) = (child.stdout.take(), child.stderr.take());
        ranks.push(Rank { child, pid, ended: None, signalled: false });
        let started = out
            .map(|o| pump(r, o, false, l.echo, sink.clone()))
            .into_iter()
            .chain(err.map(|e| pump(r, e, true, l.echo, sink.clone())))
            .try_for_each(|p| p.map(|p| pumps.push(p)));
        if let Err(e) = started {
            abandon(ranks, pumps);
            return Err(io::Error::new(e.kind(), format!("cannot start a thread to read rank {r}'s output: {e}")));
        }
        sinks.push(sink);
    }

    Ok((ranks, pumps, sinks))
}

/// How the ranks ended, as [`watch`] saw it.
struct Watched {
    first_failure: Option<usize>,
    hit_limit: bool,
    signal: Option<i32>,
    /// Whether SIGKILL went out.
    killed: bool,
}

/// Waits for every rank to end: on a failure, a time limit or a signal to
/// this process, signals the ranks politely, then SIGKILL when due.
fn watch(l: &Launch, start: Instant, ranks: &mut [Rank]) -> io::Result<Watched> {
    let mut first_failure = None;
    let mut failed_at: Option<Instant> = None;
    let mut hit_limit = false;
    let mut signal = None;
    // When the polite signal went out, and when SIGKILL is due (None: never).
    let mut termed = false;
    let mut kill_at: Option<Instant> = None;
    let mut killed_at: Option<Instant> = None;
    loop {
        let mut lost = None;
        for (r, rank) in ranks.iter_mut().enumerate() {
            if rank.ended.is_some() {
                continue;
            }
            let state = match group::ended(rank.pid) {
                Ok(s) => s,
                Err(e) => {
                    lost = Some(io::Error::new(e.kind(), format!("cannot watch rank {r}: {e}")));
                    break;
                }
            };
            if state == Ended::No {
                continue;
            }
            let ok = state == Ended::Success;
            rank.ended = Some((ok, start.elapsed()));
            rank.signalled = termed;
            if !ok && !termed && first_failure.is_none() {
                first_failure = Some(r);
                failed_at = Some(Instant::now());
            }
        }
        if let Some(e) = lost {
            return Err(e);
        }
        if ranks.iter().all(|r| r.ended.is_some()) {
            break;
        }
        signal = signal.or_else(signal_received);
        let now = Instant::now();
        if !termed {
            let over_limit = l.limit.is_some_and(|t| start.elapsed() >= t);
            let past_grace = failed_at.is_some_and(|t| t.elapsed() >= l.grace);
            let polite = match signal {
                Some(sig) => Some((sig, l.grace)),
                None if over_limit => Some((SIGTERM, l.grace)),
                None if past_grace => Some((SIGTERM, TERM_TO_KILL)),
                None => None,
            };
            if let Some((sig, then)) = polite {
                hit_limit = over_limit;
                signal_all(ranks, sig);
                termed = true;
                kill_at = now.checked_add(then);
            }
        }
        if killed_at.is_none() && kill_at.is_some_and(|t| now >= t) {
            signal_all(ranks, SIGKILL);
            killed_at = Some(now);
        }
        if killed_at.is_some_and(|t| t.elapsed() >= REAP) {
            // Some rank outlived SIGKILL (stuck in the kernel): stop waiting.
            break;
        }
        thread::sleep(TICK);
    }
    Ok(Watched { first_failure, hit_limit, signal, killed: killed_at.is_some() })
}

/// What the ranks left in their groups: asked to go, then killed; the
/// pumps drained.
fn sweep(ranks: &[Rank], pumps: Vec<Pump>, killed: bool) {
    // Ask, then insist. The pumps
    // finish when the last holder of each pipe is gone, which is the usual
    // sign that nothing is left.
    if !killed {
        signal_all(ranks, SIGTERM);
        let t = Instant::now();
        while t.elapsed() < SWEEP && pumps.iter().any(|p| !p.handle.is_finished()) {
            thread::sleep(TICK);
        }
    }
    signal_all(ranks, SIGKILL);
    drain(pumps);
}

/// Collects each rank's status and output into the report.
fn reap(ranks: Vec<Rank>, sinks: Vec<Sink>, start: Instant, w: Watched) -> io::Result<Report> {
    // Reap last: until now every rank's pid, and so its group id, was
    // still taken.
    let mut outcomes = Vec::with_capacity(ranks.len());
    for ((rank, mut r), sink) in ranks.into_iter().enumerate().zip(sinks) {
        let (status, killed, ended_after) = match r.ended {
            Some((_, after)) => (r.child.wait()?, r.signalled, after),
            None => {
                // Outlived SIGKILL: reported as killed by it, left to the kernel.
                use std::os::unix::process::ExitStatusExt;
                (r.child.try_wait().ok().flatten().unwrap_or(ExitStatus::from_raw(SIGKILL)), true, start.elapsed())
            }
        };
        let output = std::mem::take(&mut *sink.lock().unwrap_or_else(|p| p.into_inner()));
        outcomes.push(RankOutcome { rank, status, killed, output, ended_after });
    }
    Ok(Report { ranks: outcomes, first_failure: w.first_failure, hit_limit: w.hit_limit, signal: w.signal })
}
