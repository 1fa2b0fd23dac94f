//! The GPU check's step machinery (`scripts/gpu-steps.sh`), run here: no
//! step can hang the check, a timed-out step is named, every step's time is
//! printed, the budget of a whole part holds, and programs a step leaves
//! running are killed. (`scripts/gpu-check.sh` runs on a GPU machine; its
//! steps are these.)

use std::path::PathBuf;
use std::process::Command;

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts")
}

/// Runs `body` in bash after sourcing the step machinery; exit code and
/// everything it printed.
fn steps(body: &str) -> (i32, String) {
    let script = format!("set -u; . '{}/gpu-steps.sh'; {body}", scripts().display());
    let out = Command::new("bash").arg("-c").arg(&script).output().expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn a_step_past_its_limit_is_killed_and_named_as_timed_out() {
    let (code, out) = steps(
        r#"steps_begin 600
           f() { echo "f says $1"; }
           export -f f
           step "quick" 30 f hello
           step "sleeps past its limit" 1 sleep 600
           step "ignores SIGTERM" 1 bash -c 'trap "" TERM; sleep 600'
           step "fails" 30 false
           steps_summary"#,
    );
    assert_eq!(code, 3, "three failed steps:\n{out}");
    assert!(out.contains("f says hello"), "{out}");
    assert!(out.contains("==== PASS  quick ("), "{out}");
    assert!(out.contains("FAIL  sleeps past its limit: timed out after 1 s"), "{out}");
    // SIGTERM ignored: `timeout -k 10` kills it anyway.
    assert!(out.contains("FAIL  ignores SIGTERM: timed out after 1 s"), "{out}");
    assert!(out.contains("FAIL  fails: exit status 1"), "{out}");
    // Every step's elapsed time, in the summary too.
    let summary = out.split("==== summary").nth(1).expect("a summary");
    assert_eq!(summary.lines().filter(|l| l.ends_with(" s)")).count(), 4, "{summary}");
    assert!(summary.contains("failed steps: 3"), "{summary}");
}

#[test]
fn steps_the_budget_no_longer_allows_are_not_run() {
    // 20 s of budget, 15 of which stay for the summary: the first step is
    // cut to 5 s, the second finds nothing left.
    let (code, out) = steps(
        r#"steps_begin 20
           step "long" 300 sleep 600
           step "after" 300 true
           steps_summary"#,
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("==== long (limit 5 s)"), "the limit is cut to the budget:\n{out}");
    assert!(out.contains("FAIL  long: timed out after 5 s"), "{out}");
    assert!(out.contains("NOT RUN  after: the budget is spent"), "{out}");
}

#[test]
fn only_the_selected_steps_run() {
    let (code, out) = steps(
        r#"steps_begin 600 "" "device test (b|c)"
           step "device test a" 30 false
           step "device test b" 30 true
           step "device test c" 30 echo c ran
           steps_summary"#,
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("device test a: not selected") && out.contains("c ran"), "{out}");
    assert!(out.contains("PASS  device test b") && !out.contains("FAIL"), "{out}");
}

#[test]
fn programs_a_step_leaves_running_are_killed_and_fail_it() {
    // A "bundle" with its own copy of sleep; the step starts it in its own
    // session (out of timeout's reach) and returns at once.
    let dir = std::env::temp_dir().join(format!("wm-steps-bundle.{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let sleep = String::from_utf8(Command::new("bash").args(["-c", "command -v sleep"]).output().expect("bash").stdout).expect("a path");
    std::fs::copy(sleep.trim(), dir.join("sleep")).expect("a copy of sleep");
    let (code, out) = steps(&format!(
        r#"steps_begin 600 '{d}'
           step "leaves a process" 30 bash -c "setsid '{d}/sleep' 600 >/dev/null 2>&1 & exit 0"
           steps_summary
           rc=$?
           for p in /proc/[0-9]*; do [ "$(readlink $p/exe)" = '{d}/sleep' ] && echo "still running: $p"; done
           echo "checked"
           exit $rc"#,
        d = dir.display()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.contains("left running after the step, killed:"), "{out}");
    assert!(out.contains("FAIL  leaves a process: left processes running"), "{out}");
    assert!(out.contains("checked\n") && !out.contains("still running"), "{out}");
    assert_eq!(code, 1, "{out}");
}

#[test]
fn the_gpu_check_takes_a_part() {
    let out = Command::new("bash").arg(scripts().join("gpu-check.sh")).output().expect("bash runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("usage:") && String::from_utf8_lossy(&out.stderr).contains("correctness|bench|all")
    );
}

/// Every test of `tests/tests/device.rs` that runs device scenarios is a
/// step of the GPU check (a test added there and forgotten here would
/// never run on a GPU).
#[test]
fn the_gpu_check_runs_every_device_test() {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tests = std::fs::read_to_string(here.join("tests/device.rs")).expect("tests/device.rs");
    let check = std::fs::read_to_string(scripts().join("gpu-check.sh")).expect("gpu-check.sh");
    let names: Vec<&str> =
        tests.split("#[test]\nfn ").skip(1).filter_map(|t| t.split('(').next()).filter(|n| n.starts_with("device_")).collect();
    assert!(names.len() >= 6, "device tests found: {names:?}");
    let missing: Vec<&&str> = names.iter().filter(|n| !check.contains(**n)).collect();
    assert!(missing.is_empty(), "device tests the GPU check does not run: {missing:?}");
}
