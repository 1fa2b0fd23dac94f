//! Gather and scatter on every host type with real rank processes: ids i32
//! and i64 × widths 1, 7, 128, 129 × output f32, f16, bf16, random
//! partitions with zero-row ranks, repeated ids, ranks with no ids; results
//! compared with values computed by the test itself (the `half` crate for
//! rounding); out-of-range and negative ids fail on every rank of a
//! collective call and the next call works. `Column` reads every row this
//! rank maps (and no other) on every host type, strided rows included.

use wm_tests::World;

const RANK: &str = env!("CARGO_BIN_EXE_wm-test-rank");

#[test]
fn gather_and_scatter_every_type_on_1_to_4_ranks() {
    for n in 1..=4 {
        World::new(n).run_ok(RANK, &["gather"]);
    }
}

#[test]
fn distributed_and_hierarchy_across_simulated_nodes() {
    World::new(4).nodes_of(2).run_ok(RANK, &["gather"]);
    World::new(6).nodes_of(2).run_ok(RANK, &["gather"]);
    // Three ranks per node: rows that two local ranks ask for and the rank
    // that routes them does not are kept there for the fan-out.
    World::new(6).nodes_of(3).run_ok(RANK, &["gather"]);
    // A rank per node: every row from another node lands in the output
    // straight from the socket, the hierarchy's too.
    World::new(3).nodes_of(1).run_ok(RANK, &["gather"]);
}

#[test]
fn columns_read_every_row_this_rank_maps_and_nothing_else() {
    for n in 1..=3 {
        World::new(n).run_ok(RANK, &["column"]);
    }
    World::new(4).nodes_of(2).run_ok(RANK, &["column"]);
}

#[test]
fn concurrent_scatters_into_one_row_never_tear_it() {
    World::new(3).run_ok(RANK, &["concurrent-scatter"]);
}

#[test]
fn across_ranks_the_highest_rank_wins_a_scatter() {
    for n in 2..=4 {
        World::new(n).run_ok(RANK, &["scatter-rank-order"]);
    }
    World::new(4).nodes_of(2).run_ok(RANK, &["scatter-rank-order"]);
}

#[test]
fn ranks_passing_different_types_or_columns_fail_on_every_rank_naming_both_calls() {
    for n in 2..=3 {
        World::new(n).run_ok(RANK, &["mismatched-calls"]);
    }
    World::new(4).nodes_of(2).run_ok(RANK, &["mismatched-calls"]);
    World::new(3).nodes_of(1).run_ok(RANK, &["mismatched-calls"]);
}
