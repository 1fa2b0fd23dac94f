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
    // By default the host's choice stands unless it paces (BBR); then a
    // root process gets Cubic where the host has it.
    let host = host_congestion();
    if !host.starts_with("bbr") {
        World::new(2).nodes_of(1).run_ok(RANK, &["tcp-congestion", &host]);
    } else if wm_tests::running_as_root() && congestion_list("available").iter().any(|a| a == "cubic") {
        World::new(2).nodes_of(1).run_ok(RANK, &["tcp-congestion", "cubic"]);
    } else {
        println!("SKIP the default on a BBR host: this test runs unprivileged or the host has no Cubic");
    }
}

/// One of the host's lists of congestion controls (`available`:
/// what the kernel has; `allowed`: what an unprivileged process may choose).
fn congestion_list(which: &str) -> Vec<String> {
    let path = format!("/proc/sys/net/ipv4/tcp_{which}_congestion_control");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).split_whitespace().map(str::to_owned).collect()
}

/// Ranks of a 2-rank job started by hand, each on a simulated node of its
/// own, meeting at a TCP rendezvous whose port rank 0 publishes in a file.
struct ByHand {
    program: std::path::PathBuf,
    rendezvous: wm_tests::Scratch,
    key: String,
    /// Who the ranks run as (`None`: as this process).
    uid: Option<u32>,
    _bin: Option<wm_tests::Scratch>,
}

impl ByHand {
    const NOBODY: u32 = 65534;

    fn new() -> Self {
        let rendezvous = wm_tests::Scratch::new("by-hand-rv");
        Self { program: wm_tests::relocated(RANK).into(), rendezvous, key: wm_tests::random_key(), uid: None, _bin: None }
    }

    /// Ranks that run as uid and gid 65534 (`nobody`), which hold no
    /// capability: the port file lies in a directory of theirs, and the
    /// rank program is hard-linked (or copied) into a directory they can
    /// read, wherever the build tree is.
    fn unprivileged() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let bin = wm_tests::Scratch::new("unprivileged-bin");
        std::fs::set_permissions(&bin.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        let from = wm_tests::relocated(RANK);
        let program = bin.0.join("wm-test-rank");
        if std::fs::hard_link(&from, &program).is_err() {
            std::fs::copy(&from, &program).unwrap_or_else(|e| panic!("copying {from}: {e}"));
        }
        let job = Self::new();
        std::os::unix::fs::chown(&job.rendezvous.0, Some(Self::NOBODY), Some(Self::NOBODY)).unwrap();
        Self { program, uid: Some(Self::NOBODY), _bin: Some(bin), ..job }
    }

    fn port_file(&self) -> std::path::PathBuf {
        self.rendezvous.0.join("port")
    }

    /// Starts rank `rank` of 2.
    fn rank(&self, rank: usize, env: &[(&str, &str)], args: &[&str]) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut c = wm_tests::rank_by_hand(&self.program, rank, 2, "127.0.0.1:0", &[], args);
        c.env("WM_NODE_ID", format!("by-hand-node-{rank}"))
            .env("WM_RENDEZVOUS_PORT_FILE", self.port_file())
            .env("WM_JOB_KEY", &self.key)
            .envs(env.iter().copied());
        if let Some(uid) = self.uid {
            c.uid(uid).gid(uid);
        }
        c.spawn().unwrap_or_else(|e| panic!("starting {} (uid {:?}): {e}", self.program.display(), self.uid))
    }
}

/// A process without privileges may choose only what
/// `net.ipv4.tcp_allowed_congestion_control` lists: on a BBR host the
/// default gives it Cubic only where that list has it, else Reno; and a
/// name the host has but does not allow it is an error at its start,
/// naming the allowed list, on each rank alone — before it publishes a
/// port or waits for rank 0.
#[test]
fn an_unprivileged_process_chooses_only_what_the_host_allows() {
    if !wm_tests::running_as_root() {
        println!("SKIP an_unprivileged_process_chooses_only_what_the_host_allows: needs root to run ranks as another user");
        return;
    }
    let allowed = congestion_list("allowed");
    let host = host_congestion();
    let expected = match host.strip_prefix("bbr") {
        Some(_) if allowed.iter().any(|a| a == "cubic") => "cubic".to_owned(),
        Some(_) => "reno".to_owned(),
        None => host.clone(),
    };
    let job = ByHand::unprivileged();
    let ranks = [job.rank(0, &[], &["tcp-congestion", &expected]), job.rank(1, &[], &["tcp-congestion", &expected])];
    for (r, c) in ranks.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "unprivileged rank {r} (expected {expected} on a host of {host}, allowed {allowed:?}): {}",
            wm_tests::output_text(&o)
        );
    }
    assert!(wm_tests::shm_leftovers().is_empty(), "left in /dev/shm: {:?}", wm_tests::shm_leftovers());

    let Some(refused) = congestion_list("available").into_iter().find(|a| !allowed.contains(a)) else {
        println!("SKIP the refusal: this host allows every algorithm it has to every process ({allowed:?})");
        return;
    };
    for r in 0..2 {
        let o = job.rank(r, &[("WM_TCP_CONGESTION", &refused)], &["collectives"]).wait_with_output().unwrap();
        let text = wm_tests::output_text(&o);
        assert!(!o.status.success(), "unprivileged rank {r} was let choose {refused}: {text}");
        let want = format!(
            "WM_TCP_CONGESTION={refused:?}: this process may not choose it (unprivileged processes may choose: {}",
            allowed.join(" ")
        );
        assert!(text.contains(&want), "unprivileged rank {r}, alone, said: {text}");
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

/// A port file an earlier job left behind names a port that is no longer
/// the job's: here a listener of the test's own, which answers rank 1's
/// connection and hangs up, as whatever took the port over might. Rank 1
/// starts first and must still join once this job's rank 0 publishes its
/// own port over the file.
#[test]
fn a_port_file_left_by_an_earlier_job_does_not_keep_a_rank_out() {
    let job = ByHand::new();
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let old = squatter.local_addr().unwrap().port();
    std::fs::write(job.port_file(), format!("{old}\n")).unwrap();
    let r1 = job.rank(1, &[], &["collectives"]);
    // Rank 0 starts only once rank 1 has read the old port and called
    // there; the call is accepted and dropped at once.
    squatter.set_nonblocking(true).unwrap();
    let start = std::time::Instant::now();
    while squatter.accept().is_err() {
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "rank 1 never called at the old port {old}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(squatter);
    let r0 = job.rank(0, &[], &["collectives"]);
    for (r, c) in [(0, r0), (1, r1)] {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "rank {r} (the port file first held the old port {old}): {}", wm_tests::output_text(&o));
    }
    assert!(wm_tests::shm_leftovers().is_empty(), "left in /dev/shm: {:?}", wm_tests::shm_leftovers());
}
