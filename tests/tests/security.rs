//! A job no stranger can join, peers that cannot crash a rank, and the right
//! rank named when one dies — all with real processes.
//!
//! Some tests start the ranks by hand (not through the launcher) so that a
//! stranger can act between rank 0 opening the rendezvous and the last rank
//! arriving: it connects without the key, with a wrong key, says nothing,
//! or sends garbage, at the rendezvous and at a rank's mesh listeners. The
//! job must still start and finish, and the ranks must say whom they
//! refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use wm_tests::{Scratch, World, random_key as key, tcp_listeners_of};

const SEC: &str = env!("CARGO_BIN_EXE_wm-test-security");

/// One rank started by hand.
fn rank(rank: usize, world: usize, rendezvous: &str, env: &[(&str, &str)], args: &[&str]) -> Child {
    wm_tests::rank_by_hand(wm_tests::relocated(SEC), rank, world, rendezvous, env, args).spawn().unwrap()
}

fn finish(c: Child, what: &str) -> Output {
    let out = c.wait_with_output().unwrap();
    eprintln!("--- {what}: {:?}\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < Duration::from_secs(60), "waited a minute for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// The abstract name of `pid`'s node-local listener, from /proc/net/unix —
/// where any user of the machine can read it.
fn unix_listener_of(pid: u32) -> Option<String> {
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    let prefix = format!("@wholemem.{pid}.");
    table.lines().filter_map(|l| l.split_whitespace().last()).find(|p| p.starts_with(&prefix)).map(|p| p[1..].to_owned())
}

/// What a stranger does with a connection.
#[derive(Debug, Clone, Copy)]
enum Stranger {
    /// Connects and says nothing, holding the connection open for `hold`.
    Silent,
    /// Sends bytes that are not the protocol.
    Garbage,
    /// Connects and leaves at once.
    Knock,
    /// Plays the handshake without the key: reads the challenge, answers
    /// with a made-up MAC, and reports whether it got anything back.
    NoKey,
}

/// Plays `how` on `s`; for `NoKey` returns whether the server answered
/// (it must not).
fn play<S: Read + Write>(mut s: S, how: Stranger, hold: Duration) -> bool {
    match how {
        Stranger::Silent => {
            thread::sleep(hold);
            false
        }
        Stranger::Garbage => {
            let _ = s.write_all(&[0x47u8; 300]);
            false
        }
        Stranger::Knock => false,
        Stranger::NoKey => {
            let mut hello = [0u8; 40];
            if s.read_exact(&mut hello).is_err() {
                return false;
            }
            assert_eq!(&hello[..8], b"WMAUTH01", "the listener does not speak the handshake");
            // Our challenge, a claim of rank 2 of 3 (mesh purpose), a MAC
            // made up without the key.
            let mut answer = [0u8; 112];
            answer[32] = 2;
            answer[40] = 2;
            answer[48] = 3;
            answer[80..].fill(0xab);
            let _ = s.write_all(&answer);
            let mut proof = [0u8; 1];
            matches!(s.read(&mut proof), Ok(n) if n > 0)
        }
    }
}

fn tcp_stranger(port: u16, how: Stranger, hold: Duration) -> thread::JoinHandle<bool> {
    thread::spawn(move || match TcpStream::connect(("127.0.0.1", port)) {
        Ok(s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(90)));
            play(s, how, hold)
        }
        Err(_) => false,
    })
}

fn unix_stranger(name: String, how: Stranger, hold: Duration) -> thread::JoinHandle<bool> {
    thread::spawn(move || {
        let addr = UnixAddr::from_abstract_name(name.as_bytes()).unwrap();
        match UnixStream::connect_addr(&addr) {
            Ok(s) => {
                let _ = s.set_read_timeout(Some(Duration::from_secs(90)));
                play(s, how, hold)
            }
            Err(_) => false,
        }
    })
}

/// Ranks 0 and 1 of 3 start and wait for rank 2; strangers and a process
/// with a wrong key try the rendezvous and rank 1's mesh listeners; then
/// the real rank 2 starts and the job must complete.
#[test]
fn strangers_and_wrong_keys_are_refused_and_the_job_completes() {
    let dir = Scratch::new("impostor");
    let port_file = dir.0.join("port");
    let port_env = port_file.to_str().unwrap();
    let key = key();
    let env = [("WM_RENDEZVOUS_PORT_FILE", port_env), ("WM_JOB_KEY", key.as_str())];
    let r0 = rank(0, 3, "127.0.0.1:0", &env, &["collectives"]);
    let r1 = rank(1, 3, "127.0.0.1:0", &env, &["collectives"]);
    wait_for("rank 0's port", || std::fs::read_to_string(&port_file).is_ok_and(|t| t.trim().parse::<u16>().is_ok()));
    let port: u16 = std::fs::read_to_string(&port_file).unwrap().trim().parse().unwrap();
    let r1_pid = r1.id();
    wait_for("rank 1's listeners", || unix_listener_of(r1_pid).is_some() && !tcp_listeners_of(r1_pid).is_empty());
    let r1_unix = unix_listener_of(r1_pid).unwrap();
    let r1_tcp = tcp_listeners_of(r1_pid);

    // At the rendezvous: strangers of every kind, all before rank 2.
    let hold = Duration::from_secs(3);
    let mut strangers = Vec::new();
    for how in [Stranger::Silent, Stranger::Garbage, Stranger::Knock, Stranger::NoKey, Stranger::Silent] {
        strangers.push((format!("rendezvous {how:?}"), tcp_stranger(port, how, hold)));
    }
    // A process that knows everything but the key.
    let wrong = key.chars().rev().collect::<String>();
    let impostor = rank(
        2,
        3,
        "127.0.0.1:0",
        &[("WM_RENDEZVOUS_PORT_FILE", port_env), ("WM_JOB_KEY", &wrong), ("WM_TIMEOUT_S", "4")],
        &["collectives"],
    );
    // At rank 1's mesh listeners (answered once rank 1 reaches the mesh).
    for how in [Stranger::Silent, Stranger::Garbage, Stranger::Knock, Stranger::NoKey] {
        strangers.push((format!("rank 1 unix {how:?}"), unix_stranger(r1_unix.clone(), how, Duration::from_secs(15))));
        for &p in &r1_tcp {
            strangers.push((format!("rank 1 tcp {how:?}"), tcp_stranger(p, how, Duration::from_secs(15))));
        }
    }
    let impostor = finish(impostor, "the process with a wrong key");
    assert!(!impostor.status.success(), "a process with a wrong key joined the job");
    let said = wm_tests::output_text(&impostor);
    assert!(said.contains("could not join rank 0") && said.contains("WM_JOB_KEY"), "{said}");

    // Now the real rank 2: the job must start and finish.
    let r2 = rank(2, 3, "127.0.0.1:0", &env, &["collectives"]);
    let outs = [finish(r0, "rank 0"), finish(r1, "rank 1"), finish(r2, "rank 2")];
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r} failed: {}", wm_tests::output_text(o));
    }
    for (what, s) in strangers {
        assert!(!s.join().unwrap(), "{what}: a stranger without the key got an answer to its handshake");
    }
    let log0 = wm_tests::output_text(&outs[0]);
    assert!(log0.contains("rank 0 refused a rendezvous connection"), "rank 0 did not report the strangers: {log0}");
    assert!(log0.contains("does not hold the job key"), "rank 0 did not report the wrong key: {log0}");
    let log1 = wm_tests::output_text(&outs[1]);
    assert!(log1.contains("rank 1 refused a connection from"), "rank 1 did not report the strangers at its mesh listeners: {log1}");
}

/// A process of another user cannot even start the handshake on a rank's
/// node-local socket: the rank checks `SO_PEERCRED` first.
#[test]
fn another_user_is_refused_on_node_local_sockets() {
    use std::os::unix::process::CommandExt;
    if !wm_tests::running_as_root() {
        println!("SKIP another_user_is_refused_on_node_local_sockets: needs root to run a process as another user");
        return;
    }
    let dir = Scratch::new("uid");
    let port_file = dir.0.join("port");
    let key = key();
    let env = [("WM_RENDEZVOUS_PORT_FILE", port_file.to_str().unwrap()), ("WM_JOB_KEY", key.as_str())];
    let r0 = rank(0, 3, "127.0.0.1:0", &env, &["collectives"]);
    let r1 = rank(1, 3, "127.0.0.1:0", &env, &["collectives"]);
    let r1_pid = r1.id();
    wait_for("rank 1's listener", || unix_listener_of(r1_pid).is_some());
    let name = unix_listener_of(r1_pid).unwrap();
    // Connects as uid 65534, says so on stdout, and reports what the rank
    // sent: nothing, it must close at once.
    let script = format!(
        "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.settimeout(90)\ns.connect('\\0{name}')\nprint('connected',flush=True)\nd=s.recv(1)\nsys.exit(0 if d==b'' else 3)\n"
    );
    let mut stranger =
        Command::new("python3").arg("-c").arg(script).uid(65534).gid(65534).stdout(Stdio::piped()).spawn().expect("python3 runs");
    // Rank 2 starts only once the stranger is in rank 1's queue: started
    // earlier, on a loaded machine the job can finish and close the
    // listener before the interpreter has even connected.
    let mut said = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stranger.stdout.take().unwrap()), &mut said).unwrap();
    assert_eq!(said.trim(), "connected", "the other user's process could not connect to rank 1's listener @{name}");
    let r2 = rank(2, 3, "127.0.0.1:0", &env, &["collectives"]);
    let outs = [finish(r0, "rank 0"), finish(r1, "rank 1"), finish(r2, "rank 2")];
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r} failed: {}", wm_tests::output_text(o));
    }
    let st = stranger.wait().unwrap();
    assert!(st.success(), "the other user's process was answered (status {st:?})");
    let log1 = wm_tests::output_text(&outs[1]);
    assert!(log1.contains("runs as uid 65534"), "rank 1 did not report the other user: {log1}");
}

#[test]
fn a_bare_host_port_rendezvous_without_a_key_is_refused_with_advice() {
    let r = rank(1, 2, "127.0.0.1:9", &[], &["collectives"]);
    let out = finish(r, "a rank without a key");
    assert!(!out.status.success());
    let said = wm_tests::output_text(&out);
    assert!(said.contains("needs a job key") && said.contains("WM_JOB_KEY") && said.contains("openssl rand -hex 32"), "{said}");
}

/// `dir:` rendezvous keeps the key in a mode-600 file of a directory only
/// its owner can write; a directory others can write is refused.
#[test]
fn a_rendezvous_directory_keeps_a_private_key_and_refuses_shared_directories() {
    let dir = Scratch::new("dirkey");
    let rv = format!("dir:{}", dir.0.display());
    let ranks: Vec<Child> = (0..2).map(|r| rank(r, 2, &rv, &[], &["collectives"])).collect();
    for (r, c) in ranks.into_iter().enumerate() {
        let o = finish(c, &format!("rank {r}"));
        assert!(o.status.success(), "rank {r}: {}", wm_tests::output_text(&o));
    }
    let key_file = dir.0.join("job.key");
    let meta = std::fs::metadata(&key_file).expect("the directory holds the job key");
    assert_eq!(meta.mode() & 0o777, 0o600, "job.key has mode {:o}", meta.mode() & 0o777);
    let leftovers: Vec<_> = std::fs::read_dir(&dir.0).unwrap().flatten().map(|e| e.file_name()).filter(|n| n != "job.key").collect();
    assert!(leftovers.is_empty(), "left in the rendezvous directory: {leftovers:?}");

    let shared = Scratch::new("shareddir");
    std::fs::set_permissions(&shared.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let rv = format!("dir:{}", shared.0.display());
    let o = finish(rank(0, 2, &rv, &[], &["collectives"]), "a rank in a shared directory");
    assert!(!o.status.success());
    let said = wm_tests::output_text(&o);
    assert!(said.contains("planted by another user") && said.contains("mode 777"), "{said}");
    assert!(!Path::new(&shared.0.join("job.key")).exists(), "a key was written into a directory others can write");
}

fn hostile(world: World, hostile: usize, kind: &str) {
    let report = world.env("WM_TIMEOUT_S", "30").run(SEC, &["hostile-frame", &hostile.to_string(), kind]);
    let transcript = wm_tests::transcript(&report);
    for r in &report.ranks {
        assert!(r.status.success(), "rank {} ({kind} from rank {hostile}): {:?}\n{transcript}", r.rank, r.status);
        assert!(!r.killed, "rank {} had to be killed\n{transcript}", r.rank);
        let blamed = format!("rank {hostile}");
        assert!(r.output.iter().any(|l| l.contains(&blamed)), "rank {} printed no error naming rank {hostile}\n{transcript}", r.rank);
    }
}

#[test]
fn a_frame_announcing_2_to_the_62_bytes_is_an_error_naming_its_sender_on_every_rank() {
    hostile(World::new(3), 1, "huge");
    hostile(World::new(4).nodes_of(2), 2, "huge");
}

/// Issue 32: a rank that holds the key declares a frame of 2^31 or 2^40
/// bytes (under a raised frame limit, so only the buffer's growth rule
/// stands between it and the victim's memory) and sends a megabyte of it:
/// the victim fails naming it, its peak memory grows by no more than the
/// per-connection cap, and the third rank is told.
#[test]
fn a_key_holder_declaring_2_to_the_31_or_40_bytes_costs_the_victim_at_most_its_connection_cap() {
    for declared in [1u64 << 31, 1 << 40] {
        let report =
            World::new(3).nodes_of(1).env("WM_MAX_FRAME_GIB", "2048").run(SEC, &["declared-length", "1", "0", &declared.to_string(), "3"]);
        let transcript = wm_tests::transcript(&report);
        assert!(report.success(), "a frame declaring {declared} bytes: {:?}\n{transcript}", report.failures());
        assert!(transcript.contains("peak memory grew by"), "{transcript}");
        assert!(transcript.contains("rank 0 reported that it lost rank 1"), "rank 2 was not told\n{transcript}");
    }
}

#[test]
fn garbled_frames_are_errors_naming_their_sender_on_every_rank() {
    for kind in ["garbage", "fds", "bogus-abort"] {
        hostile(World::new(3), 2, kind);
    }
    hostile(World::new(4).nodes_of(2), 1, "garbage");
}

/// A rank SIGKILLed in the middle of barriers, 20 times: every survivor
/// names it every time, never a survivor that reported the loss and left.
#[test]
fn a_rank_killed_during_barriers_is_named_by_every_survivor_twenty_times() {
    for i in 0..20usize {
        let victim = 1 + i % 3;
        let rounds = 2 + (i * 7) % 13;
        let world = if i % 2 == 0 { World::new(4) } else { World::new(4).nodes_of(2) };
        let report = world.env("WM_TIMEOUT_S", "20").run(SEC, &["barrier-loss", &victim.to_string(), &rounds.to_string()]);
        let transcript = wm_tests::transcript(&report);
        for r in &report.ranks {
            if r.rank == victim {
                assert!(!r.status.success(), "run {i}: the victim cannot succeed\n{transcript}");
            } else {
                assert!(r.status.success(), "run {i}: rank {} did not name rank {victim}: {:?}\n{transcript}", r.rank, r.status);
                assert!(!r.killed, "run {i}: rank {} had to be killed\n{transcript}", r.rank);
            }
        }
    }
}

/// Hands `path` to the stranger's uid (root only).
fn give_away(path: &Path) {
    std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
}

/// A rank record signed with `key` (as a rank of that job would write it).
fn signed_rank_record(key: &str, rank: usize, world: usize) -> Vec<u8> {
    let body = format!(
        r#"{{"rank":{rank},"world":{world},"node_id":"planted:node","hostname":"planted","node_overridden":false,"unix_name":"wholemem.1.00000000000000ff","tcp_addr":"127.0.0.1:9","nonce":7,"pid":1}}"#
    );
    wm_comm::JobKey::from_hex(key, "the test's key").unwrap().sign_record(wm_comm::trust::RecordKind::Rank, body.as_bytes())
}

/// Rank 0 of 2 alone in `dir`, with `key` and a short timeout: its output.
fn alone_in(dir: &Path, key: &str) -> String {
    let rv = format!("dir:{}", dir.display());
    let o = finish(rank(0, 2, &rv, &[("WM_JOB_KEY", key), ("WM_TIMEOUT_S", "3")], &["collectives"]), "rank 0 alone");
    assert!(!o.status.success(), "rank 0 started a job of two ranks alone");
    wm_tests::output_text(&o)
}

/// A directory others can write is refused even with `WM_JOB_KEY`; a
/// record with a bad signature or none is never used; a record of another
/// user is refused at once.
#[test]
fn planted_rendezvous_records_and_untrusted_directories_are_refused() {
    let key = key();
    let shared = Scratch::new("planted-shared");
    std::fs::set_permissions(&shared.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let said = alone_in(&shared.0, &key);
    assert!(said.contains("not trusted") && said.contains("mode 777"), "{said}");

    // Signed with another job's key, and not signed at all: refused, named
    // at the timeout.
    let dir = Scratch::new("planted-sig");
    std::fs::write(dir.0.join("rank-1.json"), signed_rank_record(&wm_tests::random_key(), 1, 2)).unwrap();
    let said = alone_in(&dir.0, &key);
    assert!(said.contains("rank-1.json is refused") && said.contains("signature does not verify"), "{said}");
    let plain = signed_rank_record(&key, 1, 2);
    std::fs::write(dir.0.join("rank-1.json"), &plain[wm_comm::trust::SIGNED_OVERHEAD..]).unwrap();
    let said = alone_in(&dir.0, &key);
    assert!(said.contains("rank-1.json is refused") && said.contains("not a signed record"), "{said}");

    if !wm_tests::running_as_root() {
        println!("SKIP the records and directories of another user: needs root to make files another uid owns");
        return;
    }
    // Correctly signed, but the file is another user's.
    std::fs::write(dir.0.join("rank-1.json"), signed_rank_record(&key, 1, 2)).unwrap();
    give_away(&dir.0.join("rank-1.json"));
    let said = alone_in(&dir.0, &key);
    assert!(said.contains("belongs to uid 65534"), "{said}");
    // A sticky directory everyone can write, of another user (/tmp's kind).
    let sticky = Scratch::new("planted-sticky");
    std::fs::set_permissions(&sticky.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    give_away(&sticky.0);
    let said = alone_in(&sticky.0, &key);
    assert!(said.contains("not trusted") && said.contains("belongs to uid 65534"), "{said}");
}

/// A table record planted where an outside reader looks: refused before
/// any field is used — in a directory others can write, of another user,
/// unsigned, or signed with another key.
#[test]
fn planted_table_records_are_refused_by_readers() {
    use wm_onesided::{Options, Reader, Rendezvous};
    let key = wm_comm::JobKey::from_hex(&key(), "the test's key").unwrap();
    let opts = Options { key: Some(key.clone()), join_timeout: Some(Duration::from_secs(1)), ..Options::default() };
    let body = br#"{"version":2,"name":"planted"}"#;
    let join = |dir: &Path| Reader::join(&Rendezvous::Dir(dir.to_owned()), "planted", &opts).map(|_| ()).unwrap_err().to_string();
    let dir = Scratch::new("planted-table");
    let file = dir.0.join("onesided-planted.json");
    std::fs::write(&file, body).unwrap();
    let e = join(&dir.0);
    assert!(e.contains("not a signed record"), "{e}");
    let other = wm_comm::JobKey::generate().unwrap();
    std::fs::write(&file, other.sign_record(wm_comm::trust::RecordKind::Table, body)).unwrap();
    let e = join(&dir.0);
    assert!(e.contains("signature does not verify") && e.contains("WM_JOB_KEY"), "{e}");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = join(&dir.0);
    assert!(e.contains("not trusted"), "{e}");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    if !wm_tests::running_as_root() {
        println!("SKIP a table record of another user: needs root to make a file another uid owns");
        return;
    }
    std::fs::write(&file, key.sign_record(wm_comm::trust::RecordKind::Table, body)).unwrap();
    give_away(&file);
    let e = join(&dir.0);
    assert!(e.contains("belongs to uid 65534"), "{e}");
}

/// `WM_JOB_KEY_FILE`: a symbolic link, a file others can read, and a file
/// of another user are refused, each named.
#[test]
fn key_files_that_are_links_readable_by_others_or_not_ours_are_refused() {
    let dir = Scratch::new("keyfile");
    let good = dir.0.join("key");
    std::fs::write(&good, format!("{}\n", key())).unwrap();
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
    let try_with = |path: &Path| {
        let o = finish(
            rank(1, 2, "127.0.0.1:9", &[("WM_JOB_KEY_FILE", path.to_str().unwrap()), ("WM_TIMEOUT_S", "2")], &["collectives"]),
            "a rank",
        );
        assert!(!o.status.success());
        wm_tests::output_text(&o)
    };
    // The good file is read (the rank then finds nobody at port 9).
    let said = try_with(&good);
    assert!(!said.contains("job key file"), "{said}");
    let link = dir.0.join("link");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let said = try_with(&link);
    assert!(said.contains("is a symbolic link"), "{said}");
    let open = dir.0.join("open");
    std::fs::copy(&good, &open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o640)).unwrap();
    let said = try_with(&open);
    assert!(said.contains("mode 640") && said.contains("chmod 600"), "{said}");
    if !wm_tests::running_as_root() {
        println!("SKIP a key file of another user: needs root to make a file another uid owns");
        return;
    }
    let theirs = dir.0.join("theirs");
    std::fs::copy(&good, &theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
    give_away(&theirs);
    let said = try_with(&theirs);
    assert!(said.contains("belongs to uid 65534"), "{said}");
}
