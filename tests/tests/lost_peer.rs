//! A rank that dies (SIGKILL) or stops (SIGSTOP) in the middle of a
//! collective: every other rank fails with an error naming it, never hangs,
//! and nothing of ours is left in /dev/shm (the harness checks after each run).

use std::time::Duration;

use wm_tests::World;

const RANK: &str = env!("CARGO_BIN_EXE_wm-test-rank");

fn scratch() -> String {
    let d = std::env::temp_dir().join(format!("wm-lost-peer.{}.{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(&d).unwrap();
    d.display().to_string()
}

fn check(world: World, victim: usize, how: &str, within: Duration) {
    let dir = scratch();
    let report = world.run(RANK, &["lose-peer", &victim.to_string(), how, &dir]);
    let _ = std::fs::remove_dir_all(&dir);
    let transcript = wm_tests::transcript(&report);
    for r in &report.ranks {
        if r.rank == victim {
            assert!(!r.status.success(), "the victim cannot succeed\n{transcript}");
        } else {
            assert!(r.status.success(), "rank {} did not report losing rank {victim}: {:?}\n{transcript}", r.rank, r.status);
            assert!(r.ended_after < within, "rank {} took {:?} (limit {within:?})\n{transcript}", r.rank, r.ended_after);
            assert!(!r.killed, "rank {} had to be killed\n{transcript}", r.rank);
        }
    }
}

#[test]
fn a_killed_rank_is_named_within_seconds_on_one_node() {
    // Well within the timeout: the close of the victim's sockets is enough.
    check(World::new(3).env("WM_TIMEOUT_S", "20"), 2, "kill", Duration::from_secs(15));
}

#[test]
fn a_killed_rank_is_named_across_simulated_nodes() {
    check(World::new(4).nodes_of(2).env("WM_TIMEOUT_S", "20"), 3, "kill", Duration::from_secs(15));
}

#[test]
fn a_stopped_rank_is_named_after_the_timeout() {
    // Nothing closes: only the timeout can tell.
    check(World::new(3).env("WM_TIMEOUT_S", "5"), 1, "stop", Duration::from_secs(30));
}
