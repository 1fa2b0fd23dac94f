//! The GPU check's step machinery (`scripts/gpu-steps.sh`), run here: no
//! step can hang the check, a timed-out step is named, every step's time is
//! printed, the budget of a whole part holds, and programs a step leaves
//! running are killed. And the GPU check itself (`scripts/gpu-check.sh`),
//! as far as it runs without a GPU: its plan fits one command, and it stops
//! at once when the probe finds no usable device.

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
fn a_part_keeps_within_its_budget_and_the_next_part_gets_its_own() {
    // A part of 20 s (15 of which stay for the kill grace): its first step
    // is cut to 5 s, its second finds nothing left; the next part runs.
    let (code, out) = steps(
        r#"steps_begin 600
           steps_part first 20
           step "long" 300 sleep 600
           step "after" 300 true
           steps_part second 100
           step "next" 300 true
           steps_summary"#,
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("######## part first (budget 20 s)") && out.contains("######## part second (budget 100 s)"), "{out}");
    assert!(out.contains("==== long (limit 5 s)"), "the limit is cut to the part's budget:\n{out}");
    assert!(out.contains("NOT RUN  after: the budget is spent (part first's)"), "{out}");
    assert!(out.contains("==== next (limit 85 s)") && out.contains("PASS  next"), "{out}");
}

#[test]
fn the_gpu_check_refuses_an_unknown_part() {
    let out = Command::new("bash").arg(scripts().join("gpu-check.sh")).arg("bogus").output().expect("bash runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("usage:") && err.contains("--dry-run") && err.contains("all|correctness|bench"), "{err}");
}

/// The parts `gpu-check.sh --dry-run PART` prints: (name, budget seconds)
/// in order, and the total it states.
fn plan(part: &str) -> (Vec<(String, u64)>, u64, String) {
    let out = Command::new("bash").arg(scripts().join("gpu-check.sh")).args(["--dry-run", part]).output().expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "--dry-run {part}: {:?}\n{text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    let mut parts = Vec::new();
    let mut total = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [n, name, secs, "s", ..] if n.ends_with('.') => {
                assert_eq!(n.trim_end_matches('.').parse::<usize>().ok(), Some(parts.len() + 1), "numbered in order: {line}");
                parts.push(((*name).to_owned(), secs.parse().unwrap_or_else(|_| panic!("a budget in seconds: {line}"))));
            }
            ["total", secs, "s", ..] => total = secs.parse().ok(),
            _ => {}
        }
    }
    (parts, total.unwrap_or_else(|| panic!("no total line:\n{text}")), text)
}

#[test]
fn the_gpu_check_plan_fits_one_command_with_time_for_a_rerun() {
    // No bundle and no GPU needed: the plan only.
    let (parts, total, text) = plan("all");
    let names: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["machine", "probe", "kernels", "device-tests", "benchmarks", "ncu"], "the order:\n{text}");
    let sum: u64 = parts.iter().map(|p| p.1).sum();
    assert_eq!(sum, total, "the total is the budgets' sum:\n{text}");
    assert!(total <= 540, "one command of at most 10 minutes, leaving a rerun in the lease:\n{text}");
    assert!(parts.iter().all(|p| p.1 >= 30), "every part has a budget that can run it:\n{text}");
    // The two halves are the same parts, in the same order, same budgets.
    for (half, want) in
        [("correctness", &["machine", "probe", "kernels", "device-tests"]), ("bench", &["machine", "probe", "benchmarks", "ncu"])]
    {
        let (got, total, text) = plan(half);
        assert_eq!(got.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(), want, "{text}");
        assert!(got.iter().all(|p| parts.contains(p)), "{text}");
        assert_eq!(got.iter().map(|p| p.1).sum::<u64>(), total, "{text}");
    }
}

#[test]
fn the_gpu_check_stops_at_once_when_the_probe_finds_no_device() {
    // A bundle whose wm-bench fails the probe as it does without a GPU, and
    // whose later programs leave a mark if they run.
    let dir = std::env::temp_dir().join(format!("wm-gpu-check-no-device.{}", std::process::id()));
    let (bundle, out_dir) = (dir.join("bundle"), dir.join("out"));
    std::fs::create_dir_all(bundle.join("kernels")).expect("a scratch bundle");
    let stub = |name: &str, body: &str| {
        let path = bundle.join(name);
        std::fs::write(&path, format!("#!/usr/bin/env bash\n{body}\n")).expect("a stub");
        let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&path, executable).expect("an executable stub");
    };
    stub("wm-run", r#"while [ "$1" != -- ]; do shift; done; shift; exec "$@""#);
    stub("wm-bench", "echo \"stub wm-bench $*\"; echo 'continuous device: the CUDA driver sees no GPU on this host' >&2; exit 4");
    for later in ["kernel-tests", "device-tests"] {
        stub(later, &format!("touch '{}/{later}-ran'", dir.display()));
    }
    let out = Command::new("bash")
        .arg(scripts().join("gpu-check.sh"))
        .arg("all")
        .arg(&bundle)
        .env("OUT", &out_dir)
        .env_remove("WM_GPU_CHECK_ONLY")
        .output()
        .expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(out_dir.join("gpu-check.log")).unwrap_or_default();
    let ran: Vec<String> =
        ["kernel-tests", "device-tests"].iter().filter(|l| dir.join(format!("{l}-ran")).exists()).map(|l| (*l).to_owned()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    let code = out.status.code();
    assert!(code.is_some_and(|c| c != 0 && c != 64), "a failed check, not a usage error: {code:?}\n{text}");
    // The machine's facts first, then the probe's refusal, then the stop.
    let uname = text.find("$ uname -a").unwrap_or_else(|| panic!("uname -a first:\n{text}"));
    let probe = text.find("stub wm-bench probe --active").unwrap_or_else(|| panic!("the probe ran:\n{text}"));
    let stop = text.find("STOP: no usable device").unwrap_or_else(|| panic!("a clear stop:\n{text}"));
    assert!(uname < probe && probe < stop, "{text}");
    assert!(text.contains("the CUDA driver sees no GPU on this host"), "the probe's reason is shown:\n{text}");
    assert!(ran.is_empty(), "later parts ran after the probe failed: {ran:?}\n{text}");
    for part in ["kernels", "device-tests", "benchmarks", "ncu"] {
        assert!(text.contains(&format!("NOT RUN  part {part}: the check stopped")), "{part}:\n{text}");
    }
    assert!(!text.contains("######## part kernels"), "{text}");
    // The same in the one log under $OUT.
    assert!(log.contains("STOP: no usable device") && log.contains("$ uname -a") && log.contains("failed steps:"), "the log:\n{log}");
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

/// Issue 30, item 9: CI tolerated warnings (a budget of 20 hid real ones).
/// Every cargo command of `.ci/run` now runs with warnings denied: the
/// flags are exported before the first one, and no line changes them after.
#[test]
fn every_ci_lane_builds_with_warnings_denied() {
    let ci = std::fs::read_to_string(scripts().join("../.ci/run")).expect(".ci/run is readable");
    let lines: Vec<&str> = ci.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let first_cargo = lines.iter().position(|l| l.split_whitespace().any(|w| w == "cargo")).expect(".ci/run runs cargo");
    let export = lines.iter().position(|l| l.starts_with("export ") && l.contains(r#"RUSTFLAGS="-D warnings""#));
    assert!(export.is_some_and(|e| e < first_cargo), "RUSTFLAGS=\"-D warnings\" is not exported before the first cargo command");
    assert!(lines.iter().position(|l| l.contains(r#"RUSTDOCFLAGS="-D warnings""#)).is_some_and(|e| e < first_cargo), "RUSTDOCFLAGS");
    let later: Vec<&&str> = lines.iter().skip(first_cargo).filter(|l| l.contains("RUSTFLAGS") || l.contains("--cap-lints")).collect();
    assert!(later.is_empty(), "a later line changes the warning flags: {later:?}");
}
