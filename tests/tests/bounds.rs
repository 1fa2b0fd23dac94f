//! Bounded resources under a flood from another user: 2000 connections
//! that never prove the key, idle or dripping a byte a second, against
//! every TCP listener of a job — rank 0's rendezvous before the job has
//! met, then the table catalogue (the same port, kept) and every read
//! server once it has published. The job must still meet, publish, serve
//! an outside reader that holds the key, free the table (stopping its
//! servers) and exit — no descriptor exhaustion, no hang.
//!
//! The ranks run with at most 1024 descriptors, soft and hard (`prlimit`),
//! so raising the soft limit cannot help: 2000 connections per listener
//! are more than the process can hold, and only the gates' budget keeps
//! the job's own sockets and memfds available. The stranger runs as uid
//! 65534 (`wm-test-flood`, one thread, one process per wave); the test
//! needs root to start it so, and says SKIP otherwise.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use wm_tests::{Scratch, random_key, tcp_listeners_of};

const PROG: &str = env!("CARGO_BIN_EXE_wm-test-onesided");
const FLOOD: &str = env!("CARGO_BIN_EXE_wm-test-flood");
/// Connections per listener.
const FLOOD_N: &str = "2000";
/// The uid of the stranger.
const STRANGER: u32 = 65534;

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < Duration::from_secs(180), "waited three minutes for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a flood as the stranger and waits until every connection is
/// started.
fn flood(mode: &str, targets: &[String]) -> Child {
    let mut c = Command::new(wm_tests::relocated(FLOOD))
        .args([mode, FLOOD_N, "600"])
        .args(targets)
        .uid(STRANGER)
        .gid(STRANGER)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the flood starts");
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("issued"), "the flood did not start its connections: {line:?}");
    c
}

fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

fn finish(c: Child, what: &str) -> Output {
    let out = c.wait_with_output().unwrap();
    eprintln!("--- {what}: {:?}\n{}", out.status, wm_tests::output_text(&out));
    out
}

fn flooded_job(mode: &str) {
    if !wm_tests::running_as_root() {
        println!("SKIP a flood of {mode} connections from another user: needs root to run the stranger as uid {STRANGER}");
        return;
    }
    let dir = Scratch::new(&format!("flood-{mode}"));
    let port_file = dir.0.join("port");
    let key = random_key();
    let d = dir.0.to_string_lossy().into_owned();
    let env = [("WM_RENDEZVOUS_PORT_FILE", port_file.to_str().unwrap()), ("WM_JOB_KEY", key.as_str()), ("WM_TIMEOUT_S", "120")];
    if Command::new("prlimit").arg("--version").output().is_err() {
        println!("SKIP a flood of {mode} connections: needs prlimit (util-linux) to start the ranks with 1024 descriptors");
        return;
    }
    let prog = wm_tests::relocated(PROG);
    let args = ["--nofile=1024:1024", prog.as_str(), "job", d.as_str(), "flooded", "1", "socket", "distributed", "free"];
    let rank = |r: usize| wm_tests::rank_by_hand("prlimit", r, 2, "127.0.0.1:0", &env, &args).spawn().unwrap();

    // Wave 1: the rendezvous, before rank 1 arrives.
    let r0 = rank(0);
    wait_for("rank 0's port", || std::fs::read_to_string(&port_file).is_ok_and(|t| t.trim().parse::<u16>().is_ok()));
    let port: u16 = std::fs::read_to_string(&port_file).unwrap().trim().parse().unwrap();
    let wave1 = flood(mode, &[format!("127.0.0.1:{port}")]);
    let r1 = rank(1);

    // Wave 2: the catalogue (rank 0 keeps the rendezvous port) and every
    // read server, once the table is published.
    wait_for("the first publish", || dir.0.join("published-1").exists());
    let mut targets = vec![format!("127.0.0.1:{port}")];
    for pid in [r0.id(), r1.id()] {
        targets.extend(tcp_listeners_of(pid).into_iter().filter(|&p| p != port).map(|p| format!("127.0.0.1:{p}")));
    }
    assert!(targets.len() >= 3, "expected the catalogue and two read servers, found {targets:?}");
    let wave2 = flood(mode, &targets);

    // The reader that holds the key: joins through the flooded catalogue,
    // reads from the flooded servers, sees the table freed.
    let reader = wm_tests::outside_job(PROG, &key, "120", &["reader", d.as_str(), "flooded", "1", "socket", "free"]).spawn().unwrap();
    let reader = finish(reader, "the outside reader");
    if !reader.status.success() {
        std::fs::write(dir.0.join("done"), b"").unwrap();
    }
    // The ranks free the table (every server stops) and exit while both
    // floods still hold their connections.
    let outs = [finish(r0, "rank 0"), finish(r1, "rank 1")];
    stop(wave1);
    stop(wave2);
    assert!(reader.status.success(), "the outside reader failed under the flood:\n{}", wm_tests::output_text(&reader));
    for (r, o) in outs.iter().enumerate() {
        let said = wm_tests::output_text(o);
        assert!(o.status.success(), "rank {r} failed under the flood:\n{said}");
        assert!(!said.contains("Too many open files"), "rank {r} ran out of descriptors:\n{said}");
    }
    let said0 = wm_tests::output_text(&outs[0]);
    assert!(said0.contains("evicting the oldest unauthenticated connection"), "rank 0 never shed a stranger's connection:\n{said0}");
    assert!(wm_tests::shm_leftovers().is_empty(), "left in /dev/shm: {:?}", wm_tests::shm_leftovers());
}

#[test]
fn idle_connections_from_another_user_neither_stop_the_job_nor_exhaust_it() {
    flooded_job("idle");
}

#[test]
fn connections_dripping_a_byte_a_second_neither_stop_the_job_nor_exhaust_it() {
    flooded_job("drip");
}
