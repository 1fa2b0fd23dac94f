//! Collectives, split, local/cross and descriptor passing between real rank
//! processes of the socket backend.

use wm_tests::World;

const RANK: &str = env!("CARGO_BIN_EXE_wm-test-rank");

#[test]
fn collectives_on_one_node_for_1_to_4_ranks() {
    for n in 1..=4 {
        World::new(n).run_ok(RANK, &["collectives"]);
    }
}

#[test]
fn collectives_across_simulated_nodes_use_tcp_between_them() {
    World::new(4).nodes_of(2).run_ok(RANK, &["collectives"]);
    World::new(3).nodes_of(1).run_ok(RANK, &["collectives"]);
}

#[test]
fn tcp_rendezvous_works_like_the_directory() {
    World::new(3).tcp().run_ok(RANK, &["collectives"]);
    World::new(4).tcp().nodes_of(2).run_ok(RANK, &["collectives"]);
}
