//! Peers that misbehave, with real rank processes: one that sends parts an
//! exchange cannot have produced (gather, scatter, hierarchy, gradients,
//! sampling) — every other rank fails with an error naming it, none panics
//! or hangs, and the next call works; and one that holds a row lock and
//! dies or stays stuck — the lock is taken over from the dead holder, and a live
//! one makes the wait end in a timeout error.

use wm_tests::World;

const PEER: &str = env!("CARGO_BIN_EXE_wm-test-peer");

fn scratch(name: &str) -> String {
    let d = std::env::temp_dir().join(format!("wm-hostile-peer.{name}.{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.display().to_string()
}

#[test]
fn malformed_exchange_parts_are_errors_naming_the_sender_on_every_rank() {
    for impostor in ["1", "0"] {
        World::new(3).env("WM_TIMEOUT_S", "60").run_ok(PEER, &["malformed", impostor]);
    }
    // A rank per node: the parts come over TCP, where rows land straight
    // in the output.
    World::new(3).nodes_of(1).env("WM_TIMEOUT_S", "60").run_ok(PEER, &["malformed", "1"]);
}

#[test]
fn a_misrouted_hierarchy_id_is_an_error_naming_the_sender_on_every_rank() {
    World::new(4).nodes_of(2).env("WM_TIMEOUT_S", "60").run_ok(PEER, &["malformed-hierarchy", "1"]);
}

#[test]
fn a_hierarchy_verdict_passed_on_within_a_node_names_its_sender_not_the_rank_that_passed_it() {
    World::new(4).nodes_of(2).env("WM_TIMEOUT_S", "60").run_ok(PEER, &["hierarchy-success-verdict", "1"]);
}

#[test]
fn malformed_gradients_are_errors_naming_the_sender_on_every_rank() {
    World::new(3).env("WM_TIMEOUT_S", "60").run_ok(PEER, &["malformed-gradients", "2"]);
}

/// Issue 30, item 6: a local node number a peer asked for was added to the
/// owner's first node before it was checked (an overflow past 2^64 - 1).
#[test]
fn a_sampling_peer_asking_past_2_pow_64_overflowed_the_owners_node_number() {
    for impostor in ["0", "2"] {
        World::new(3).env("WM_TIMEOUT_S", "60").run_ok(PEER, &["malformed-sample", impostor]);
    }
}

#[test]
fn a_row_lock_whose_holder_died_is_taken_over() {
    let dir = scratch("dies");
    let report = World::new(2).env("WM_TIMEOUT_S", "30").run(PEER, &["lock-holder", "dies", &dir]);
    let _ = std::fs::remove_dir_all(&dir);
    let transcript = wm_tests::transcript(&report);
    let (r0, r1) = (&report.ranks[0], &report.ranks[1]);
    assert!(r0.status.success(), "rank 0 must take the lock over: {:?}\n{transcript}", r0.status);
    assert!(!r1.status.success(), "rank 1 dies holding the lock\n{transcript}");
    assert!(!r0.killed, "rank 0 had to be killed\n{transcript}");
    assert!(transcript.contains("took the lock of row 5 from its dead holder"), "{transcript}");
}

#[test]
fn a_row_lock_held_by_a_live_process_times_out() {
    let dir = scratch("stuck");
    let report = World::new(2).env("WM_TIMEOUT_S", "2").run(PEER, &["lock-holder", "stuck", &dir]);
    let _ = std::fs::remove_dir_all(&dir);
    let transcript = wm_tests::transcript(&report);
    assert!(report.success(), "{:?}\n{transcript}", report.failures());
    assert!(transcript.contains("timed out after 2.0 s"), "{transcript}");
}

#[test]
fn a_malformed_reply_to_one_rank_fails_a_cached_gather_on_every_rank_naming_the_sender() {
    let report = World::new(4).nodes_of(2).env("WM_TIMEOUT_S", "10").run(PEER, &["malformed-cache", "3", "0"]);
    let transcript = wm_tests::transcript(&report);
    println!("{transcript}");
    assert!(report.success(), "{:?}\n{transcript}", report.failures());
}

#[test]
fn a_rank_that_announces_a_failed_cache_check_and_then_gathers_fails_the_call_on_every_rank() {
    let report = World::new(3).nodes_of(1).run(PEER, &["cache-false-refusal", "1"]);
    let transcript = wm_tests::transcript(&report);
    assert!(report.success(), "{:?}\n{transcript}", report.failures());
    assert_eq!(transcript.matches("sent malformed data: it announced a failed cache table check").count(), 2, "{transcript}");
}

#[test]
fn learning_rates_sent_differently_to_different_ranks_fail_every_rank_at_once() {
    World::new(3).env("WM_TIMEOUT_S", "60").run_ok(PEER, &["split-rates", "2"]);
}
