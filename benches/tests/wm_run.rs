//! `wm-run` as a user runs it, and as it must end: whatever its ranks start
//! and however they behave, it returns, with the right exit code, and
//! leaves no process behind.
//!
//! Every process a test starts carries `WM_TEST_MARKER=<unique>` in its
//! environment (ranks inherit it, and so do their children), so the test
//! finds what is left through `/proc/*/environ`. Nothing here is timed: a
//! 60 s watchdog only turns a hang into a failure (the commands sleep for
//! 600 s), and afterwards the marked processes get two seconds to vanish
//! from `/proc` once killed.

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const WM_RUN: &str = env!("CARGO_BIN_EXE_wm-run");
const WM_BENCH: &str = env!("CARGO_BIN_EXE_wm-bench");
const WATCHDOG: Duration = Duration::from_secs(60);

#[test]
fn all_ranks_succeeding_exits_zero() {
    let out = Command::new(WM_RUN).args(["-n", "3", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_failing_rank_makes_it_fail_and_is_named() {
    let out = Command::new(WM_RUN).args(["-n", "3", "--", "sh", "-c", "exit $WM_RANK"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 exited with status 1"), "{err}");
    assert!(err.contains("rank 2 exited with status 2"), "{err}");
    assert!(!err.contains("rank 0 "), "{err}");
}

#[test]
fn output_is_prefixed_and_the_environment_is_set() {
    let out = Command::new(WM_RUN)
        .args(["-n", "4", "--node-size", "2", "--", "sh", "-c", "echo $WM_RANK/$WM_WORLD_SIZE/$WM_NODE_ID/${WM_RENDEZVOUS%%:*}"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for r in 0..4 {
        let line = format!("[{r}] {r}/4/node{}/dir", r / 2);
        assert!(text.lines().any(|l| l == line), "missing {line:?} in {text}");
    }
}

#[test]
fn a_rank_can_print_an_untagged_last_line() {
    let out = Command::new(WM_RUN)
        .args([
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "echo hello; if [ $WM_RANK = 0 ]; then sleep 0.2; printf '%sresult=%s\\n' \"$WM_UNTAGGED\" 7; fi",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().last(), Some("result=7"), "{text}");
    assert!(text.lines().any(|l| l == "[1] hello") && !text.contains('\u{1}'), "{text}");
}

#[test]
fn output_that_is_not_utf8_is_kept_and_read_to_the_end() {
    // Invalid UTF-8 in the middle used to stop the output pump.
    let out = Command::new(WM_RUN).args(["-n", "1", "--", "sh", "-c", "printf 'a\\377b\\nlast\\n'"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[0] a\u{fffd}b\n[0] last\n"), "{text:?}");
}

#[test]
fn node_size_must_divide_the_ranks() {
    let out = Command::new(WM_RUN).args(["-n", "3", "--node-size", "2", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node-size 2 does not divide 3 ranks"));
}

#[test]
fn bad_grace_values_are_named_errors() {
    for (bad, why) in [("inf", "too large"), ("1e300", "too large"), ("-1", "too small"), ("NaN", "not a number"), ("soon", "not a number")]
    {
        let out = Command::new(WM_RUN).arg(format!("--grace-s={bad}")).args(["-n", "1", "--", "true"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(&format!("--grace-s=\"{bad}\" is {why}")) && !err.contains("panicked"), "{bad}: {err}");
    }
}

#[test]
fn bad_timeouts_are_named_errors_on_every_rank() {
    for (bad, why) in [("1e300", "too large"), ("inf", "too large"), ("NaN", "not a number"), ("ten", "not a number"), ("0", "too small")] {
        let out = Command::new(WM_RUN).args(["-n", "2", "--", WM_BENCH, "probe"]).env("WM_TIMEOUT_S", bad).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {err}");
        for r in 0..2 {
            let named = format!("[{r}] wm-bench: starting the communicator: bootstrap failed: WM_TIMEOUT_S=\"{bad}\" is {why}");
            assert!(err.contains(&named), "{bad}: no {named:?} in {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    }
}

// ---- Ending: nothing left behind ----

/// A unique marker for the processes of one test.
fn marker() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("wm-run-test.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst))
}

/// Live processes whose environment holds `WM_TEST_MARKER=marker`: pid and
/// command line. (A zombie's environment reads empty.)
fn marked(marker: &str) -> Vec<(u32, String)> {
    let needle = format!("WM_TEST_MARKER={marker}");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            found.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ").trim().to_owned()));
        }
    }
    found
}

fn kill_marked(marker: &str) {
    for (pid, _) in marked(marker) {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
}

/// Starts `program args` with the marker in its environment.
fn start(marker: &str, program: &str, args: &[&str]) -> Child {
    Command::new(program)
        .args(args)
        .env("WM_TEST_MARKER", marker)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` (within the watchdog), then checks that none of the
/// marked processes is left.
fn finish(marker: &str, child: Child, what: &str) -> Output {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(child.wait_with_output()));
    let out = match rx.recv_timeout(WATCHDOG) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let left = marked(marker);
            kill_marked(marker);
            panic!("{what}: did not return within {WATCHDOG:?}; running: {left:?}");
        }
    };
    assert_nothing_left(marker, what, &out);
    out
}

fn assert_nothing_left(marker: &str, what: &str, out: &Output) {
    let t = Instant::now();
    let mut left = marked(marker);
    while !left.is_empty() && t.elapsed() < Duration::from_secs(2) {
        thread::sleep(Duration::from_millis(20));
        left = marked(marker);
    }
    if !left.is_empty() {
        kill_marked(marker);
        panic!("{what}: left running {left:?}\n{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Runs `wm-run args…` to the end.
fn wm_run(args: &[&str]) -> Output {
    let m = marker();
    let what = format!("wm-run {args:?}");
    finish(&m, start(&m, WM_RUN, args), &what)
}

/// Waits (within the watchdog) until `n` marked processes whose command
/// line starts with `prefix` are running.
fn wait_for(marker: &str, prefix: &str, n: usize) {
    let t = Instant::now();
    while marked(marker).iter().filter(|(_, c)| c.starts_with(prefix)).count() < n {
        if t.elapsed() > WATCHDOG {
            kill_marked(marker);
            panic!("{n} processes {prefix:?} did not start: {:?}", marked(marker));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap().success());
}

#[test]
fn the_others_are_stopped_when_one_fails() {
    let out = wm_run(&["-n", "2", "--grace-s", "0.5", "--", "sh", "-c", "if [ $WM_RANK = 0 ]; then exit 3; else exec sleep 600; fi"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 was killed by signal 15 (SIGTERM) (stopped by the launcher)"), "{err}");
}

#[test]
fn a_rank_whose_child_holds_the_output_open_is_stopped_with_it() {
    // The case: `sleep` (a child of the rank's shell) keeps stdout
    // open; wm-run used to wait for it forever.
    let out = wm_run(&["-n", "2", "--grace-s", "0.5", "--", "sh", "-c", "if [ $WM_RANK = 0 ]; then exit 3; else sleep 600; fi"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

#[test]
fn background_grandchildren_are_stopped() {
    let out =
        wm_run(&["-n", "3", "--grace-s", "0.5", "--", "sh", "-c", "sleep 600 & sleep 600 & if [ $WM_RANK = 1 ]; then exit 4; fi; wait"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 exited with status 4"), "{err}");
}

#[test]
fn ranks_that_ignore_sigterm_are_killed() {
    // The shell and its children ignore SIGTERM (an ignored signal stays
    // ignored across fork and exec). Rank 0 fails once the others have set
    // their trap (each touches a file), so none can die of SIGTERM early.
    let ready = std::env::temp_dir().join(format!("{}.ready", marker()));
    std::fs::create_dir(&ready).unwrap();
    let script = format!(
        "trap '' TERM; if [ $WM_RANK = 0 ]; then until [ -e {d}/1 ] && [ -e {d}/2 ]; do sleep 0.01; done; exit 3; fi; \
         sleep 600 & touch {d}/$WM_RANK; sleep 600; wait",
        d = ready.display()
    );
    let out = wm_run(&["-n", "3", "--grace-s", "0.5", "--", "sh", "-c", &script]);
    let _ = std::fs::remove_dir_all(&ready);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for r in [1, 2] {
        assert!(err.contains(&format!("rank {r} was killed by signal 9 (SIGKILL) (stopped by the launcher)")), "{err}");
    }
}

#[test]
fn what_successful_ranks_leave_running_is_stopped() {
    // Exits 0 with a background job holding the output open, and one that
    // also ignores SIGTERM.
    let out = wm_run(&["-n", "2", "--", "sh", "-c", "sleep 600 & (trap '' TERM; exec sleep 600) & echo started"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[0] started") && text.contains("[1] started"), "{text}");
}

#[test]
fn a_process_that_left_its_group_does_not_keep_wm_run_waiting() {
    // `setsid` puts the sleep beyond wm-run's reach (a new session): wm-run
    // cannot stop it, but must not wait for the output pipe it holds.
    let m = marker();
    // The rank ends only once the sleep's shell runs in its new session
    // (it writes its pid), so wm-run's sweep cannot catch it earlier.
    let flag = std::env::temp_dir().join(format!("{m}.pid"));
    let script =
        format!("setsid sh -c 'echo $$ > {f}; exec sleep 600' & while [ ! -s {f} ]; do sleep 0.01; done; echo started", f = flag.display());
    let child = start(&m, WM_RUN, &["-n", "1", "--", "sh", "-c", &script]);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(child.wait_with_output()));
    let out = rx.recv_timeout(WATCHDOG);
    let escaped = marked(&m);
    kill_marked(&m);
    let _ = std::fs::remove_file(&flag);
    let out = out.expect("wm-run waited for the pipe a process outside its ranks' groups holds").unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("[0] started"), "{out:?}");
    assert!(!escaped.is_empty(), "the process in its own session should still run");
}

#[test]
fn a_signal_to_wm_run_stops_every_rank_group() {
    for (sig, code) in [("TERM", 143), ("INT", 130), ("HUP", 129)] {
        let m = marker();
        let child = start(&m, WM_RUN, &["-n", "2", "--grace-s", "0.5", "--", "sh", "-c", "sleep 600 & wait"]);
        wait_for(&m, "sleep 600", 2);
        signal(child.id(), sig);
        let out = finish(&m, child, &format!("wm-run after SIG{sig}"));
        assert_eq!(out.status.code(), Some(code), "SIG{sig}: {out:?}");
    }
}

#[test]
fn a_signal_to_wm_run_ends_ranks_that_ignore_it() {
    let m = marker();
    let child = start(&m, WM_RUN, &["-n", "2", "--grace-s", "0.5", "--", "sh", "-c", "trap '' TERM INT; sleep 600 & wait"]);
    wait_for(&m, "sleep 600", 2);
    signal(child.id(), "TERM");
    let out = finish(&m, child, "wm-run after SIGTERM, ranks ignoring it");
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("was killed by signal 9 (SIGKILL)"), "{out:?}");
}

#[test]
fn a_signal_to_wm_bench_stops_the_ranks_it_started() {
    let m = marker();
    let child =
        start(&m, WM_BENCH, &["gather", "--ranks", "2", "--rows", "20000", "--batch", "1024", "--warmup", "0", "--iters", "100000000"]);
    // The parent and its two ranks.
    wait_for(&m, WM_BENCH, 3);
    signal(child.id(), "TERM");
    let out = finish(&m, child, "wm-bench gather --ranks 2 after SIGTERM");
    assert_eq!(out.status.code(), Some(143), "{out:?}");
}
