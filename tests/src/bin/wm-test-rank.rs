//! One rank of a multi-process test scenario. Started by the harness in
//! `wm_tests` (or by hand under `wm-run`): `wm-test-rank SCENARIO [ARGS…]`.
//! Every check runs on every rank; the first wrong result exits non-zero
//! with a message naming the rank and what differed.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use wholemem::{AllocRequest, Location, MemoryType, Partition, WholeMemory, WholeTensor, query};
use wm_comm::{CommExt, Communicator, ExchangePlan};
use wm_tests::Rng;

type Comm = Arc<dyn Communicator>;

fn main() {
    wm_tests::rank_main(|world, scenario, rest| match scenario {
        "collectives" => collectives(world),
        "landing" => landing(world),
        "fill-read" => location(rest).and_then(|loc| fill_read(world, loc)),
        "two-nodes" => two_nodes(world),
        "bad-input" => bad_input(world),
        "mismatched-calls" => mismatched_calls(world),
        "lose-peer" => lose_peer(world, rest),
        "gather" => location(rest).and_then(|loc| gather_scatter(world, loc)),
        "device-calls" => device_calls(world),
        "concurrent-scatter" => concurrent_scatter(world),
        "scatter-rank-order" => scatter_rank_order(world),
        "column" => columns(world),
        "huge-pages" => huge_pages(world, rest),
        "tcp-congestion" => tcp_congestion(world, rest),
        other => bail!("unknown scenario {other:?}"),
    });
}

/// The location a scenario runs on: its first argument, `host` by default.
/// The harness passes `device` only where a GPU is present.
fn location(rest: &[String]) -> Result<Location> {
    match rest.first().map(String::as_str) {
        None | Some("host") => Ok(Location::Host),
        Some("device") => Ok(Location::Device),
        Some(other) => bail!("unknown location {other:?}; expected host or device"),
    }
}

/// Writes this rank's rows of a matrix with `f(row, col)`, through
/// `write_rows`: the same code for host and device memory.
fn fill_rows<T: bytemuck::Pod>(t: &mut WholeTensor<T>, cols: usize, f: impl Fn(usize, usize) -> T) -> Result<()> {
    let own = t.local_rows();
    let vals: Vec<T> = own.clone().flat_map(|r| (0..cols).map(move |c| (r, c))).map(|(r, c)| f(r, c)).collect();
    t.memory_mut().write_rows(own.start, bytemuck::cast_slice(&vals))?;
    Ok(())
}

fn bytes_for(rank: usize, peer: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| (rank * 31 + peer * 7 + i * 13) as u8).collect()
}

// ---------------------------------------------------------------- collectives

/// The in-place exchange (`Communicator::exchange`) with work once
/// meanwhile (and, in other rounds, in steps, and with its parts kept and
/// checked after the call) over
/// rounds: sizes of zero, small (inline on the
/// socket), at the shared-memory threshold and growing (mailboxes replaced),
/// each pair's size changing from round to round, with plain exchanges in
/// between. Every part is checked byte for byte, and every rank's part must
/// arrive once, in rank order.
fn in_place(comm: &Comm) -> Result<()> {
    let (me, n) = (comm.rank(), comm.size());
    for round in 0..8 {
        let size = |from: usize, to: usize| match (from + 2 * to + round) % 4 {
            0 => 0,
            1 => 100 + from,
            2 => (16 << 10) + to,
            _ => (round + 1) * (192 << 10) + from * 7,
        };
        let sizes: Vec<usize> = (0..n).map(|to| size(me, to)).collect();
        let (mut misfilled, mut wrong): (Option<String>, Option<String>) = (None, None);
        // The order of the callbacks: every fill, one meanwhile (odd rounds:
        // every step, the stepped form), every take.
        let events = std::cell::RefCell::new(Vec::new());
        let mut fill = |to: usize, buf: &mut [u8]| {
            events.borrow_mut().push(format!("fill {to}"));
            if buf.len() == size(me, to) {
                buf.copy_from_slice(&bytes_for(me + round, to, buf.len()));
            } else {
                misfilled.get_or_insert(format!("fill for rank {to} got {} bytes, not {}", buf.len(), size(me, to)));
            }
        };
        let mut take = |from: usize, got: &[u8]| {
            events.borrow_mut().push(format!("take {from}"));
            if got != bytes_for(from + round, me, size(from, me)).as_slice() {
                wrong.get_or_insert(format!("round {round}: wrong {} bytes from rank {from}", got.len()));
            }
        };
        if round % 4 == 3 {
            // The keeping form: every part kept past the call, checked after
            // it, and handed back.
            let mut kept: Vec<Option<wm_comm::KeptPart>> = (0..n).map(|_| None).collect();
            comm.exchange(
                ExchangePlan::new(&sizes, &mut fill)
                    .between_steps(&mut |_| {
                        events.borrow_mut().push("meanwhile".to_owned());
                        false
                    })
                    .receive_parts(&mut |from, part| {
                        take(from, part.bytes());
                        kept[from] = Some(part.keep());
                    }),
            )?;
            for (from, k) in kept.iter().enumerate() {
                let k = k.as_ref().context("a part was not handed over")?;
                ensure!(**k == bytes_for(from + round, me, size(from, me))[..], "round {round}: the part kept from rank {from} changed");
            }
            comm.recycle(kept.into_iter().flatten().map(wm_comm::KeptPart::into_vec).collect());
        } else if round % 2 == 0 {
            comm.exchange(
                ExchangePlan::new(&sizes, &mut fill)
                    .while_in_flight(&mut || events.borrow_mut().push("meanwhile".to_owned()))
                    .receive(&mut take),
            )?;
        } else {
            // Seven steps, all before the first take; the events keep one
            // "meanwhile" for the lot so both forms read alike below.
            let mut left = 7;
            comm.exchange(
                ExchangePlan::new(&sizes, &mut fill)
                    .between_steps(&mut |_| {
                        left -= 1;
                        if left == 0 {
                            events.borrow_mut().push("meanwhile".to_owned());
                        }
                        left > 0
                    })
                    .receive(&mut take),
            )?;
            ensure!(left == 0, "round {round}: {left} steps of 7 did not run");
        }
        if let Some(w) = misfilled.or(wrong) {
            bail!("in-place exchange: {w}");
        }
        let events = events.into_inner();
        let fills = events.iter().take_while(|e| e.starts_with("fill")).count();
        ensure!(fills == n && events.get(n).map(String::as_str) == Some("meanwhile"), "callbacks ran in the order {events:?}");
        let takes: Vec<String> = (0..n).map(|r| format!("take {r}")).collect();
        ensure!(events[n + 1..] == takes[..], "the in-place exchange handed parts over in the order {events:?}");
        if round % 3 == 1 {
            let got = comm.alltoallv(&vec![&[me as u8; 5][..]; n])?;
            ensure!(got.iter().enumerate().all(|(r, g)| g == &[r as u8; 5]), "alltoallv between in-place rounds: {got:?}");
        }
    }
    let err = comm.exchange(ExchangePlan::new(&vec![0; n + 1], &mut |_, _| {})).expect_err("wrong number of sizes");
    ensure!(err.to_string().contains(&format!("{} sizes", n + 1)), "the error does not name the count: {err}");
    Ok(())
}

/// The in-place exchange with rows landing (`ExchangePlan::land_rows`)
/// over rounds: parts of their landing's length land in their rows — row
/// widths 1, 7 and 512, up to 3 000 rows a part (more than one scattered
/// read), rows in order (adjacent rows merge) and shuffled — and are handed
/// over as landed with their head; parts of another length come whole, not
/// landed, and touch nothing; rows
/// `step` writes are left alone. Then a landing beyond the output is an
/// error naming the row, and the communicator stays usable.
fn landing(comm: &Comm) -> Result<()> {
    let (me, n) = (comm.rank(), comm.size());
    for round in 0..6 {
        let row = [1, 7, 512][round % 3];
        let count = |from: usize, to: usize| match (from + to + round) % 3 {
            0 => 0,
            1 => 5 + from,
            _ => 1500 + 500 * from + to,
        };
        // A part of another length than its landing, now and then.
        let short = |from: usize, to: usize| (from * 3 + to + round) % 5 == 4 && count(from, to) > 0;
        let head = |from: usize, to: usize| [from as u8, to as u8, round as u8];
        let cell = |from: usize, to: usize, k: usize, j: usize| (from * 131 + to * 31 + k * 7 + j * 3 + round) as u8;
        // Each sender's rows of this rank's output, then ten rows for `step`.
        let step_rows = 10;
        let total = (0..n).map(|s| count(s, me)).sum::<usize>() + step_rows;
        let mut perm: Vec<usize> = (0..total).collect();
        let mut rng = Rng::new(&[me as u64, round as u64]);
        for i in (1..total).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut places: Vec<Vec<usize>> = Vec::with_capacity(n);
        let mut at = step_rows;
        for s in 0..n {
            let mut p = perm[at..at + count(s, me)].to_vec();
            if round % 2 == 0 {
                p.sort_unstable();
            }
            at += count(s, me);
            places.push(p);
        }
        let landings: Vec<&[usize]> = places.iter().map(Vec::as_slice).collect();
        let sizes: Vec<usize> = (0..n).map(|to| 3 + (count(me, to) - usize::from(short(me, to))) * row).collect();
        let mut out = vec![0xeeu8; total * row];
        let mut wrong: Option<String> = None;
        let mut stepped = false;
        let mut arrived = Vec::new();
        comm.exchange(
            ExchangePlan::new(&sizes, &mut |to, buf| {
                buf[..3].copy_from_slice(&head(me, to));
                for (k, r) in buf[3..].chunks_exact_mut(row).enumerate() {
                    for (j, b) in r.iter_mut().enumerate() {
                        *b = cell(me, to, k, j);
                    }
                }
            })
            .land_rows(&mut out, 3, row, &landings)
            .between_steps(&mut |out| {
                for &p in &perm[..step_rows] {
                    out[p * row..][..row].fill(0x5a);
                }
                stepped = true;
                false
            })
            .receive_parts(&mut |from, part| {
                arrived.push(from);
                let (landed, bytes) = (part.landed(), part.bytes());
                if landed == short(from, me) || bytes.get(..3) != Some(&head(from, me)[..]) {
                    wrong.get_or_insert(format!(
                        "round {round}: from rank {from}, landed {landed}, {} bytes {:?}",
                        bytes.len(),
                        &bytes[..bytes.len().min(3)]
                    ));
                }
            }),
        )?;
        if let Some(w) = wrong {
            bail!("in-place exchange with landing rows: {w}");
        }
        ensure!(stepped && arrived == (0..n).collect::<Vec<_>>(), "round {round}: step ran {stepped}, parts came from {arrived:?}");
        for &p in &perm[..step_rows] {
            ensure!(out[p * row..][..row].iter().all(|&b| b == 0x5a), "round {round}: a row step wrote was overwritten");
        }
        for (s, p) in places.iter().enumerate() {
            for (k, &r) in p.iter().enumerate() {
                let got = &out[r * row..][..row];
                let ok = if short(s, me) {
                    got.iter().all(|&b| b == 0xee)
                } else {
                    got.iter().enumerate().all(|(j, &b)| b == cell(s, me, k, j))
                };
                ensure!(ok, "round {round}: row {k} from rank {s} (output row {r}, short {}) holds {:?}", short(s, me), &got[..row.min(8)]);
            }
        }
    }
    let rows = [4usize];
    let bad: Vec<&[usize]> = (0..n).map(|_| &rows[..]).collect();
    let err = comm
        .exchange(ExchangePlan::new(&vec![8; n], &mut |_, _| {}).land_rows(&mut [0u8; 32], 0, 8, &bad))
        .expect_err("a landing beyond the output");
    ensure!(err.to_string().contains("output row 4"), "the error does not name the row: {err}");
    comm.barrier()?;
    Ok(())
}

fn collectives(world: &Comm) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    world.barrier()?;

    for root in 0..n {
        let mut data = if me == root { bytes_for(root, 0, 1000 + root) } else { vec![9; 3] };
        world.broadcast(root, &mut data)?;
        ensure!(data == bytes_for(root, 0, 1000 + root), "broadcast from {root} delivered wrong bytes");
    }

    let mine = bytes_for(me, 0, me * 5); // rank 0 sends nothing
    let all = world.allgatherv(&mine)?;
    for (r, got) in all.iter().enumerate() {
        ensure!(*got == bytes_for(r, 0, r * 5), "allgatherv: wrong bytes from rank {r}");
    }
    let flat = world.allgather_pod(&[me as u64 * 10, me as u64 * 10 + 1])?;
    let want: Vec<u64> = (0..n as u64).flat_map(|r| [r * 10, r * 10 + 1]).collect();
    ensure!(flat == want, "allgather: {flat:?} != {want:?}");
    if n > 1 {
        let err = world.allgather(&vec![0u8; 1 + me]).expect_err("unequal allgather must fail");
        ensure!(err.to_string().contains("passed"), "unequal allgather error does not say who passed what: {err}");
    }

    // alltoallv with sizes from zero to several MiB, so writes block midway.
    let size =
        |from: usize, to: usize| if (from + to) % 3 == 0 { 0 } else { (from * 7 + to * 3) * 1024 + if from == 1 { 6 << 20 } else { 0 } };
    let sends: Vec<Vec<u8>> = (0..n).map(|to| bytes_for(me, to, size(me, to))).collect();
    let refs: Vec<&[u8]> = sends.iter().map(Vec::as_slice).collect();
    let got = world.alltoallv(&refs)?;
    for (from, g) in got.iter().enumerate() {
        ensure!(*g == bytes_for(from, me, size(from, me)), "alltoallv: wrong {} bytes from rank {from}", g.len());
    }
    let three = [me as u32; 3];
    let typed = world.alltoallv_pod::<u32>(&vec![&three[..]; n])?;
    ensure!(typed.iter().enumerate().all(|(r, v)| v == &[r as u32; 3]), "alltoallv_pod: {typed:?}");
    in_place(world)?;
    in_place(&world.local())?;
    landing(world)?;
    landing(&world.local())?;

    // split: odd and even ranks, in reverse order.
    let sub = world.split((me % 2) as u32, (n - me) as u32)?;
    let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).rev().collect();
    ensure!(sub.world_ranks() == members.as_slice(), "split members {:?} != {members:?}", sub.world_ranks());
    let seen = sub.allgather_value(me as u32)?;
    ensure!(seen.iter().map(|&r| r as usize).eq(members.iter().copied()), "split allgather {seen:?}");

    // local and cross, from node identities.
    let nodes = world.nodes();
    let local = world.local();
    let want_local: Vec<usize> = (0..n).filter(|&r| nodes[r] == nodes[me]).collect();
    ensure!(local.world_ranks() == want_local.as_slice(), "local {:?} != {want_local:?}", local.world_ranks());
    let lr = local.rank();
    let cross = world.cross();
    let mut node_order = Vec::new();
    for nd in nodes {
        if !node_order.contains(&nd) {
            node_order.push(nd);
        }
    }
    let want_cross: Vec<usize> = node_order.iter().filter_map(|nd| (0..n).filter(|&r| &nodes[r] == *nd).nth(lr)).collect();
    ensure!(cross.world_ranks() == want_cross.as_slice(), "cross {:?} != {want_cross:?}", cross.world_ranks());
    ensure!(local.allgather_value(me as u64)?.len() == want_local.len(), "local allgather");
    cross.barrier()?;

    // Descriptors to every rank of the node.
    let path = std::env::temp_dir().join(format!("wm-test-fd.{}.{me}", std::process::id()));
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
    f.write_all(format!("from rank {me}").as_bytes())?;
    std::fs::remove_file(&path)?;
    for p in (0..local.size()).filter(|&p| p != lr) {
        local.send_fds(p, &[f.as_fd()])?;
    }
    for p in (0..local.size()).filter(|&p| p != lr) {
        let fd: OwnedFd = local.recv_fds(p, 1)?.pop().expect("one");
        let mut buf = vec![0u8; 64];
        let k = File::from(fd).read_at(&mut buf, 0)?;
        let want = format!("from rank {}", local.world_ranks()[p]);
        ensure!(&buf[..k] == want.as_bytes(), "descriptor from local rank {p} reads {:?}", String::from_utf8_lossy(&buf[..k]));
    }
    if local.size() < n {
        let other = (0..n).find(|r| nodes[*r] != nodes[me]).expect("another node");
        let err = world.send_fds(other, &[f.as_fd()]).expect_err("descriptors cannot cross nodes");
        ensure!(err.to_string().contains("different nodes"), "{err}");
    }

    // A mismatch is named on a sub-communicator; the world stays usable.
    // (MPI cannot detect a mismatch: its collectives would wait forever.)
    if world.backend() == "mpi" {
        println!("skip the mismatch check: the MPI backend cannot detect mismatched collectives");
    } else if n > 1 {
        let sub = world.split(0, me as u32)?;
        let err = if me == 0 { sub.barrier().err() } else { sub.allgatherv(b"x").err() };
        let err = err.context("mismatched collectives must fail")?;
        ensure!(err.to_string().contains("mismatch"), "{err}");
    }
    world.barrier()?;
    Ok(())
}

// ------------------------------------------------------------------ fill-read

/// The value at (row, col): depends on both, so a permuted column fails.
fn value(row: usize, col: usize) -> u32 {
    (row as u32).wrapping_mul(2_654_435_761) ^ (col as u32).wrapping_mul(40_503) ^ 0x5a5a_0000
}

fn partitions(rows: usize, n: usize, rng: &mut Rng) -> Vec<(&'static str, Option<Vec<usize>>)> {
    let mut uneven = vec![0usize; n];
    for _ in 0..rows {
        let r = rng.below(n as u64 * n as u64) as usize % n; // skewed, some may stay 0
        uneven[r] += 1;
    }
    let mut zero = vec![0usize; n];
    // Rank 0 and every other rank hold nothing; the rest split the rows.
    let holders: Vec<usize> = (0..n).filter(|r| n == 1 || (r % 2 == 1)).collect();
    for i in 0..rows {
        zero[holders[i % holders.len()]] += 1;
    }
    vec![("equal", None), ("uneven", Some(uneven)), ("zero-row", Some(zero))]
}

/// Why this kernel cannot build shared memory from huge pages
/// (`MADV_COLLAPSE` needs Linux 6.1 and transparent huge pages, and
/// `shmem_enabled=deny` refuses it), or `None` when it can.
fn no_shmem_collapse() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if version < (6, 1) {
        return Some(format!("kernel {} is older than 6.1 (no MADV_COLLAPSE)", release.trim()));
    }
    match std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled") {
        Err(_) => Some("this kernel has no transparent huge pages".into()),
        Ok(s) if s.contains("[deny]") => Some("shmem_enabled is deny".into()),
        Ok(_) => None,
    }
}

/// `huge-pages [off]`: continuous and chunked tables large enough to be laid
/// out in huge pages (over 16 of them per rank), rows of 516 bytes so rows
/// straddle every 2 MiB boundary, equal and uneven partitions: every rank
/// fills its rows and reads every row through the mapping, and a row is
/// written across a portion boundary. Unless `off` (`WM_HUGE_PAGES=off`)
/// or the kernel cannot, the table must be mapped at least partly with huge
/// pages (not wholly: free 2 MiB blocks may run out on a busy machine).
fn huge_pages(world: &Comm, rest: &[String]) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let cols = 129usize;
    let rows = n * ((34 << 20) / (cols * 4)) + 11;
    let off = rest.first().map(String::as_str) == Some("off");
    let why_not = if off { Some("WM_HUGE_PAGES=off".to_owned()) } else { no_shmem_collapse() };
    let mut skewed = vec![rows / (2 * n); n];
    skewed[n - 1] = rows - skewed.iter().take(n - 1).sum::<usize>();
    for ty in [MemoryType::Continuous, MemoryType::Chunked] {
        for part in [None, Some(skewed.clone())] {
            let ctx = || format!("{ty} rows={rows} cols={cols} partition={part:?}");
            let mut t = WholeTensor::<u32>::matrix(world, ty, Location::Host, rows, cols, part.as_deref()).with_context(ctx)?;
            fill_rows(&mut t, cols, value)?;
            world.barrier()?;
            let mut buf = vec![0u32; cols];
            for row in 0..rows {
                t.read_row(row, &mut buf).with_context(ctx)?;
                ensure!(
                    buf.iter().enumerate().all(|(c, &v)| v == value(row, c)),
                    "{}: rank {me} reads row {row} wrong: {:x?}",
                    ctx(),
                    &buf[..4]
                );
            }
            // A write by the last rank into the first row of rank 1's part.
            let row = t.memory().partition().offset(1.min(n - 1));
            let marker: Vec<u32> = (0..cols).map(|c| 0xbeef_0000 | c as u32).collect();
            world.barrier()?;
            if me == n - 1 {
                t.write_row(row, &marker)?;
            }
            world.barrier()?;
            t.read_row(row, &mut buf)?;
            ensure!(buf == marker, "{}: rank {me} does not see the write to row {row}", ctx());
            let huge = t.memory().huge_page_bytes();
            let mapped = t.memory().mapped_bytes();
            match &why_not {
                None => ensure!(huge > 0, "{}: rank {me} maps none of its {mapped} bytes with huge pages", ctx()),
                Some(why) => println!("{}: huge pages not required ({why}); {huge} of {mapped} bytes in huge pages", ctx()),
            }
            world.barrier()?;
            t.free()?;
        }
    }
    Ok(())
}

fn fill_read(world: &Comm, loc: Location) -> Result<()> {
    let me = world.rank();
    let mut rng = Rng(0x5eed + world.size() as u64);
    for ty in MemoryType::ALL {
        for cols in [1usize, 7, 128] {
            let rows = 2000 + rng.below(3000) as usize;
            for (pname, part) in partitions(rows, world.size(), &mut rng) {
                let ctx = || format!("{loc} {ty} rows={rows} cols={cols} partition={pname}");
                if let Some(reason) = query(world.as_ref(), ty, loc).reason() {
                    wm_tests::skip(world.as_ref(), ty, loc, &ctx(), reason).map_err(anyhow::Error::msg)?;
                    continue;
                }
                let mut t = WholeTensor::<u32>::matrix(world, ty, loc, rows, cols, part.as_deref()).with_context(ctx)?;
                let expect = part.clone().map_or_else(|| Partition::even(rows, world.size()), |p| Partition::from_counts(&p));
                ensure!(t.memory().partition() == &expect, "{}: partition {:?}", ctx(), t.memory().partition());
                fill_rows(&mut t, cols, value)?;
                world.barrier()?;
                let mut buf = vec![0u32; cols];
                let check: Box<dyn Iterator<Item = usize>> = if ty.is_mapped() { Box::new(0..rows) } else { Box::new(t.local_rows()) };
                for row in check {
                    t.read_row(row, &mut buf).with_context(ctx)?;
                    for (c, &v) in buf.iter().enumerate() {
                        ensure!(v == value(row, c), "{}: rank {me} reads {v:#x} at ({row}, {c}), expected {:#x}", ctx(), value(row, c));
                    }
                }
                if ty.is_mapped() {
                    // A write through the mapping lands in the owner's rows.
                    let row = rows - 1 - rows / 3;
                    let marker: Vec<u32> = (0..cols).map(|c| 0xdead_0000 | c as u32).collect();
                    world.barrier()?;
                    if me == 0 {
                        t.write_row(row, &marker)?;
                    }
                    world.barrier()?;
                    t.read_row(row, &mut buf)?;
                    ensure!(buf == marker, "{}: rank {me} does not see rank 0's write to row {row}: {buf:x?}", ctx());
                    if t.memory().partition().owner(row) == me && loc == Location::Host {
                        let off = (row - t.local_rows().start) * cols;
                        let mut own = vec![0u32; t.local_rows().len() * cols];
                        t.read_local(&mut own)?;
                        ensure!(own[off..off + cols] == marker[..], "{}: the owner's rows miss the write", ctx());
                    }
                } else if world.size() > 1 {
                    let foreign = t.memory().partition().range((me + 1) % world.size());
                    if let Some(row) = foreign.clone().next() {
                        let err = t.read_row(row, &mut buf).expect_err("foreign rows are not mapped");
                        ensure!(err.to_string().contains("not supported"), "{err}");
                    }
                }
                t.free().with_context(ctx)?;
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ two-nodes

fn two_nodes(world: &Comm) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    ensure!(n == 4, "two-nodes runs on 4 ranks posing as 2 nodes of 2");
    for ty in [MemoryType::Continuous, MemoryType::Chunked] {
        let s = query(world.as_ref(), ty, Location::Host);
        let reason = s.reason().context("mapped memory across nodes must be refused")?;
        ensure!(reason.contains("ranks 0 and 2 are on different nodes"), "{ty}: {reason}");
        let err = WholeTensor::<f32>::matrix(world, ty, Location::Host, 100, 4, None).expect_err("refused");
        ensure!(matches!(err, wholemem::Error::Unsupported { .. }) && err.to_string().contains("different nodes"), "{err}");
    }
    for ty in [MemoryType::Distributed, MemoryType::Hierarchy] {
        ensure!(query(world.as_ref(), ty, Location::Host).is_supported(), "{ty} must be supported across nodes");
        let mut t = WholeTensor::<u32>::matrix(world, ty, Location::Host, 1001, 7, None)?;
        let first = t.local_rows().start;
        let mut own = write_own_values(&mut t, 7)?;
        world.barrier()?;
        own.fill(0);
        t.read_local(&mut own)?;
        for (i, row) in own.chunks(7).enumerate() {
            ensure!(row.iter().enumerate().all(|(c, &v)| v == value(first + i, c)), "{ty}: local row {}", first + i);
        }
        if ty == MemoryType::Hierarchy {
            let local = t.memory().local_comm().context("hierarchy has a local communicator")?;
            let cross = t.memory().cross_comm().context("hierarchy has a cross communicator")?;
            let want_local = if me < 2 { [0, 1] } else { [2, 3] };
            let want_cross = if me % 2 == 0 { [0, 2] } else { [1, 3] };
            ensure!(local.world_ranks() == want_local, "local {:?}", local.world_ranks());
            ensure!(cross.world_ranks() == want_cross, "cross {:?}", cross.world_ranks());
            // Both talk: local over Unix sockets, cross over TCP.
            ensure!(local.allgather_value(me as u32)? == want_local.map(|r| r as u32), "local allgather");
            ensure!(cross.allgather_value(me as u32)? == want_cross.map(|r| r as u32), "cross allgather");
        } else {
            ensure!(t.memory().local_comm().is_none(), "only hierarchy carries local/cross communicators");
        }
        t.free()?;
    }
    Ok(())
}

// ------------------------------------------------------------------ bad-input

/// Writes this rank's rows of `t` (`cols` wide) with [`value`] of row and
/// column, and returns them.
fn write_own_values(t: &mut WholeTensor<u32>, cols: usize) -> Result<Vec<u32>> {
    let first = t.local_rows().start;
    let mut own = vec![0u32; t.local_rows().len() * cols];
    for (i, row) in own.chunks_mut(cols).enumerate() {
        row.iter_mut().enumerate().for_each(|(c, v)| *v = value(first + i, c));
    }
    t.write_local(&own)?;
    Ok(own)
}

fn expect_err<T>(what: &str, r: wholemem::Result<T>, needle: &str) -> Result<()> {
    match r {
        Ok(_) => bail!("{what}: allocation succeeded but must fail"),
        Err(e) => {
            let s = e.to_string();
            ensure!(s.contains(needle), "{what}: error {s:?} does not contain {needle:?}");
            println!("{what}: {s}");
            Ok(())
        }
    }
}

fn allocate_and_check(world: &Comm, ty: MemoryType) -> Result<()> {
    let mut t = WholeTensor::<u32>::matrix(world, ty, Location::Host, 333, 3, None)?;
    write_own_values(&mut t, 3)?;
    world.barrier()?;
    let mut buf = [0u32; 3];
    t.read_row(332, &mut buf).or_else(|e| if ty.is_mapped() { Err(e) } else { Ok(()) })?;
    if ty.is_mapped() {
        ensure!(buf == [value(332, 0), value(332, 1), value(332, 2)], "row 332 after a failed allocation");
    }
    t.free()?;
    Ok(())
}

fn bad_input(world: &Comm) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let req =
        |ty, total, granularity, partition: Option<Vec<usize>>| AllocRequest { ty, loc: Location::Host, total, granularity, partition };
    for ty in MemoryType::ALL {
        expect_err(
            "granularity not dividing",
            WholeMemory::allocate(world, &req(ty, 100, 12, None)),
            "granularity 12 does not divide the total size 100",
        )?;
        allocate_and_check(world, ty)?;
        expect_err("granularity 0", WholeMemory::allocate(world, &req(ty, 100, 0, None)), "granularity 0")?;
        // Sizes whose arithmetic would overflow are refused, not wrapped.
        let huge = usize::MAX / 64 * 64;
        expect_err(
            "a table past the address space",
            WholeMemory::allocate(world, &req(ty, huge, 64, None)),
            "larger than any address space",
        )?;
        expect_err(
            "rows × row size past usize::MAX",
            WholeTensor::<f64>::matrix(world, ty, Location::Host, usize::MAX / 2, 3, None),
            "more than usize::MAX bytes",
        )?;
        let part = if me == n - 1 { vec![10; n] } else { vec![9; n] };
        let pr = req(ty, 10 * n * 8, 8, Some(part));
        if n > 1 {
            expect_err("partitions differ", WholeMemory::allocate(world, &pr), &format!("rank 0 and rank {} differ in partition", n - 1))?;
            allocate_and_check(world, ty)?;
        }
        let mut part = vec![5; n];
        part[0] = 4;
        expect_err(
            "partition sum",
            WholeMemory::allocate(world, &req(ty, 5 * n * 8, 8, Some(part))),
            &format!("sums to {} rows, the table has {}", 5 * n - 1, 5 * n),
        )?;
        expect_err(
            "partition length",
            WholeMemory::allocate(world, &req(ty, 80, 8, Some(vec![10; n + 1]))),
            &format!("{} entries for {n} ranks", n + 1),
        )?;
        let gr = req(ty, 96, if me == 0 { 8 } else { 12 }, None);
        if n > 1 {
            expect_err("granularity differs", WholeMemory::allocate(world, &gr), "granularity: 8 vs 12")?;
        }
        // Without a GPU, device memory is refused with the query's reason.
        if let Some(reason) = query(world.as_ref(), ty, Location::Device).reason() {
            let dev = AllocRequest { loc: Location::Device, ..req(ty, 96, 8, None) };
            expect_err("device memory", WholeMemory::allocate(world, &dev), reason)?;
        }
        allocate_and_check(world, ty)?;
    }
    Ok(())
}

// ------------------------------------------------------------------ lose-peer

/// `lose-peer VICTIM kill|stop PIDDIR`: every rank runs collectives; the
/// victim dies by SIGKILL (or stops with SIGSTOP) while the others wait in an
/// allgather. The others must fail naming the victim, and fail again on the
/// next call.
fn lose_peer(world: &Comm, args: &[String]) -> Result<()> {
    let victim: usize = args.first().context("victim rank")?.parse()?;
    let how = args.get(1).map_or("kill", String::as_str);
    let piddir = args.get(2).context("pid directory")?;
    let me = world.rank();
    let local = world.local();
    for _ in 0..3 {
        world.barrier()?;
        local.barrier()?;
    }
    if me == victim {
        std::fs::write(format!("{piddir}/victim.pid"), std::process::id().to_string())?;
        std::thread::sleep(Duration::from_millis(300));
        let sig = if how == "stop" { libc::SIGSTOP } else { libc::SIGKILL };
        // SAFETY: raising a signal at this process has no memory effects.
        unsafe { libc::raise(sig) };
        std::thread::sleep(Duration::from_secs(600));
        bail!("the victim is still alive");
    }
    let start = Instant::now();
    let err = world.allgather_value(me as u64).expect_err("the victim never joins");
    let took = start.elapsed();
    println!("rank {me}: after {:.2} s: {err}", took.as_secs_f64());
    ensure!(err.blamed_rank() == Some(victim), "rank {me}: the error blames {:?}, not rank {victim}: {err}", err.blamed_rank());
    ensure!(err.to_string().contains(&format!("rank {victim}")), "the message does not name rank {victim}: {err}");
    let again = local.barrier().expect_err("every later call fails too");
    ensure!(again.blamed_rank() == Some(victim), "the next call blames {:?}: {again}", again.blamed_rank());
    println!("rank {me}: next call: {again}");
    if how == "stop" && me == (victim + 1) % world.size() {
        let pid: i32 = std::fs::read_to_string(format!("{piddir}/victim.pid"))?.trim().parse()?;
        // SAFETY: killing the stopped victim process, which the test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    Ok(())
}

// --------------------------------------------------------------------- gather

fn fvalue(row: usize, col: usize) -> f32 {
    row as f32 * 0.37 + col as f32 * 1.93 - 50.0
}

/// The bits of `v` in `d`, computed with the `half` crate directly, not
/// through the library.
fn bits_of(v: f32, d: wm_gather::DType) -> u64 {
    match d {
        wm_gather::DType::F32 => u64::from(v.to_bits()),
        wm_gather::DType::F16 => u64::from(half::f16::from_f32(v).to_bits()),
        wm_gather::DType::Bf16 => u64::from(half::bf16::from_f32(v).to_bits()),
        other => unreachable!("{other} is not tested here"),
    }
}

/// Element `i` of a buffer of `d`, as bits.
fn bits_at(buf: &[u8], d: wm_gather::DType, i: usize) -> u64 {
    let s = d.size();
    let mut b = [0u8; 8];
    b[..s].copy_from_slice(&buf[i * s..][..s]);
    u64::from_le_bytes(b)
}

/// `v` (exactly representable in `d` or not) stored as `d`, then widened
/// back to f32: what a scatter from a `d` buffer leaves in an f32 table.
fn through(v: f32, d: wm_gather::DType) -> f32 {
    match d {
        wm_gather::DType::F16 => half::f16::from_f32(v).to_f32(),
        wm_gather::DType::Bf16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn encode(vals: &[f32], d: wm_gather::DType) -> Vec<u8> {
    vals.iter().flat_map(|&v| bits_of(v, d).to_le_bytes()[..d.size()].to_vec()).collect()
}

fn gather_scatter(world: &Comm, loc: Location) -> Result<()> {
    use wm_gather::{DType, Error as GErr, Ids, RowLayout};
    let (me, n) = (world.rank(), world.size());
    // `rng` draws what every rank must agree on; `own` what is rank's own.
    let mut rng = Rng(0xfeed + n as u64);
    let mut own = Rng(0xbeef_0000 + me as u64);
    for ty in MemoryType::ALL {
        if let Some(reason) = query(world.as_ref(), ty, loc).reason() {
            wm_tests::skip(world.as_ref(), ty, loc, &format!("{loc} {ty}"), reason).map_err(anyhow::Error::msg)?;
            continue;
        }
        for wide_ids in [false, true] {
            for cols in [1usize, 7, 128, 129] {
                for out_dt in [DType::F32, DType::F16, DType::Bf16] {
                    let rows = 200 + rng.below(1300) as usize;
                    // A random partition in which some ranks own nothing.
                    let mut part = vec![0usize; n];
                    for _ in 0..rows {
                        let r = rng.below(n as u64 + 1) as usize;
                        part[r.min(n - 1) * usize::from(r != 0 || n == 1)] += 1;
                    }
                    let ctx =
                        format!("{loc} {ty} ids={} cols={cols} out={out_dt} partition={part:?}", if wide_ids { "i64" } else { "i32" });
                    let mut t = WholeTensor::<f32>::matrix(world, ty, loc, rows, cols, Some(&part)).context(ctx.clone())?;
                    fill_rows(&mut t, cols, fvalue)?;
                    world.barrier()?;
                    let layout = RowLayout::of(&t)?;
                    let call = |ids: &[i64], out: &mut [u8], d: DType, mem: &WholeMemory| {
                        let narrow: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
                        let ids = if wide_ids { Ids::I64(ids) } else { Ids::I32(&narrow) };
                        wm_gather::gather(mem, &layout, ids, out, d)
                    };

                    // Gather: every third rank asks for nothing; repeats are common.
                    let count = if me % 3 == 1 { 0 } else { own.below(2 * rows as u64) as usize + me };
                    let ids: Vec<i64> = (0..count).map(|_| own.below(rows as u64) as i64).collect();
                    let mut out = vec![0u8; ids.len() * cols * out_dt.size()];
                    call(&ids, &mut out, out_dt, t.memory()).context(ctx.clone())?;
                    for (i, &id) in ids.iter().enumerate() {
                        for c in 0..cols {
                            let (got, want) = (bits_at(&out, out_dt, i * cols + c), bits_of(fvalue(id as usize, c), out_dt));
                            ensure!(got == want, "{ctx}: rank {me} out[{i}][{c}] for id {id} = {got:#x}, want {want:#x}");
                        }
                    }

                    // Mapped gathers are not collective: nobody scatters until all have read.
                    world.barrier()?;
                    // Scatter, then gather back: disjoint ids per rank, with repeats
                    // (the last occurrence wins), from a buffer of out_dt.
                    let mine: Vec<i64> = (0..rows).filter(|r| r % n == me).map(|r| r as i64).collect();
                    let sids: Vec<i64> = if mine.is_empty() || me % 3 == 2 {
                        Vec::new()
                    } else {
                        (0..mine.len() * 2).map(|_| mine[own.below(mine.len() as u64) as usize]).collect()
                    };
                    let vals: Vec<f32> = (0..sids.len() * cols).map(|k| (k as f32) * 0.75 + me as f32 * 1000.0).collect();
                    let narrow: Vec<i32> = sids.iter().map(|&x| x as i32).collect();
                    let ids_arg = if wide_ids { Ids::I64(&sids) } else { Ids::I32(&narrow) };
                    wm_gather::scatter(t.memory_mut(), &layout, ids_arg, &encode(&vals, out_dt), out_dt).context(ctx.clone())?;
                    world.barrier()?;
                    let mut back = vec![0u8; sids.len() * cols * 4];
                    call(&sids, &mut back, DType::F32, t.memory()).context(ctx.clone())?;
                    let mut last = std::collections::HashMap::new();
                    for (i, &id) in sids.iter().enumerate() {
                        last.insert(id, i);
                    }
                    for (i, &id) in sids.iter().enumerate() {
                        let src = last[&id];
                        for c in 0..cols {
                            let got = f32::from_bits(bits_at(&back, DType::F32, i * cols + c) as u32);
                            let want = through(vals[src * cols + c], out_dt);
                            ensure!(
                                got == want,
                                "{ctx}: rank {me} row {id} col {c} after scatter = {got}, want {want} (last occurrence {src})"
                            );
                        }
                    }

                    // Bad ids: out of range on the last rank, negative on rank 0.
                    let bad: Vec<i64> = if me == n - 1 {
                        vec![0, rows as i64]
                    } else if me == 0 {
                        vec![-3]
                    } else {
                        vec![1]
                    };
                    let mut out = vec![0u8; bad.len() * cols * out_dt.size()];
                    let r = call(&bad, &mut out, out_dt, t.memory());
                    let passed_bad = me == 0 || me == n - 1;
                    if ty.is_mapped() && !passed_bad {
                        r.context(ctx.clone())?;
                    } else {
                        let err = r.err().with_context(|| format!("{ctx}: bad ids must fail on rank {me}"))?;
                        let s = err.to_string();
                        let named = s.contains("id -3 at position 0 on rank 0")
                            || s.contains(&format!("id {rows} at position 1 on rank {}", n - 1));
                        ensure!(matches!(err, GErr::IndexOutOfRange { .. }) && named, "{ctx}: rank {me}: {s}");
                    }
                    let wrong = call(&[0], &mut vec![0u8; cols * 4], DType::I32, t.memory()).expect_err("float to int is refused");
                    ensure!(wrong.to_string().contains("cannot convert f32 to i32"), "{ctx}: {wrong}");
                    // The next call works, and still returns the scattered rows.
                    let mut again = vec![0u8; sids.len() * cols * 4];
                    call(&sids, &mut again, DType::F32, t.memory()).context(ctx.clone())?;
                    ensure!(again == back, "{ctx}: rank {me}: the call after the failures returned different rows");
                    t.free().context(ctx.clone())?;
                }
            }
        }
    }
    Ok(())
}

/// `gather_device` and `scatter_device` (ids and rows in device memory)
/// on every type of device memory: rows against the reference values over
/// batches that grow and shrink (the buffers a call keeps serve the smaller
/// ones, and grow for the larger), a rank with no ids; scatters with
/// repeats, where the last occurrence wins — for collective types the
/// highest rank's, over ids every rank writes; a bad id named by the device
/// check (on every rank of a collective call) with nothing written, and the
/// next call working; and the device phases recorded for `--profile`.
fn device_calls(world: &Comm) -> Result<()> {
    let me = world.rank();
    let loc = Location::Device;
    let mut own = Rng(0xd1ce_0000 + me as u64);
    for ty in MemoryType::ALL {
        if let Some(reason) = query(world.as_ref(), ty, loc).reason() {
            wm_tests::skip(world.as_ref(), ty, loc, &format!("device calls on {ty}"), reason).map_err(anyhow::Error::msg)?;
            continue;
        }
        let (rows, cols) = (3001usize, 24usize);
        let ctx = format!("device calls on {ty}");
        let mut t = WholeTensor::<f32>::matrix(world, ty, loc, rows, cols, None).context(ctx.clone())?;
        fill_rows(&mut t, cols, fvalue)?;
        world.barrier()?;
        let c = DeviceCase { world, ty, ctx: &ctx, rows, cols, layout: wm_gather::RowLayout::of(&t)? };
        c.gathers(&t, &mut own)?;
        world.barrier()?;
        let (written, back) = c.scatters(&mut t)?;
        world.barrier()?;
        c.bad_id(&mut t, &written)?;
        world.barrier()?;
        let again = c.gather(&t, &written).context(ctx.clone())?;
        ensure!(again == back, "{ctx}: rank {me}: the rows changed after the failed scatter, or the next call differs");
        t.free().context(ctx)?;
    }
    Ok(())
}

/// One table of the `device-calls` scenario.
struct DeviceCase<'a> {
    world: &'a Comm,
    ty: MemoryType,
    ctx: &'a str,
    rows: usize,
    cols: usize,
    layout: wm_gather::RowLayout,
}

impl DeviceCase<'_> {
    /// `gather_device` of `ids` into device memory, brought back.
    fn gather(&self, t: &WholeTensor<f32>, ids: &[i64]) -> std::result::Result<Vec<f32>, wm_gather::Error> {
        use wholemem::device::DeviceBuffer;
        use wm_gather::device::{DeviceIds, gather_device};
        let cols = self.cols;
        let dev_ids = DeviceIds::upload(t.memory(), wm_gather::Ids::I64(ids))?;
        let mut out = DeviceBuffer::new(t.memory(), ids.len() * cols * 4)?;
        gather_device(t.memory(), &self.layout, &dev_ids, &mut out, wm_gather::DType::F32)?;
        let mut bytes = vec![0u8; ids.len() * cols * 4];
        out.download(&mut bytes)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Gathers: batches that grow and shrink; rank 1 asks for nothing once.
    /// The fourth batch is profiled.
    fn gathers(&self, t: &WholeTensor<f32>, own: &mut Rng) -> Result<()> {
        let (me, ctx, cols) = (self.world.rank(), self.ctx, self.cols);
        for (k, count) in [10usize, 2000, 7, 6000, 0, 300].into_iter().enumerate() {
            let count = if me == 1 && k == 1 { 0 } else { count };
            let ids: Vec<i64> = (0..count).map(|_| own.below(self.rows as u64) as i64).collect();
            if k == 3 {
                wm_gather::profile::record();
            }
            let rows_out = self.gather(t, &ids).with_context(|| format!("{ctx}: batch {k} of {count} ids"))?;
            if k == 3 {
                self.check_profile(&wm_gather::profile::take())?;
            }
            for (i, &id) in ids.iter().enumerate() {
                for c in 0..cols {
                    let (g, w) = (rows_out[i * cols + c], fvalue(id as usize, c));
                    ensure!(g.to_bits() == w.to_bits(), "{ctx}: batch {k}: rank {me} out[{i}][{c}] for id {id} = {g}, want {w}");
                }
            }
        }
        Ok(())
    }

    /// The phases one profiled call recorded.
    fn check_profile(&self, p: &wm_gather::profile::Profile) -> Result<()> {
        let (me, ctx) = (self.world.rank(), self.ctx);
        let names: Vec<&str> = p.phases.iter().map(|(n, _)| *n).collect();
        ensure!(p.calls == 1 && names.contains(&"checks"), "{ctx}: rank {me} recorded {p:?}");
        // The device phases, timed with CUDA events: the row kernel of a mapped
        // table, the owners' kernel of the peer exchange (when it runs).
        let gpu =
            if self.ty.is_mapped() { Some("gpu rows") } else { names.iter().any(|n| n.starts_with("gpu")).then_some("gpu owner rows") };
        if let Some(phase) = gpu {
            ensure!(names.contains(&phase), "{ctx}: rank {me}'s profile lacks {phase:?}: {names:?}");
        }
        Ok(())
    }

    /// Scatters with repeats. Mapped memory is written by each rank alone
    /// (its rows r % n == me); collective memory by every rank, over the
    /// same rows, from seeds every rank knows. The rows written and what
    /// they hold afterwards.
    fn scatters(&self, t: &mut WholeTensor<f32>) -> Result<(Vec<i64>, Vec<f32>)> {
        use wholemem::device::DeviceBuffer;
        use wm_gather::device::{DeviceIds, scatter_device};
        let (me, n) = (self.world.rank(), self.world.size());
        let (ty, ctx, rows, cols) = (self.ty, self.ctx, self.rows, self.cols);
        let ids_of = |r: usize| -> Vec<i64> {
            let mut g = Rng(0x5ca7_0000 + r as u64);
            if ty.is_mapped() {
                let mine: Vec<i64> = (0..rows as i64).filter(|x| *x as usize % n == r).collect();
                (0..mine.len() * 2).map(|_| mine[g.below(mine.len() as u64) as usize]).collect()
            } else {
                (0..rows).map(|_| g.below(rows as u64 / 4) as i64 * 4).collect()
            }
        };
        let value = |r: usize, k: usize, c: usize| (r * 1_000_000 + k * 100 + c) as f32;
        let ids = ids_of(me);
        let src: Vec<f32> = (0..ids.len()).flat_map(|k| (0..cols).map(move |c| value(me, k, c))).collect();
        let dev_ids = DeviceIds::upload(t.memory(), wm_gather::Ids::I64(&ids))?;
        let mut dev_src = DeviceBuffer::new(t.memory(), src.len() * 4)?;
        dev_src.upload(bytemuck::cast_slice(&src))?;
        scatter_device(t.memory_mut(), &self.layout, &dev_ids, &dev_src, wm_gather::DType::F32).context(ctx.to_owned())?;
        self.world.barrier()?;
        let writers: Vec<usize> = if ty.is_mapped() { vec![me] } else { (0..n).collect() };
        let mut winner: Vec<Option<(usize, usize)>> = vec![None; rows];
        for &r in &writers {
            for (k, &id) in ids_of(r).iter().enumerate() {
                winner[id as usize] = Some((r, k));
            }
        }
        let written: Vec<i64> = (0..rows as i64).filter(|&id| winner[id as usize].is_some()).collect();
        let back = self.gather(t, &written).context(ctx.to_owned())?;
        for (i, &id) in written.iter().enumerate() {
            let (r, k) = winner[id as usize].expect("written");
            ensure!(
                (0..cols).all(|c| back[i * cols + c] == value(r, k, c)),
                "{ctx}: row {id} holds {} (rank {}, occurrence {}), want rank {r}'s occurrence {k}",
                back[i * cols],
                back[i * cols] as usize / 1_000_000,
                back[i * cols] as usize % 1_000_000 / 100
            );
        }
        Ok((written, back))
    }

    /// A bad id on rank 0, at position 1: named by the device check, nothing
    /// written (the rows keep the scattered values). (The other ranks
    /// scatter nothing: on mapped memory their calls would succeed and
    /// write.)
    fn bad_id(&self, t: &mut WholeTensor<f32>, written: &[i64]) -> Result<()> {
        use wholemem::device::DeviceBuffer;
        use wm_gather::device::{DeviceIds, scatter_device};
        let (me, ctx, cols) = (self.world.rank(), self.ctx, self.cols);
        let bad: Vec<i64> = if me == 0 { vec![written[0], -3, self.rows as i64] } else { vec![written[0]] };
        let bad_scatter: &[i64] = if me == 0 { &bad } else { &[] };
        let dev_bad = DeviceIds::upload(t.memory(), wm_gather::Ids::I64(bad_scatter))?;
        let junk = DeviceBuffer::new(t.memory(), bad.len() * cols * 4)?;
        let r = scatter_device(t.memory_mut(), &self.layout, &dev_bad, &junk, wm_gather::DType::F32);
        let r2 = self.gather(t, &bad);
        for r in [r.map(drop), r2.map(drop)] {
            if self.ty.is_mapped() && me != 0 {
                r.context(ctx.to_owned())?;
            } else {
                let e = r.err().with_context(|| format!("{ctx}: the bad id must fail on rank {me}"))?;
                ensure!(
                    matches!(e, wm_gather::Error::IndexOutOfRange { .. }) && e.to_string().contains("id -3 at position 1 on rank 0"),
                    "{ctx}: rank {me}: {e}"
                );
            }
        }
        Ok(())
    }
}

/// Every rank scatters whole rows of its own constant into the same rows of
/// mapped memory at the same time, many times: every row must end up whole
/// (one rank's constant throughout), never torn.
fn concurrent_scatter(world: &Comm) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let (rows, cols) = (8usize, 16384usize);
    for ty in [MemoryType::Continuous, MemoryType::Chunked] {
        let mut t = WholeTensor::<f32>::matrix(world, ty, Location::Host, rows, cols, None)?;
        let ids: Vec<i64> = (0..rows as i64).collect();
        let src = vec![(me + 1) as f32; rows * cols];
        let mut out = vec![0f32; rows * cols];
        for round in 0..60 {
            // Everyone starts together, so the writes overlap.
            world.barrier()?;
            wm_gather::scatter_from(&mut t, &ids, &src)?;
            world.barrier()?;
            wm_gather::gather_into(&t, &ids, &mut out)?;
            for (r, row) in out.chunks(cols).enumerate() {
                let first = row[0];
                ensure!(first >= 1.0 && first <= n as f32, "{ty}: row {r} holds {first}");
                ensure!(
                    row.iter().all(|&v| v == first),
                    "{ty} round {round}: row {r} is torn: starts with {first}, also holds {:?}",
                    row.iter().find(|&&v| v != first)
                );
            }
        }
        t.free()?;
    }
    Ok(())
}

/// Distributed and hierarchy scatters where every rank writes rows that
/// others write too — its own, lower ranks', higher ranks' — with repeats:
/// each row ends up as the highest writing rank's last occurrence, however
/// the owner schedules its own rows against the parts that arrive.
fn scatter_rank_order(world: &Comm) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let cols = 24usize;
    for ty in [MemoryType::Distributed, MemoryType::Hierarchy] {
        if let Some(reason) = query(world.as_ref(), ty, Location::Host).reason() {
            wm_tests::skip(world.as_ref(), ty, Location::Host, &format!("host {ty}"), reason).map_err(anyhow::Error::msg)?;
            continue;
        }
        for round in 0..4u64 {
            let rows = 300 + 97 * round as usize;
            let mut t = WholeTensor::<f32>::matrix(world, ty, Location::Host, rows, cols, None)?;
            // Every rank's ids, drawn from seeds every rank knows: a third
            // of the table, so most rows are written by several ranks.
            let ids_of = |r: usize| -> Vec<i64> {
                let mut g = Rng(0x5ca7_7e40 + 31 * round + r as u64);
                (0..rows).map(|_| g.below(rows as u64 / 3 + 1) as i64 * 3 % rows as i64).collect()
            };
            let value = |r: usize, k: usize, c: usize| (r * 1_000_000 + k * 100 + c) as f32;
            let ids = ids_of(me);
            let src: Vec<f32> = (0..ids.len()).flat_map(|k| (0..cols).map(move |c| value(me, k, c))).collect();
            world.barrier()?;
            wm_gather::scatter_from(&mut t, &ids, &src)?;
            world.barrier()?;
            // The winner of each row: the last occurrence of the highest rank.
            let mut winner: Vec<Option<(usize, usize)>> = vec![None; rows];
            for r in 0..n {
                for (k, &id) in ids_of(r).iter().enumerate() {
                    winner[id as usize] = Some((r, k));
                }
            }
            let all: Vec<i64> = (0..rows as i64).filter(|&id| winner[id as usize].is_some()).collect();
            let mut out = vec![0f32; all.len() * cols];
            wm_gather::gather_into(&t, &all, &mut out)?;
            for (&id, row) in all.iter().zip(out.chunks(cols)) {
                let (r, k) = winner[id as usize].expect("only written rows are read");
                ensure!(
                    (0..cols).all(|c| row[c] == value(r, k, c)),
                    "host {ty} round {round}: row {id} holds {} (rank {}, occurrence {}), want rank {r}'s occurrence {k}",
                    row[0],
                    row[0] as usize / 1_000_000,
                    row[0] as usize % 1_000_000 / 100
                );
            }
            t.free()?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- columns

/// A column's element of `row`: distinct per row, and never the filler.
fn column_value(row: usize) -> i64 {
    (row as i64) * 7919 + 13
}

/// `wm_gather::Column` on every host type, for `T` (`i64`, `i32`): rows
/// `stride` elements apart (a matrix of one column; the elements between
/// rows are -1), random partitions with zero-row ranks. Every row reads
/// back its value exactly where this rank maps it (every row of mapped
/// types, its own rows otherwise) and `None` elsewhere; runs come back
/// where one pointer reaches them and read right.
fn column_case<T: wm_gather::Element + TryFrom<i64> + Into<i64> + Sync>(
    world: &Comm,
    ty: MemoryType,
    stride: usize,
    rng: &mut Rng,
) -> Result<()> {
    use wholemem::TensorDesc;
    let (me, n) = (world.rank(), world.size());
    let rows = 50 + rng.below(400) as usize;
    let mut part = vec![0usize; n];
    for _ in 0..rows {
        let r = rng.below(n as u64 + 1) as usize;
        part[r.min(n - 1) * usize::from(r != 0 || n == 1)] += 1;
    }
    let ctx = format!("{ty} {} stride {stride} partition {part:?}", T::DTYPE);
    let desc = TensorDesc::matrix_with_stride(rows, 1, stride)?;
    let mut t = WholeTensor::<T>::allocate(world, ty, Location::Host, desc, Some(&part)).context(ctx.clone())?;
    let own = t.local_rows();
    let cast = |v: i64| T::try_from(v).map_err(|_| anyhow::anyhow!("{v} does not fit {}", T::DTYPE));
    let filler = cast(-1)?;
    let mut vals = Vec::with_capacity(own.len() * stride);
    for r in own.clone() {
        vals.push(cast(column_value(r))?);
        vals.extend(std::iter::repeat_n(filler, stride - 1));
    }
    t.memory_mut().write_rows(own.start, bytemuck::cast_slice(&vals))?;
    world.barrier()?;
    let col = wm_gather::Column::new(&t).context(ctx.clone())?;
    ensure!(col.rows() == rows, "{ctx}: the column has {} rows", col.rows());
    let reach = |r: usize| ty.is_mapped() || own.contains(&r);
    for r in 0..rows {
        let got = col.get(r).map(Into::into);
        let want = reach(r).then(|| column_value(r));
        ensure!(got == want && col.reaches(r) == reach(r), "{ctx}: rank {me} row {r} read {got:?}, want {want:?}");
    }
    ensure!(col.get(rows).is_none() && col.get(usize::MAX).is_none(), "{ctx}: a row past the end reads");
    // A prefetch is a hint: harmless for any row, mapped or not.
    for r in [0, rows / 2, rows - 1, rows, usize::MAX] {
        col.prefetch(r);
    }
    // Runs: random ranges, and each portion whole.
    let starts: Vec<usize> = (0..=n).map(|r| part[..r].iter().sum()).collect();
    let one_portion = |a: usize, b: usize| (0..n).any(|r| a >= starts[r] && b <= starts[r + 1]);
    let mut ranges: Vec<(usize, usize)> = (0..40)
        .map(|_| {
            let a = rng.below(rows as u64 + 1) as usize;
            (a, a + rng.below((rows - a) as u64 + 1) as usize)
        })
        .collect();
    ranges.extend((0..n).flat_map(|r| [(starts[r], starts[r + 1]), (starts[r], starts[r + 1] + 1)]));
    ranges.push((rows - 1, rows + 1));
    for (a, b) in ranges {
        let expect = a >= b
            || b <= rows
                && match ty {
                    MemoryType::Continuous => true,
                    MemoryType::Chunked => one_portion(a, b),
                    _ => a >= own.start && b <= own.end,
                };
        let run = col.run(a..b);
        ensure!(run.is_some() == expect, "{ctx}: rank {me} run {a}..{b}: {}", if expect { "refused" } else { "given" });
        if let Some(run) = run {
            ensure!(run.len() == b.saturating_sub(a), "{ctx}: run {a}..{b} of {} rows", run.len());
            let mut all: Vec<i64> = Vec::new();
            run.extend_into(&mut all, Into::into);
            let want: Vec<i64> = (a..b.max(a)).map(column_value).collect();
            ensure!(all == want, "{ctx}: rank {me} run {a}..{b} read {all:?}");
            ensure!((0..run.len()).all(|i| run.get(i).into() == want[i]), "{ctx}: rank {me} run {a}..{b} element by element");
        }
    }
    drop(col);
    world.barrier()?;
    t.free()?;
    Ok(())
}

fn columns(world: &Comm) -> Result<()> {
    let mut rng = Rng(0xc01 + world.size() as u64);
    for ty in MemoryType::ALL {
        if let Some(reason) = query(world.as_ref(), ty, Location::Host).reason() {
            println!("skip host {ty}: {reason}");
            continue;
        }
        for stride in [1, 3] {
            column_case::<i64>(world, ty, stride, &mut rng)?;
            column_case::<i32>(world, ty, stride, &mut rng)?;
        }
        // More than one element per row is refused, naming the count.
        let t = WholeTensor::<f32>::matrix(world, ty, Location::Host, 10, 2, None)?;
        let e = wm_gather::Column::new(&t).expect_err("a two-column table");
        ensure!(e.to_string().contains("2 per row"), "{ty}: the error does not name the elements per row: {e}");
        t.free()?;
    }
    Ok(())
}

// ------------------------------------------------------------ TCP congestion

/// The congestion control this rank's TCP connections report is `rest[0]`
/// (`none`: it has none, all its peers are on its node), and collectives
/// work over them.
fn tcp_congestion(world: &Comm, rest: &[String]) -> Result<()> {
    let want = rest.first().context("tcp-congestion needs the expected algorithm, or none")?;
    let got = wm_comm::tcp::in_use();
    ensure!(got.unwrap_or("none") == want, "rank {}: TCP connections use {got:?}, expected {want}", world.rank());
    collectives(world)
}

// ----------------------------------------------------------- mismatched-calls

/// Gathers and scatters where rank 0 passes another output or source type,
/// or other columns, than the others. An owner reads and converts rows by
/// its own call, so rows of another type of the same width (f16 and bf16),
/// or other columns, would arrive as rows: every rank must fail naming the
/// two calls, and the next call, alike on every rank, works.
fn mismatched_calls(world: &Comm) -> Result<()> {
    use wm_gather::{DType, Ids, RowLayout};
    let (me, n) = (world.rank(), world.size());
    ensure!(n > 1, "mismatched calls need two ranks");
    let (rows, cols) = (100usize, 4usize);
    let ids: Vec<i64> = (0..rows as i64).rev().collect();
    for ty in [MemoryType::Distributed, MemoryType::Hierarchy] {
        if let Some(reason) = query(world.as_ref(), ty, Location::Host).reason() {
            wm_tests::skip(world.as_ref(), ty, Location::Host, &format!("host {ty}"), reason).map_err(anyhow::Error::msg)?;
            continue;
        }
        let mut t = WholeTensor::<f32>::matrix(world, ty, Location::Host, rows, cols, None)?;
        let whole = RowLayout::new(DType::F32, cols, 0)?;
        for case in ["f16 or bf16 out", "f32 or f16 out", "columns 0-1 or 2-3", "f16 or bf16 in", "columns 0-1 or 2-3 in"] {
            fill_rows(&mut t, cols, fvalue)?;
            world.barrier()?;
            let first = me == 0;
            let (d, layout) = match case {
                "f16 or bf16 out" | "f16 or bf16 in" => (if first { DType::F16 } else { DType::Bf16 }, whole),
                "f32 or f16 out" => (if first { DType::F32 } else { DType::F16 }, whole),
                _ => (DType::F32, RowLayout::new(DType::F32, 2, if first { 0 } else { 2 })?),
            };
            let bytes = rows * layout.cols() * d.size();
            let r = if case.ends_with(" in") {
                let src = encode(&vec![1.5; rows * layout.cols()], d);
                wm_gather::scatter(t.memory_mut(), &layout, Ids::I64(&ids), &src, d)
            } else {
                wm_gather::gather(t.memory(), &layout, Ids::I64(&ids), &mut vec![0u8; bytes], d)
            };
            let e = r.err().with_context(|| format!("{ty}, {case}: rank {me}'s call succeeded"))?;
            let s = e.to_string();
            ensure!(s.contains("passed different calls"), "{ty}, {case}: rank {me}: {s}");
            println!("{ty}, {case}: rank {me}: {s}");
            // The next call, alike on every rank, works.
            fill_rows(&mut t, cols, fvalue)?;
            world.barrier()?;
            let mut out = vec![0u8; rows * cols * 2];
            wm_gather::gather(t.memory(), &whole, Ids::I64(&ids), &mut out, DType::Bf16)?;
            for (k, &id) in ids.iter().enumerate() {
                for c in 0..cols {
                    ensure!(
                        bits_at(&out, DType::Bf16, k * cols + c) == bits_of(fvalue(id as usize, c), DType::Bf16),
                        "{ty}, after {case}: row {id} column {c} on rank {me}"
                    );
                }
            }
        }
        t.free()?;
    }
    Ok(())
}
