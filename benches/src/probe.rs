//! `wm-bench probe`: this machine's topology (every node's, one record per
//! node) and the support matrix — which memory types and locations the
//! ranks support, with the reason when not; `--active` also allocates,
//! writes and reads back a small table of every supported combination.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory};
use wm_comm::Communicator;
use wm_gather::{DType, Ids, RowLayout};

use crate::report;
use crate::values;

/// The options of `wm-bench probe`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// Allocate, write and read back a small table of every supported combination, across the ranks.
    #[arg(long)]
    pub active: bool,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit non-zero unless each TYPE:LOCATION given (comma-separated) is supported (and, with --active, passes).
    #[arg(long, value_delimiter = ',')]
    pub require: Vec<String>,
}

/// One cell of the support matrix.
#[derive(Debug, serde::Serialize)]
struct Cell {
    #[serde(rename = "type")]
    ty: &'static str,
    location: &'static str,
    supported: bool,
    reason: Option<String>,
    /// With --active: "passed", or what failed.
    active: Option<String>,
}

fn parse_requirement(s: &str) -> Result<(MemoryType, Location)> {
    let (t, l) = s.split_once(':').with_context(|| format!("--require {s:?}: expected TYPE:LOCATION, e.g. chunked:host"))?;
    Ok((t.parse::<MemoryType>().map_err(anyhow::Error::msg)?, l.parse::<Location>().map_err(anyhow::Error::msg)?))
}

/// Runs `wm-bench probe` on every rank of the world this process belongs
/// to; rank 0 prints. Returns the exit code: 4 when a `--require`d
/// combination is not supported or an active check failed.
///
/// # Errors
/// A malformed `--require`, a communicator that cannot start, a lost peer.
pub fn run(a: &ProbeArgs) -> Result<i32> {
    let required: Vec<(MemoryType, Location)> = a.require.iter().map(|s| parse_requirement(s)).collect::<Result<_>>()?;
    let world = wm_comm::init().context("starting the communicator")?;
    let me = world.rank();
    let caps = wholemem::Capabilities::gather(world.as_ref())?;
    let records = caps.records();
    let mut cells = Vec::new();
    for ty in MemoryType::ALL {
        for loc in Location::ALL {
            let support = caps.query(ty, loc);
            // The allocator asks the node-level query; the two must agree.
            debug_assert!(support.is_supported() <= wholemem::query(world.as_ref(), ty, loc).is_supported());
            let active = if a.active && support.is_supported() { Some(try_combination(&world, ty, loc)) } else { None };
            cells.push(Cell {
                ty: ty.name(),
                location: loc.name(),
                supported: support.is_supported(),
                reason: support.reason().map(str::to_owned),
                active,
            });
        }
    }
    let passes = |c: &Cell| c.supported && c.active.as_deref().is_none_or(|r| r == "passed");
    let missing: Vec<String> = required
        .iter()
        .filter(|(t, l)| !cells.iter().any(|c| c.ty == t.name() && c.location == l.name() && passes(c)))
        .map(|(t, l)| format!("{t}:{l}"))
        .collect();
    if me == 0 {
        // One record per node.
        let mut nodes: Vec<&wm_topology::TopologyRecord> = Vec::new();
        for r in records {
            if !nodes.iter().any(|n| n.node_id == r.node_id) {
                nodes.push(r);
            }
        }
        if a.json {
            let j = serde_json::json!({ "ranks": world.size(), "nodes": nodes, "matrix": cells, "required_missing": missing });
            report::json_line(&j);
        } else {
            for n in &nodes {
                let ranks: Vec<usize> = records.iter().enumerate().filter(|(_, r)| r.node_id == n.node_id).map(|(i, _)| i).collect();
                println!(
                    "node {} (ranks {ranks:?}): {} package(s), {} cores, {} threads, {} NUMA node(s)",
                    n.hostname,
                    n.cpu.packages,
                    n.cpu.cores,
                    n.cpu.pus,
                    n.numa.len()
                );
                for nic in &n.nics {
                    println!("  nic {} {}", nic.name, nic.pci_bus_id.as_deref().unwrap_or("(virtual)"));
                }
                if n.gpus.is_empty() {
                    println!("  no GPUs: {}", n.gpu_note.as_deref().unwrap_or("none found"));
                }
                for g in &n.gpus {
                    println!(
                        "  gpu {} {} ({:.0} GiB) at {}, NUMA {:?}, {} NVLinks, nearest NIC {:?}",
                        g.index,
                        g.name,
                        g.memory_bytes as f64 / (1u64 << 30) as f64,
                        g.pci_bus_id,
                        g.numa_node,
                        g.nvlinks_active,
                        g.nearest_nic
                    );
                }
            }
            println!("{:<12} {:<7} answer", "type", "where");
            for c in &cells {
                let answer = match (&c.reason, &c.active) {
                    (Some(r), _) => format!("unsupported: {r}"),
                    (None, Some(r)) if r == "passed" => "supported, active check passed".to_owned(),
                    (None, Some(r)) => format!("supported, but the active check FAILED: {r}"),
                    (None, None) => "supported".to_owned(),
                };
                println!("{:<12} {:<7} {answer}", c.ty, c.location);
            }
            if !missing.is_empty() {
                println!("required but not passing: {}", missing.join(", "));
            }
        }
    }
    Ok(if missing.is_empty() && cells.iter().all(|c| c.active.as_deref().is_none_or(|r| r == "passed")) { 0 } else { 4 })
}

/// Allocates a small table of `ty` at `loc`, has every rank write its rows,
/// gathers every row on every rank and checks it; "passed" or what failed.
fn try_combination(world: &Arc<dyn Communicator>, ty: MemoryType, loc: Location) -> String {
    let (rows, dim) = (4099usize, 33usize);
    let run = || -> Result<()> {
        let req = AllocRequest { ty, loc, total: rows * dim * 4, granularity: dim * 4, partition: None };
        let mut mem = WholeMemory::allocate(world, &req)?;
        values::fill(&mut mem, dim, DType::F32)?;
        world.barrier()?;
        let ids: Vec<i64> = (0..rows as i64).collect();
        let mut out = vec![0u8; rows * dim * 4];
        wm_gather::gather(&mem, &RowLayout::new(DType::F32, dim, 0)?, Ids::I64(&ids), &mut out, DType::F32)?;
        let mut expect = vec![0u8; dim * 4];
        let wrong = (0..rows)
            .filter(|&r| {
                values::row(r, dim, DType::F32, DType::F32, &mut expect);
                out[r * dim * 4..][..dim * 4] != expect[..]
            })
            .count();
        mem.free()?;
        ensure!(wrong == 0, "{wrong} of {rows} rows read back wrong");
        Ok(())
    };
    let mine = run();
    // Every rank learns every rank's outcome.
    let msg = mine.as_ref().err().map(|e| format!("{e:#}")).unwrap_or_default();
    match world.allgatherv(msg.as_bytes()) {
        Ok(all) => match all.iter().enumerate().find(|(_, m)| !m.is_empty()) {
            None => "passed".to_owned(),
            Some((r, m)) => format!("rank {r}: {}", String::from_utf8_lossy(m)),
        },
        Err(e) => format!("{e}"),
    }
}
