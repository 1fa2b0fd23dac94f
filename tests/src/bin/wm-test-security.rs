//! One rank of the scenarios that test the transport against peers that
//! misbehave: `wm-test-security SCENARIO [ARGS…]`. Started by
//! `tests/tests/security.rs` through the harness (or by hand under `wm-run`).
//! It talks to the socket backend directly, because a hostile peer needs
//! its raw connections (`SocketComm::inject_raw`, feature `fault-injection`).

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use wm_comm::{CommExt, Communicator, SocketComm};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().cloned().unwrap_or_default();
    if scenario == "declared-length" {
        victim_timeout(&args[1..]);
    }
    let result = SocketComm::from_env().context("bootstrap").and_then(|world| {
        let rest = &args[1.min(args.len())..];
        match scenario.as_str() {
            "hostile-frame" => hostile_frame(&world, rest),
            "barrier-loss" => barrier_loss(&world, rest),
            "collectives" => collectives(&world),
            "declared-length" => declared_length(&world, rest),
            other => bail!("unknown scenario {other:?}"),
        }
    });
    wm_tests::exit_with(result);
}

/// A few collectives with checked results: what a job that was attacked
/// during startup must still do right.
fn collectives(world: &SocketComm) -> Result<()> {
    let me = world.rank();
    let all = world.allgather_value(me as u64 * 7 + 1)?;
    ensure!(all == (0..world.size() as u64).map(|r| r * 7 + 1).collect::<Vec<_>>(), "allgather returned {all:?}");
    let parts: Vec<Vec<u8>> = (0..world.size()).map(|to| vec![(me * 16 + to) as u8; 1000 + to]).collect();
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let received = world.alltoallv(&refs)?;
    for (from, g) in received.iter().enumerate() {
        ensure!(*g == vec![(from * 16 + me) as u8; 1000 + me], "alltoallv part from rank {from} is wrong");
    }
    world.barrier()?;
    Ok(())
}

/// `hostile-frame HOSTILE KIND`: rank HOSTILE sends every other rank a
/// frame the protocol forbids, then waits in a barrier like everyone else.
/// Every rank must fail with an error that blames HOSTILE (never a panic
/// or an abort), and the next call must fail the same way.
///
/// Kinds: `huge` (a data frame announcing 2^62 bytes), `garbage` (32 bytes
/// that are not a header), `fds` (a frame announcing descriptors that never
/// come), `bogus-abort` (an abort naming a rank that does not exist).
fn hostile_frame(world: &SocketComm, args: &[String]) -> Result<()> {
    let hostile: usize = args.first().context("the hostile rank")?.parse()?;
    let kind = args.get(1).context("the kind of frame")?.as_str();
    let me = world.rank();
    // The hostile frames can reach a rank still in this first barrier (the
    // hostile rank leaves it as soon as it has everyone's frame): either
    // barrier may be the one that fails.
    let first = world.barrier();
    if me == hostile {
        first.as_ref().map_err(|e| anyhow::anyhow!("rank {me}: the first barrier failed: {e}"))?;
        let bytes: Vec<u8> = match kind {
            "huge" => SocketComm::raw_header(1, 1, 0, world.wire_id(), 1, 1 << 62).to_vec(),
            "garbage" => (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect(),
            "fds" => SocketComm::raw_header(1, 1, 3, world.wire_id(), 1, 0).to_vec(),
            "bogus-abort" => SocketComm::raw_header(3, 6, 0, 0, 1 << 40, 0).to_vec(),
            other => bail!("unknown kind {other:?}"),
        };
        for to in (0..world.size()).filter(|&r| r != me) {
            // A rank that read the first frames may already have told the
            // others and left: a closed connection here is that, not a fault.
            let _ = world.inject_raw(to, &bytes);
        }
    }
    // The others may have sent their frames for the second barrier before
    // they read the hostile ones, so the hostile rank's own barrier can
    // succeed; then the call after it must fail.
    let err = match first.and_then(|()| world.barrier()) {
        Ok(()) if me == hostile => match world.barrier() {
            Ok(()) => bail!("rank {me}: two barriers after sending {kind} frames succeeded"),
            Err(e) => e,
        },
        Ok(()) => bail!("rank {me}: a barrier after a {kind} frame from rank {hostile} succeeded"),
        Err(e) => e,
    };
    println!("rank {me}: {err}");
    ensure!(err.blamed_rank() == Some(hostile), "rank {me}: the error blames {:?}, not rank {hostile}: {err}", err.blamed_rank());
    let again = world.allgather_value(1u8).expect_err("every later call fails too");
    ensure!(again.blamed_rank() == Some(hostile), "rank {me}: the next call blames {:?}: {again}", again.blamed_rank());
    Ok(())
}

/// `barrier-loss VICTIM ROUNDS`: every rank runs barriers on the world and
/// its node; after ROUNDS of them the victim kills itself with SIGKILL in
/// the middle of the next. Every survivor must fail naming the victim —
/// not a rank that merely reported the loss first and then exited.
fn barrier_loss(world: &SocketComm, args: &[String]) -> Result<()> {
    let victim: usize = args.first().context("the victim rank")?.parse()?;
    let rounds: usize = args.get(1).context("rounds before the kill")?.parse()?;
    let me = world.rank();
    let local = world.local();
    for round in 0.. {
        if me == victim && round == rounds {
            // SAFETY: raising a signal at this process has no memory effects.
            unsafe { libc::raise(libc::SIGKILL) };
            std::thread::sleep(Duration::from_secs(600));
            bail!("the victim is still alive");
        }
        let step = if round % 2 == 0 { world.barrier() } else { local.barrier().and_then(|()| world.barrier()) };
        if let Err(e) = step {
            println!("rank {me}: round {round}: {e}");
            ensure!(e.blamed_rank() == Some(victim), "rank {me}: the error blames {:?}, not rank {victim}: {e}", e.blamed_rank());
            return Ok(());
        }
        ensure!(round < rounds + 10_000, "rank {me}: the victim's loss was never noticed");
    }
    Ok(())
}

/// `declared-length`'s victim alone waits `WM_TIMEOUT_S` (the 4th
/// argument) before it gives up; the others wait longer, so that every
/// other rank hears of the hostile rank from the victim, and the hostile
/// rank, whose calls the victim no longer answers, says nothing first.
fn victim_timeout(args: &[String]) {
    let victim = args.get(1).cloned().unwrap_or_default();
    let short = args.get(3).cloned().unwrap_or_default();
    let me = std::env::var("WM_RANK").unwrap_or_default();
    let secs = if me == victim { short } else { "600".to_owned() };
    // SAFETY: called first thing in `main`, before any other thread exists.
    unsafe { std::env::set_var("WM_TIMEOUT_S", secs) };
}

/// Bytes of body the hostile rank of `declared-length` sends behind its
/// header.
const DECLARED_BODY: usize = 1 << 20;

/// The peak resident memory of this process (`VmHWM`), in bytes.
fn peak_rss() -> Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM in /proc/self/status")?;
    let kib: usize = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse()?;
    Ok(kib << 10)
}

/// `declared-length HOSTILE VICTIM BYTES SECS`: rank HOSTILE, which holds the
/// job's key, sends rank VICTIM a data frame whose header declares BYTES
/// of payload, sealed like its honest frames, then a megabyte of it and
/// nothing more. The victim must fail naming HOSTILE (the rest never
/// comes: it gives up after SECS), with its peak memory grown by no more than the per-connection
/// cap ([`SocketComm::CONNECTION_AHEAD_MAX`]) beyond the bytes sent; every
/// other honest rank must be told, and fail naming HOSTILE too.
fn declared_length(world: &SocketComm, args: &[String]) -> Result<()> {
    let hostile: usize = args.first().context("the hostile rank")?.parse()?;
    let victim: usize = args.get(1).context("the victim rank")?.parse()?;
    let declared: u64 = args.get(2).context("the declared length")?.parse()?;
    let me = world.rank();
    let before = peak_rss()?;
    world.barrier().context("the first barrier")?;
    if me == hostile {
        let mut bytes = SocketComm::raw_header(1, 1, 0, world.wire_id(), 1, declared).to_vec();
        bytes.extend((0..DECLARED_BODY).map(|i| (i % 251) as u8));
        world.inject_raw(victim, &bytes)?;
        // Its own calls may end either way: the victim gives up on it.
        let _ = world.barrier().and_then(|()| world.barrier());
        return Ok(());
    }
    let err = match world.barrier().and_then(|()| world.barrier()) {
        Ok(()) => bail!("rank {me}: the barriers after a frame declaring {declared} bytes from rank {hostile} succeeded"),
        Err(e) => e,
    };
    println!("rank {me}: {err}");
    ensure!(err.blamed_rank() == Some(hostile), "rank {me}: the error blames {:?}, not rank {hostile}: {err}", err.blamed_rank());
    if me == victim {
        let grown = peak_rss()?.saturating_sub(before);
        let cap = SocketComm::CONNECTION_AHEAD_MAX + DECLARED_BODY;
        println!("rank {me}: peak memory grew by {grown} bytes for a frame declaring {declared} (cap {cap})");
        ensure!(grown <= cap, "rank {me}: peak memory grew by {grown} bytes for a frame declaring {declared}, over the cap of {cap}");
    } else {
        ensure!(err.to_string().contains(&format!("rank {victim} reported")), "rank {me}: not told by rank {victim}: {err}");
    }
    Ok(())
}
