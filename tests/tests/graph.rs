//! Graphs with real rank processes (`wm-test-graph`): CSR built from edge
//! lists equal to a reference computed in the test, stored and loaded into
//! every host type; uniform and weighted sampling checked by chi-square
//! tests with fixed seeds and significance; small and zero degrees; the
//! same samples on 1 and 3 ranks and with 1 and 4 threads; fanouts from 0
//! to past the degree, weighted and not, as a property run on every type
//! and id type; multi-hop blocks and `append_unique`; bad ids, edges and
//! partitions failing on every rank, then a good call working. 1–4 ranks
//! and 2 simulated nodes.

use wm_tests::World;

const GRAPH: &str = env!("CARGO_BIN_EXE_wm-test-graph");

fn tempdir(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("wm-test-graph.{}.{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).expect("a temporary directory");
    p
}

#[test]
fn built_graphs_equal_the_reference_and_survive_store_and_load() {
    for n in 1..=4 {
        let dir = tempdir(&format!("build{n}"));
        World::new(n).run_ok(GRAPH, &["build", dir.to_str().expect("utf-8")]);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
    let dir = tempdir("build-nodes");
    let report = World::new(4).nodes_of(2).run_ok(GRAPH, &["build", dir.to_str().expect("utf-8")]);
    std::fs::remove_dir_all(&dir).expect("cleanup");
    let out = wm_tests::transcript(&report);
    assert!(out.contains("skip host continuous: ranks 0 and 2 are on different nodes"), "{out}");
}

#[test]
fn sampling_is_uniform_and_weighted_sampling_follows_the_weights() {
    for n in [1, 2, 4] {
        let report = World::new(n).run_ok(GRAPH, &["uniform"]);
        assert!(wm_tests::transcript(&report).contains("uniform distributed: chi-square"));
        let report = World::new(n).run_ok(GRAPH, &["weighted"]);
        assert!(wm_tests::transcript(&report).contains("weighted hierarchy: chi-square"));
    }
    for scenario in ["uniform", "weighted"] {
        let report = World::new(4).nodes_of(2).run_ok(GRAPH, &[scenario]);
        assert!(wm_tests::transcript(&report).contains(&format!("{scenario} hierarchy: chi-square")));
    }
}

/// The digests rank 0 printed, one per line (per memory type and case).
fn digests(world: World) -> Vec<String> {
    let report = world.run_ok(GRAPH, &["digest"]);
    report.ranks[0].output.iter().filter(|l| l.starts_with("digest ")).cloned().collect()
}

#[test]
fn the_same_seed_gives_the_same_sample_on_any_rank_and_thread_count() {
    let one = digests(World::new(1).env("WM_THREADS", "1"));
    // Four cases on each of the four host types, all equal per case.
    assert_eq!(one.len(), 16, "{one:?}");
    let per_case: std::collections::HashSet<&String> = one.iter().collect();
    assert_eq!(per_case.len(), 4, "memory types disagree: {one:#?}");
    for world in [World::new(1).env("WM_THREADS", "4"), World::new(3).env("WM_THREADS", "1"), World::new(3).env("WM_THREADS", "4")] {
        let other = digests(world.clone());
        let other_set: std::collections::HashSet<&String> = other.iter().collect();
        assert_eq!(per_case, other_set, "{} ranks with {:?} differ", world.ranks, world.env);
    }
    let nodes = digests(World::new(4).nodes_of(2).env("WM_THREADS", "2"));
    let nodes_set: std::collections::HashSet<&String> = nodes.iter().collect();
    assert_eq!(per_case, nodes_set, "two simulated nodes differ");
}

#[test]
fn blocks_chain_and_append_unique_maps_every_neighbour() {
    for n in [1, 2, 3] {
        World::new(n).run_ok(GRAPH, &["blocks"]);
    }
    World::new(4).nodes_of(2).run_ok(GRAPH, &["blocks"]);
}

/// The node cache's preload ranks nodes by degree (issue 35): every rank
/// gets the reference's ranking, whatever the memory type and rank count.
#[test]
fn nodes_ranked_by_degree_equal_the_reference() {
    for n in [1, 3] {
        let report = World::new(n).run_ok(GRAPH, &["degree"]);
        assert!(wm_tests::transcript(&report).contains("degree distributed: the ranking equals"), "{}", wm_tests::transcript(&report));
    }
    World::new(4).nodes_of(2).run_ok(GRAPH, &["degree"]);
}

#[test]
fn bad_ids_and_edges_fail_on_every_rank_and_the_next_call_works() {
    for n in [1, 2, 4] {
        World::new(n).run_ok(GRAPH, &["bad-input"]);
    }
    World::new(4).nodes_of(2).run_ok(GRAPH, &["bad-input"]);
}

/// Issue 30, item 1: weighted sampling with fanout 0 underflowed (`k - 1`)
/// and panicked. A property run inside the ranks (256 cases each world):
/// fanouts 0 to 2 past the largest degree, weighted and not, on every table
/// type and both id types, against `sample_in_memory` on the reference CSR.
#[test]
fn weighted_fanout_zero_underflow_on_every_table_type() {
    for n in [1, 3] {
        let report = World::new(n).run_ok(GRAPH, &["fanout-property"]);
        let out = wm_tests::transcript(&report);
        assert!(out.contains("fanout property: 256 cases"), "{n} ranks:\n{out}");
        for ty in ["continuous", "chunked", "distributed", "hierarchy"] {
            for ids in ["I32", "I64"] {
                assert!(out.contains(&format!("host {ty} {ids}")), "{n} ranks: no {ty} {ids} graph in\n{out}");
            }
        }
    }
    let report = World::new(4).nodes_of(2).run_ok(GRAPH, &["fanout-property"]);
    let out = wm_tests::transcript(&report);
    assert!(out.contains("host hierarchy I64") && out.contains("host distributed I32"), "two nodes:\n{out}");
}

/// Issue 30, item 6: `wm_graph::load` summed the caller's node counts per
/// rank unchecked; counts past `usize::MAX` in all must be an error naming
/// them on every rank, then a good load works.
#[test]
fn load_partition_summed_unchecked_past_usize_max() {
    for n in [2, 3] {
        let dir = tempdir(&format!("partition{n}"));
        World::new(n).run_ok(GRAPH, &["load-partition", dir.to_str().expect("utf-8")]);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}

#[test]
fn offsets_files_below_zero_fail_on_every_rank() {
    let dir = tempdir("negative");
    World::new(2).run_ok(GRAPH, &["negative-offsets", dir.to_str().expect("utf-8")]);
    std::fs::remove_dir_all(&dir).expect("cleanup");
    let dir = tempdir("negative-nodes");
    World::new(4).nodes_of(2).run_ok(GRAPH, &["negative-offsets", dir.to_str().expect("utf-8")]);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
