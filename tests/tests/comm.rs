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

/// The host's default congestion control, as a fresh connection gets it.
fn host_congestion() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").expect("the host's congestion control").trim().to_owned()
}

#[test]
fn tcp_connections_get_the_congestion_control_asked_for() {
    // Reno is in every kernel and allowed to every process.
    World::new(4).nodes_of(2).env("WM_TCP_CONGESTION", "reno").run_ok(RANK, &["tcp-congestion", "reno"]);
    World::new(2).nodes_of(1).tcp().env("WM_TCP_CONGESTION", "system").run_ok(RANK, &["tcp-congestion", &host_congestion()]);
    // On one node there is no TCP connection to ask anything of.
    World::new(2).env("WM_TCP_CONGESTION", "reno").run_ok(RANK, &["tcp-congestion", "none"]);
    // By default the host's choice stands unless it paces (BBR).
    let host = host_congestion();
    if !host.starts_with("bbr") {
        World::new(2).nodes_of(1).run_ok(RANK, &["tcp-congestion", &host]);
    }
}

#[test]
fn a_congestion_control_the_host_refuses_is_an_error_at_start_naming_it() {
    for (value, why) in [("no such", "is not the name of a congestion control"), ("nosuchcc", "tcp_available_congestion_control")] {
        let report = World::new(2).nodes_of(1).env("WM_TCP_CONGESTION", value).run(RANK, &["collectives"]);
        assert!(!report.success(), "WM_TCP_CONGESTION={value:?} was accepted");
        let first = report.first_failure.expect("a rank failed on its own");
        let said = report.ranks[first].output.join("\n");
        assert!(said.contains(&format!("WM_TCP_CONGESTION={value:?}")) && said.contains(why), "rank {first} said: {said}");
    }
}
