//! The system calls behind the launcher's process handling, and the only
//! unsafe code of `launch`: each rank in a process group of its own that
//! dies with the launcher, signals to whole groups, and watching a rank
//! end without reaping it.
//!
//! A rank is reaped only when the launch is over, after the last signal to
//! its group: until then its pid stays taken (an exited rank is a zombie),
//! so its group id cannot be handed to an unrelated process and a signal
//! to the group reaches only what the rank left behind.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

pub(super) use libc::{SIGHUP, SIGINT, SIGKILL, SIGTERM};

/// Starts `cmd` as the leader of a new process group, which dies with
/// this process: a launcher that is itself killed (even by `SIGKILL`)
/// takes its ranks with it (what a rank started in turn is reached through
/// the group instead).
pub(super) fn own_group(cmd: &mut Command) {
    cmd.process_group(0);
    let launcher = std::process::id() as libc::pid_t;
    let hook = move || {
        // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no
        // memory.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: getppid has no arguments and cannot fail.
        if unsafe { libc::getppid() } != launcher {
            // The launcher died before the request took effect.
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec, where only
    // async-signal-safe work is allowed: it makes two system calls (prctl,
    // getppid) and builds an io::Error from an errno, which neither
    // allocates nor takes a lock.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Sends `sig` to every process of the group `pgid` (a rank's pid). A
/// group that is already empty is not an error: there is nothing to stop.
pub(super) fn signal_group(pgid: u32, sig: i32) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else { return };
    // SAFETY: killpg takes two integers and touches no memory of ours.
    let _ = unsafe { libc::killpg(pgid, sig) };
}

/// How a rank ended, seen without reaping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Still running.
    No,
    /// Exited with status 0.
    Success,
    /// Exited with another status, or died of a signal.
    Failure,
}

/// Whether the child `pid` has ended, leaving it a zombie (its pid and
/// group stay reserved until `Child::wait` reaps it).
pub(super) fn ended(pid: u32) -> io::Result<Ended> {
    let id = libc::id_t::from(pid);
    // SAFETY: siginfo_t is a plain C struct; all zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t that outlives the call;
    // WNOWAIT leaves the child to be reaped later by its `Child`.
    let r = unsafe { libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled `info` for a child state change (CLD_*), whose
    // union member holds si_pid and si_status; with WNOHANG and no change it
    // left si_pid zero.
    let (who, status) = unsafe { (info.si_pid(), info.si_status()) };
    Ok(match (who, info.si_code) {
        (0, _) => Ended::No,
        (_, libc::CLD_EXITED) if status == 0 => Ended::Success,
        _ => Ended::Failure,
    })
}
