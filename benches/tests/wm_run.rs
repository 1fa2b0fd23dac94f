//! `wm-run` as a user runs it.

use std::process::Command;

const WM_RUN: &str = env!("CARGO_BIN_EXE_wm-run");

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
fn the_others_are_stopped_when_one_fails() {
    let start = std::time::Instant::now();
    let out = Command::new(WM_RUN)
        .args(["-n", "2", "--grace-s", "0.5", "--", "sh", "-c", "if [ $WM_RANK = 0 ]; then exit 3; else exec sleep 60; fi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(start.elapsed().as_secs() < 30);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 was killed by signal 9 (stopped by the launcher)"), "{err}");
}

#[test]
fn node_size_must_divide_the_ranks() {
    let out = Command::new(WM_RUN).args(["-n", "3", "--node-size", "2", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node-size 2 does not divide 3 ranks"));
}
