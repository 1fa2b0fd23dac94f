//! One-sided reads with real processes, for every transport this build
//! and machine offer: shm (ranks of one node), socket (forced, and across
//! simulated nodes), fabric with the tcp provider (feature `fabric`), MPI
//! RMA under `mpirun` (feature `mpi`; CI runs more in `.ci/run`).
//!
//! - every host type, 1–4 ranks, 2 simulated nodes, i32/i64 ids, repeats,
//!   zero-row ranks, conversions, bad ids then a good read;
//! - one rank reading while the others are busy in collectives of their
//!   own (no owner takes part);
//! - a reader outside the job (a separate process, no rank) joining
//!   through `dir:` and `host:port` rendezvous with the job's key (a wrong
//!   key refused), reading while the job writes then publishes, a
//!   fork/exec child joining on its own, and an error — no hang, no crash —
//!   after the job frees the table and after the job is SIGKILLed;
//! - tables served through a host mirror (as device tables are; here host
//!   tables forced through one): readers in and outside the job see the
//!   snapshot until `publish_from`, `publish` is refused, free is seen.
//!   `tests/tests/device.rs` runs the same scenario on device tables.
//! - a reader used in a forked child (no exec): refused with `Forked`
//!   naming `Reader::reopen()`, the parent's connections untouched, the
//!   reopened reader reading;
//! - a fake read server (a process of its own, holding the job's key)
//!   that answers a request with another request's answer — refused as
//!   `Malformed`, never taken for rows, the connection closed — or with an
//!   error answer, after which the reader reads on over the same
//!   connection.

use std::process::Command;
use std::thread;

use wm_tests::{Scratch, World, random_key as key};

const PROG: &str = env!("CARGO_BIN_EXE_wm-test-onesided");

#[test]
fn shm_reads_every_type_on_1_to_4_ranks() {
    for n in 1..=4 {
        World::new(n).run_ok(PROG, &["reads"]);
    }
}

#[test]
fn socket_reads_every_type_on_1_to_4_ranks() {
    for n in [1, 2, 4] {
        World::new(n).run_ok(PROG, &["reads", "socket"]);
    }
}

#[test]
fn shm_and_socket_across_two_simulated_nodes() {
    World::new(4).nodes_of(2).run_ok(PROG, &["reads"]);
    World::new(2).nodes_of(1).tcp().run_ok(PROG, &["reads"]);
}

#[test]
fn one_rank_reads_while_the_others_are_busy() {
    World::new(3).run_ok(PROG, &["busy"]);
    World::new(3).run_ok(PROG, &["busy", "socket"]);
    World::new(4).nodes_of(2).run_ok(PROG, &["busy"]);
}

#[test]
fn a_host_mirror_serves_snapshots_until_publish_from_on_1_to_4_ranks() {
    for n in 1..=4 {
        World::new(n).run_ok(PROG, &["mirror", "host"]);
    }
    World::new(2).run_ok(PROG, &["mirror", "host", "socket"]);
    World::new(4).nodes_of(2).run_ok(PROG, &["mirror", "host"]);
}

#[test]
fn an_outside_reader_reads_a_mirrored_table_and_sees_it_freed() {
    outside_with(World::new(2), "auto", "distributed", "free", true);
    outside_with(World::new(2).nodes_of(1).tcp(), "socket", "hierarchy", "free", true);
}

#[test]
fn a_reader_used_in_a_forked_child_is_refused_naming_reopen() {
    World::new(2).run_ok(PROG, &["fork"]);
    World::new(2).run_ok(PROG, &["fork", "socket"]);
    World::new(2).nodes_of(1).tcp().run_ok(PROG, &["fork"]);
}

/// A fake read server (`impostor MODE`) and a reader that joins it
/// (`impostor-reader MODE`), two processes meeting in a scratch
/// directory; both must succeed. Returns the reader's output.
fn against_impostor(mode: &str) -> String {
    let dir = Scratch::new(&format!("impostor-{mode}"));
    let d = dir.0.to_string_lossy().into_owned();
    let key = key();
    let start = |args: &[&str]| wm_tests::outside_job(PROG, &key, "60", args);
    let mut server = start(&["impostor", &d, mode]).spawn().unwrap();
    let reader = start(&["impostor-reader", &d, mode]).output().unwrap();
    if !reader.status.success() {
        // It may wait for a reader that will not come: its output so far.
        let _ = server.kill();
    }
    let server = server.wait_with_output().unwrap();
    let (r, s) = (wm_tests::output_text(&reader), wm_tests::output_text(&server));
    assert!(reader.status.success() && server.status.success(), "reader: {:?}\n{r}\nimpostor: {:?}\n{s}", reader.status, server.status);
    eprintln!("{r}{s}");
    r
}

#[test]
fn an_answer_to_another_request_is_an_error_never_rows() {
    let out = against_impostor("stale");
    assert!(out.contains("a stale answer: ") && out.contains("the connection is out of step"), "{out}");
}

#[test]
fn an_error_answer_leaves_the_connection_open_and_the_reader_reading() {
    let out = against_impostor("refuse");
    assert!(out.contains("an error answer: rank 0 failed: row 3 at position 0"), "{out}");
}

#[cfg(feature = "fabric")]
mod fabric {
    use super::*;

    fn tcp(w: World) -> World {
        w.env("FI_PROVIDER", "tcp").env("WM_FABRIC_PROVIDER", "tcp")
    }

    #[test]
    fn fabric_reads_every_type_on_1_to_4_ranks() {
        for n in [1, 2, 4] {
            tcp(World::new(n)).run_ok(PROG, &["reads", "fabric"]);
        }
        tcp(World::new(4).nodes_of(2)).run_ok(PROG, &["reads", "fabric"]);
    }

    #[test]
    fn fabric_is_chosen_across_nodes_when_a_provider_is_named() {
        tcp(World::new(4).nodes_of(2)).run_ok(PROG, &["reads"]);
        tcp(World::new(3)).run_ok(PROG, &["busy", "fabric"]);
    }

    #[test]
    fn fabric_reads_a_host_mirror() {
        tcp(World::new(2).nodes_of(1)).run_ok(PROG, &["mirror", "host", "fabric"]);
    }

    #[test]
    fn a_fabric_reader_used_in_a_forked_child_is_refused_naming_reopen() {
        tcp(World::new(2).nodes_of(1)).run_ok(PROG, &["fork", "fabric"]);
    }

    #[test]
    fn an_outside_fabric_reader_sees_publishes_and_a_killed_job() {
        outside(tcp(World::new(2).nodes_of(1)), "fabric", "distributed", "free");
        outside(tcp(World::new(2).nodes_of(1)), "fabric", "hierarchy", "hold");
    }
}

#[cfg(feature = "mpi")]
mod mpi_rma {
    use super::*;

    /// `mpirun` with the options a root CI container needs, or `None`
    /// (with a skip line) where there is no `mpirun`.
    fn mpirun() -> Option<Command> {
        if Command::new("mpirun").arg("--version").output().is_err() {
            println!("SKIP MPI RMA: no mpirun on this machine");
            return None;
        }
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe"]);
        Some(c)
    }

    fn ok(mut c: Command, what: &str) {
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {:?}\n{text}", out.status);
    }

    #[test]
    fn mpi_rma_reads_every_type_under_mpirun() {
        let prog = wm_tests::relocated(PROG);
        for np in ["2", "3"] {
            let Some(mut c) = mpirun() else { return };
            c.args(["-np", np, "-x", "WM_TIMEOUT_S=120", &prog, "reads", "mpi"]);
            ok(c, &format!("mpirun -np {np} reads mpi"));
        }
        let Some(mut c) = mpirun() else { return };
        c.args(["-np", "3", "-x", "WM_TIMEOUT_S=120", &prog, "busy", "mpi"]);
        ok(c, "mpirun -np 3 busy mpi");
        let Some(mut c) = mpirun() else { return };
        c.args(["-np", "2", "-x", "WM_TIMEOUT_S=120", &prog, "mirror", "host", "mpi"]);
        ok(c, "mpirun -np 2 mirror host mpi");
        // Two simulated nodes of two ranks (MPMD: each half its node id).
        let Some(mut c) = mpirun() else { return };
        c.args(["-np", "2", "-x", "WM_NODE_ID=node0", "-x", "WM_TIMEOUT_S=120", &prog, "reads", "mpi", ":"]);
        c.args(["-np", "2", "-x", "WM_NODE_ID=node1", "-x", "WM_TIMEOUT_S=120", &prog, "reads", "mpi"]);
        ok(c, "mpirun 2 nodes x 2 ranks reads mpi");
    }
}

/// A job publishing a table of type `ty` over `method`, and a reader
/// process outside it; `mode` is `free` (the job frees the table) or
/// `hold` (the reader SIGKILLs the job).
fn outside(world: World, method: &str, ty: &str, mode: &str) {
    outside_with(world, method, ty, mode, false);
}

/// [`outside`], the job's table served through a host mirror when
/// `mirrored` (published with `publish_from`).
fn outside_with(world: World, method: &str, ty: &str, mode: &str, mirrored: bool) {
    let dir = Scratch::new(&format!("{method}-{ty}-{mode}"));
    let key = key();
    let name = format!("outside-{ty}");
    let world_on_one_node = world.node_size.is_none();
    let world = world.env("WM_JOB_KEY", &key).env("WM_TIMEOUT_S", "60");
    let mut args: Vec<String> = ["job", &dir.0.to_string_lossy(), &name, "3", method, ty, mode].iter().map(|s| s.to_string()).collect();
    if mirrored {
        args.push("mirror".into());
    }
    let job = thread::spawn(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        world.run(PROG, &a)
    });
    let reader = wm_tests::outside_job(PROG, &key, "60", &["reader", &dir.0.to_string_lossy(), &name, "3", method, mode]).output().unwrap();
    let out = String::from_utf8_lossy(&reader.stdout).into_owned() + &String::from_utf8_lossy(&reader.stderr);
    if !reader.status.success() {
        // Let the job finish (it waits for the reader's files up to its
        // limits) so its output shows too.
        std::fs::write(dir.0.join("done"), b"").unwrap();
    }
    let report = job.join().unwrap();
    let transcript = wm_tests::transcript(&report);
    assert!(reader.status.success(), "the outside reader failed:\n{out}\njob:\n{transcript}");
    match mode {
        "free" => assert!(report.success(), "the job failed: {:?}\n{transcript}\nreader:\n{out}", report.failures()),
        _ => assert!(
            report.ranks.iter().all(|r| r.status.code().is_none()),
            "every rank should have been killed: {:?}\n{transcript}",
            report.failures()
        ),
    }
    assert!(out.contains("child reader read epoch 3"), "{out}");
    // Readers on the job's node map every owner's portion (auto picks
    // shared memory there), and none of those mappings can be made writable.
    if method == "auto" && world_on_one_node {
        assert!(!out.contains("\n0 portions mapped") && out.contains("portions mapped, none can be made writable"), "{out}");
    }
    eprintln!("{out}");
}

#[test]
fn an_outside_reader_on_the_node_reads_shm_and_sees_the_table_freed() {
    outside(World::new(2), "auto", "chunked", "free");
    outside(World::new(3), "auto", "distributed", "free");
}

#[test]
fn an_outside_reader_across_nodes_reads_sockets_through_host_port() {
    outside(World::new(2).nodes_of(1).tcp(), "auto", "hierarchy", "free");
    outside(World::new(2).tcp(), "socket", "continuous", "free");
}

#[test]
fn an_outside_reader_errors_after_the_job_is_killed() {
    outside(World::new(2), "auto", "distributed", "hold");
    outside(World::new(2).nodes_of(1).tcp(), "socket", "distributed", "hold");
}

#[test]
fn joining_a_table_nobody_published_is_an_error_not_a_hang() {
    let dir = Scratch::new("nothing");
    std::fs::write(dir.0.join("rendezvous"), format!("dir:{}", dir.0.display())).unwrap();
    let out = Command::new(wm_tests::relocated(PROG))
        .args(["child", &dir.0.to_string_lossy(), "absent", "1", "1"])
        .env("WM_JOB_KEY", key())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("no table \"absent\" is published"), "{text}");
}

/// A job of two ranks under `WM_WIRE=wire`, a relay process that holds no
/// key for the channel and plants a record pointing at itself (`relay
/// MODE`, signing it as the job would), and a reader
/// that joins that record and reads `runs` times. Returns (reader's,
/// relay's) output.
fn through_relay(wire: &str, mode: &str, runs: usize) -> (String, String) {
    let dir = Scratch::new(&format!("relay-{wire}-{mode}"));
    let d = dir.0.to_string_lossy().into_owned();
    let key = key();
    let name = "relayed-table";
    let world = World::new(2).env("WM_JOB_KEY", &key).env("WM_TIMEOUT_S", "60").env("WM_WIRE", wire);
    let args: Vec<String> = ["job", &d, name, "1", "socket", "distributed", "free"].iter().map(|s| s.to_string()).collect();
    let job = thread::spawn(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        world.run(PROG, &a)
    });
    let start = |args: &[&str]| {
        let mut c = wm_tests::outside_job(PROG, &key, "60", args);
        c.env("WM_WIRE", wire);
        c
    };
    // The relay gets no key for the channel: it has none to use. Records
    // are signed, so it gets the key to sign the one it plants (standing
    // for an attacker on the path who redirects the reader without one).
    let mut relay_cmd = start(&["relay", &d, name, mode]);
    relay_cmd.env_remove("WM_JOB_KEY").env("WM_TEST_RECORD_KEY", &key);
    let relay = relay_cmd.spawn().unwrap();
    let reader = start(&["relay-reader", &d, name, &runs.to_string()]).output().unwrap();
    if !reader.status.success() {
        for f in ["relay-done", "read-1", "done"] {
            std::fs::write(dir.0.join(f), b"").unwrap();
        }
    }
    let relay = relay.wait_with_output().unwrap();
    let report = job.join().unwrap();
    let (r, s) = (wm_tests::output_text(&reader), wm_tests::output_text(&relay));
    let transcript = wm_tests::transcript(&report);
    assert!(reader.status.success() && relay.status.success(), "reader:\n{r}\nrelay:\n{s}\njob:\n{transcript}");
    assert!(report.success(), "the job failed: {:?}\n{transcript}", report.failures());
    eprintln!("{r}{s}");
    (r, s)
}

/// The number after `label` in `text`.
fn count(text: &str, label: &str) -> usize {
    let at = text.find(label).unwrap_or_else(|| panic!("no {label:?} in {text}")) + label.len();
    text[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn a_relay_without_the_key_passes_rows_it_cannot_read() {
    let (r, s) = through_relay("aead", "clean", 20);
    assert!(r.contains("20 reads, 20 verified, 0 refused"), "{r}");
    assert_eq!(count(&s, "plain rows seen: "), 0, "under aead the relay saw rows in the clear: {s}");
    assert!(count(&s, "flips, ") > 200 * 24 * 4, "the relay captured too little: {s}");
    // Under mac the same relay sees them: the check above can see rows.
    let (r, s) = through_relay("mac", "clean", 5);
    assert!(r.contains("5 reads, 5 verified"), "{r}");
    assert!(count(&s, "plain rows seen: ") > 0, "{s}");
}

#[test]
fn a_relay_flipping_one_bit_per_connection_is_caught_every_time() {
    for (wire, runs) in [("aead", 1000), ("mac", 100)] {
        let (r, s) = through_relay(wire, "flip", runs);
        let (flips, refused) = (count(&s, "connections, "), count(&r, "verified, "));
        assert_eq!(flips, refused, "{wire}: {flips} bits flipped, {refused} reads refused\n{r}\n{s}");
        // Only the connection the reader joined on carries no flip.
        assert!(refused + 1 >= runs, "{wire}: {refused} of {runs} reads met a flipped bit\n{r}\n{s}");
        assert!(r.contains("authentication failed") && r.contains("0 wrong rows"), "{r}");
    }
}
