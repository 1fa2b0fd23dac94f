//! The node cache of remote rows with real rank processes, on 2 and 3
//! simulated nodes of 2 ranks: cached gathers equal uncached ones and the
//! test's own model of the table, for distributed and hierarchy tables,
//! f32 and bf16, ratios 0.01, 0.1, 0.5 and 1 (a cache larger than the
//! remote part), after scatters, invalidated writes, in-place writes and
//! optimizer steps by ranks of every node; bad ratios (0, negative, past
//! 1, NaN, differing between ranks) refused with the value named on every
//! rank, and the next call works.

use wm_tests::World;

const CACHE: &str = env!("CARGO_BIN_EXE_wm-test-cache");

#[test]
fn cached_gathers_equal_uncached_ones_on_2_and_3_nodes() {
    for world in [World::new(4).nodes_of(2), World::new(6).nodes_of(2)] {
        let report = world.run_ok(CACHE, &["node"]);
        let out = wm_tests::transcript(&report);
        // Every case ran: 2 types x (2 element types x 4 ratios + a column slice).
        assert_eq!(out.matches("case ").count(), 18, "{out}");
        assert!(out.contains("case hierarchy bf16 ratio 0.01"), "{out}");
    }
}

#[test]
fn embeddings_with_a_node_cache_train_and_read_like_without() {
    World::new(4).nodes_of(2).run_ok(CACHE, &["embedding"]);
    World::new(6).nodes_of(2).run_ok(CACHE, &["embedding"]);
}

#[test]
fn bad_ratios_fail_on_every_rank_naming_the_value() {
    World::new(4).nodes_of(2).run_ok(CACHE, &["bad-ratio"]);
    World::new(6).nodes_of(2).run_ok(CACHE, &["bad-ratio"]);
    // One node: nothing to cache, said so.
    World::new(2).run_ok(CACHE, &["bad-ratio"]);
}
