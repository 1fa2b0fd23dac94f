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

/// A prefetch thread beside a training step gets one core of the rank's
/// `WM_THREADS`: with 2, its gathers started a helper that waited for the
/// step's core (GraphSAGE's prefetched gathers took 6× as long). The
/// gathering thread caps itself at one thread and checks that its gathers
/// use one, while the rank has two.
#[test]
fn a_prefetch_thread_capped_at_one_thread_gathers_on_one() {
    World::new(2).env("WM_TIMEOUT_S", "20").env("WM_THREADS", "2").run_ok(THREADS, &[]);
}
