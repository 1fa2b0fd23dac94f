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

/// Issue 35: a cache filled before its first gather (the graph example
/// fills it with the nodes of the highest degree) serves what it was
/// given, stays coherent, and refuses a bad id on every rank.
#[test]
fn a_preloaded_cache_serves_its_rows_fresh() {
    for world in [World::new(2).nodes_of(1), World::new(4).nodes_of(2), World::new(6).nodes_of(2)] {
        let dir = wm_tests::Scratch::new("cache-preload");
        let report = world.run_ok(CACHE, &["preload", dir.0.to_str().expect("a UTF-8 temp path")]);
        let out = wm_tests::transcript(&report);
        assert_eq!(out.matches("case preload ").count(), 4, "{out}");
    }
}

#[test]
fn bad_ratios_fail_on_every_rank_naming_the_value() {
    World::new(4).nodes_of(2).run_ok(CACHE, &["bad-ratio"]);
    World::new(6).nodes_of(2).run_ok(CACHE, &["bad-ratio"]);
    // One node: nothing to cache, said so.
    World::new(2).run_ok(CACHE, &["bad-ratio"]);
}

/// Issue 30, item 3: a write the cache was not told of — `wm_gather::scatter`,
/// `write_rows`, `write_local`, an in-place slice, `files::load`, or
/// `apply_gradients` of an embedding without a cache of its own — by a
/// rank of another node, between cached gathers and with no barrier
/// before the next one, left stale rows in every other node's cache.
#[test]
fn coherence_does_not_depend_on_the_caller() {
    for world in [World::new(4).nodes_of(2), World::new(6).nodes_of(2)] {
        let dir = wm_tests::Scratch::new("cache-coherence");
        let report = world.run_ok(CACHE, &["coherence", dir.0.to_str().expect("a UTF-8 temp path")]);
        let out = wm_tests::transcript(&report);
        // Both collective types, two ratios each; and the cache's own
        // writes keep what they did not write.
        assert_eq!(out.matches("case coherence ").count(), 4, "{out}");
        assert_eq!(out.matches("case own-writes ").count(), 2, "{out}");
    }
}

/// Issue 30, item 2: an operation of many ids given one bad id failed, but
/// a cached scatter or gather had emptied node caches (a gather only on
/// the ranks without the bad id, so the ranks of a node disagreed about
/// what their cache held). Every such operation — scatter, cached scatter,
/// invalidate, cached gather, loading files of the wrong shape,
/// `apply_gradients` — now changes nothing: not the table, not a cache.
#[test]
fn cache_invalidation_is_all_or_nothing() {
    for world in [World::new(4).nodes_of(2), World::new(6).nodes_of(2)] {
        let dir = wm_tests::Scratch::new("cache-all-or-nothing");
        let report = world.run_ok(CACHE, &["all-or-nothing", dir.0.to_str().expect("a UTF-8 temp path")]);
        let out = wm_tests::transcript(&report);
        assert_eq!(out.matches("case all-or-nothing ").count(), 2, "{out}");
    }
}

/// Issue 30, item 7: a node cache named its table by the address of this
/// rank's rows, so a table allocated where a freed one had been passed for
/// it and got the freed table's cached rows. A table is now named by an
/// allocation number that is never reused.
#[test]
fn table_id_is_not_a_pointer_value() {
    let report = World::new(4).nodes_of(2).run_ok(CACHE, &["reused-table"]);
    let out = wm_tests::transcript(&report);
    assert_eq!(out.matches("case reused-table ").count(), 2, "{out}");
}

/// What the caches' coherence rests on: every write path moves the write
/// generation of exactly the ranks whose rows it wrote — through the
/// mapping by another rank too — and a refused write moves none and writes
/// nothing (a run into rows this rank cannot reach no longer writes its
/// own part first). On one node (every host type) and on two.
#[test]
fn write_generations_count_every_write_to_a_ranks_rows() {
    for world in [World::new(3), World::new(4).nodes_of(2)] {
        let dir = wm_tests::Scratch::new("cache-generations");
        let report = world.run_ok(CACHE, &["generations", dir.0.to_str().expect("a UTF-8 temp path")]);
        let out = wm_tests::transcript(&report);
        assert!(out.contains("case generations distributed"), "{out}");
    }
}
