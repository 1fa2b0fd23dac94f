//! One rank of a job whose ranks each run collectives from two threads at
//! once, each thread on a communicator of its own (`tests/tests/threads.rs`):
//! one thread gathers rows of a distributed table (its exchange lands rows
//! in the output), the other exchanges frames of more than a megabyte,
//! several records each, on a communicator split from the world. Even ranks
//! start with the exchanges and odd ranks with the gathers, the other
//! thread a moment later (the gathering thread capped at one thread of the
//! rank's `WM_THREADS`, as a prefetch thread is): when an operation held the process's connections
//! for all of its wait, each rank's first operation waited for a peer
//! whose first operation was the other one, and both threads of every rank
//! stood still until the timeout. Every row and byte is checked.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use wholemem::{Location, MemoryType, WholeTensor};
use wm_comm::Communicator;

type Comm = Arc<dyn Communicator>;

/// Rounds of each thread's operation.
const ROUNDS: usize = 12;
/// Table shape: 4 MiB of f32 rows.
const ROWS: usize = 16_384;
const COLS: usize = 64;
/// Ids per gather.
const BATCH: usize = 4096;

fn main() {
    let result = wm_comm::init().context("bootstrap").and_then(|world| two_threads(&world));
    if let Err(e) = result {
        eprintln!("FAILED: {e:#}");
        std::process::exit(1);
    }
}

/// What the table holds at (row, col).
fn value(row: usize, col: usize) -> f32 {
    (row * 131 + col) as f32
}

/// The frame rank `from` sends rank `to` in `round`: over a megabyte, of
/// a length and content particular to the three.
fn frame(from: usize, to: usize, round: usize) -> Vec<u8> {
    let len = (1 << 20) + 4099 * (from + 1) + 17 * to + round;
    (0..len).map(|i| (i * 31 + from * 7 + to * 3 + round) as u8).collect()
}

fn two_threads(world: &Comm) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let side = world.split(0, me as u32).context("a second communicator")?;
    let mut t = WholeTensor::<f32>::matrix(world, MemoryType::Distributed, Location::Host, ROWS, COLS, None)?;
    let own: Vec<f32> = t.local_rows().flat_map(|r| (0..COLS).map(move |c| value(r, c))).collect();
    t.write_local(&own)?;
    world.barrier()?;
    let later = Duration::from_millis(300);
    let table = &t;
    let (gathered, exchanged) = std::thread::scope(|s| {
        let gathers = s.spawn(move || -> Result<()> {
            // A thread with one core of the rank's budget (a prefetch
            // thread): its gathers start no helper threads, whatever
            // WM_THREADS says for the rank.
            wholemem::cores::cap_this_thread(Some(1));
            let threads = table.memory().compute_threads();
            ensure!(threads == 1, "rank {me}: a thread capped at one thread would gather with {threads}");
            if me % 2 == 0 {
                std::thread::sleep(later);
            }
            for round in 0..ROUNDS {
                let ids: Vec<i64> = (0..BATCH).map(|k| ((k * 7919 + round * 104_729 + me * 13) % ROWS) as i64).collect();
                let mut out = vec![0f32; BATCH * COLS];
                wm_gather::gather_into(table, &ids, &mut out).with_context(|| format!("rank {me}: gather round {round}"))?;
                for (i, &id) in ids.iter().enumerate() {
                    for c in 0..COLS {
                        let (got, want) = (out[i * COLS + c], value(id as usize, c));
                        ensure!(got == want, "rank {me}: gather round {round}: row {id} col {c} is {got}, want {want}");
                    }
                }
            }
            Ok(())
        });
        let exchanges = s.spawn(|| -> Result<()> {
            if me % 2 == 1 {
                std::thread::sleep(later);
            }
            for round in 0..ROUNDS {
                let send: Vec<Vec<u8>> = (0..n).map(|to| frame(me, to, round)).collect();
                let parts: Vec<&[u8]> = send.iter().map(Vec::as_slice).collect();
                let got = side.alltoallv(&parts).with_context(|| format!("rank {me}: exchange round {round}"))?;
                for (from, bytes) in got.iter().enumerate() {
                    ensure!(*bytes == frame(from, me, round), "rank {me}: exchange round {round}: the frame from rank {from} differs");
                }
            }
            Ok(())
        });
        let joined = |h: std::thread::ScopedJoinHandle<'_, Result<()>>, what: &str| {
            h.join().unwrap_or_else(|_| Err(anyhow!("the {what} thread panicked")))
        };
        (joined(gathers, "gather"), joined(exchanges, "exchange"))
    });
    gathered?;
    exchanged?;
    world.barrier()?;
    t.free()?;
    println!("rank {me}: {ROUNDS} gathers and {ROUNDS} exchanges from two threads at once, all checked (backend {})", world.backend());
    Ok(())
}
