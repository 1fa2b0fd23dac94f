//! Two threads of every rank in collectives at once, each on its own
//! communicator, in real rank processes (`wm-test-threads`).

use wm_tests::World;

const THREADS: &str = env!("CARGO_BIN_EXE_wm-test-threads");

/// Each rank's two threads begin in opposite orders; with the connections
/// held for all of an operation's wait, both threads of every rank stood
/// still until the timeout (here 20 s) and the run failed naming it.
#[test]
fn two_threads_on_two_communicators_do_not_wait_on_each_other() {
    World::new(2).env("WM_TIMEOUT_S", "20").run_ok(THREADS, &[]);
    World::new(3).env("WM_TIMEOUT_S", "20").run_ok(THREADS, &[]);
}

/// The same across simulated nodes: TCP between them.
#[test]
fn two_threads_on_two_communicators_across_nodes() {
    World::new(2).nodes_of(1).env("WM_TIMEOUT_S", "20").run_ok(THREADS, &[]);
}
