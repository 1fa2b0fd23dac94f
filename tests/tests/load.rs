//! Loading tables from sharded NPY and raw files, and storing them back,
//! with real rank processes (the `wm-test-load` program): equal and uneven
//! shards, a shard spanning several ranks and a rank spanning several
//! shards, zero-row ranks and zero-row files, every host memory type and
//! element type; store → load round trips across partitions; every
//! malformed layout failing on every rank with an error that names the file
//! and the bad value, followed by a good load in the same processes.

use std::path::PathBuf;

use wm_tests::World;

const LOAD: &str = env!("CARGO_BIN_EXE_wm-test-load");

/// A fresh directory for one run's files, removed afterwards.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("wm-test-load.{}.{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("creating the scratch directory");
        Self(p)
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temp path")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn layouts_load_on_1_to_4_ranks() {
    for n in 1..=4 {
        let dir = Scratch::new(&format!("layouts-{n}"));
        World::new(n).run_ok(LOAD, &["layouts", dir.arg()]);
    }
}

/// Two simulated nodes: mapped types are skipped (with a line saying why),
/// distributed and hierarchy tables load and store across the nodes.
#[test]
fn load_and_store_across_simulated_nodes() {
    for scenario in ["layouts", "round-trip", "malformed"] {
        let dir = Scratch::new(&format!("{scenario}-nodes"));
        World::new(4).nodes_of(2).run_ok(LOAD, &[scenario, dir.arg()]);
    }
}

#[test]
fn store_then_load_round_trips_on_1_to_4_ranks() {
    for n in 1..=4 {
        let dir = Scratch::new(&format!("round-trip-{n}"));
        World::new(n).run_ok(LOAD, &["round-trip", dir.arg()]);
    }
}

#[test]
fn malformed_layouts_fail_on_every_rank_then_a_load_works() {
    for n in 1..=4 {
        let dir = Scratch::new(&format!("malformed-{n}"));
        World::new(n).run_ok(LOAD, &["malformed", dir.arg()]);
    }
}
