//! `--json` as a script reads it: whatever starts the ranks (`wm-run`,
//! `wm-bench` itself, another launcher), stdout is JSON lines a parser
//! reads as they are — no `[rank]` tag, no marker.

use std::process::{Command, Output};

const WM_RUN: &str = env!("CARGO_BIN_EXE_wm-run");
const WM_BENCH: &str = env!("CARGO_BIN_EXE_wm-bench");

/// Every stdout line of a successful run parsed as JSON (at least one).
/// Whether `total` is two ranks' worth of `per_rank`. JSON numbers are read
/// back to within an ulp (serde_json's parser is not correctly rounded
/// without its `float_roundtrip` feature), so exact equality flakes.
fn twice(total: Option<f64>, per_rank: f64) -> bool {
    total.is_some_and(|t| (t - 2.0 * per_rank).abs() <= 1e-12 * t.abs().max(f64::MIN_POSITIVE))
}

fn json_lines(what: &str, out: &Output) -> Vec<serde_json::Value> {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what}: {:?}\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: a stdout line is not JSON ({e}): {l:?}\n{text}")))
        .collect();
    assert!(!lines.is_empty(), "{what}: no output");
    lines
}

fn wm_run(ranks: &[&str], bench: &[&str]) -> Output {
    Command::new(WM_RUN).args(ranks).arg("--").arg(WM_BENCH).args(bench).output().unwrap()
}

const SMALL: [&str; 6] = ["--rows", "20000", "--batch", "1024", "--iters", "2"];

#[test]
fn probe_under_wm_run_is_json() {
    let out = wm_run(&["-n", "4", "--node-size", "2"], &["probe", "--active", "--json"]);
    let j = json_lines("wm-run -n 4 --node-size 2 -- wm-bench probe --active --json", &out);
    assert_eq!(j.len(), 1, "{j:?}");
    assert_eq!(j[0]["ranks"], 4);
    assert_eq!(j[0]["nodes"].as_array().map(Vec::len), Some(2), "{}", j[0]);
}

#[test]
fn gather_and_scatter_under_wm_run_are_json() {
    for op in ["gather", "scatter"] {
        for ty in ["chunked", "distributed"] {
            let mut args = vec![op, "--json", "--type", ty];
            args.extend(SMALL);
            let out = wm_run(&["-n", "2"], &args);
            let j = json_lines(&format!("wm-run -n 2 -- wm-bench {args:?}"), &out);
            assert_eq!(j.len(), 1, "{j:?}");
            assert_eq!((j[0]["op"].as_str(), j[0]["type"].as_str(), j[0]["ranks"].as_u64()), (Some(op), Some(ty), Some(2)));
            assert_eq!(j[0]["verified"], true, "{}", j[0]);
        }
    }
}

#[test]
fn get_under_wm_run_and_starting_its_own_ranks_is_json() {
    for (launch, how) in [(true, "socket"), (false, "shm")] {
        let mut args = vec!["get", "--json", "--method", how];
        args.extend(SMALL);
        let out = if launch {
            wm_run(&["-n", "2", "--node-size", "1"], &args)
        } else {
            Command::new(WM_BENCH).args(&args).args(["--ranks", "2"]).output().unwrap()
        };
        let j = json_lines(&format!("wm-bench {args:?} (launched by wm-run: {launch})"), &out);
        assert_eq!(j.len(), 1, "{j:?}");
        assert_eq!((j[0]["op"].as_str(), j[0]["method"].as_str(), j[0]["readers"].as_u64()), (Some("get"), Some(how), Some(2)), "{}", j[0]);
        assert_eq!(j[0]["verified"], true, "{}", j[0]);
    }
}

#[test]
fn load_under_wm_run_is_json() {
    let out = wm_run(&["-n", "2"], &["load", "--json", "--rows", "20011", "--dim", "9", "--iters", "1"]);
    let j = json_lines("wm-run -n 2 -- wm-bench load --json", &out);
    assert_eq!((j.len(), j[0]["verified"].as_bool()), (1, Some(true)), "{j:?}");
}

#[test]
fn gather_starting_its_own_ranks_is_json() {
    let mut args = vec!["gather", "--json", "--ranks", "3"];
    args.extend(SMALL);
    let out = Command::new(WM_BENCH).args(&args).output().unwrap();
    let j = json_lines("wm-bench gather --json --ranks 3", &out);
    assert_eq!((j.len(), j[0]["ranks"].as_u64()), (1, Some(3)), "{j:?}");
}

#[test]
fn under_another_launcher_the_line_is_unchanged() {
    // A one-rank world as mpirun or srun would describe it: no WM_UNTAGGED.
    let out = Command::new(WM_BENCH)
        .args(["probe", "--json"])
        .env("WM_RANK", "0")
        .env("WM_WORLD_SIZE", "1")
        .env_remove("WM_UNTAGGED")
        .output()
        .unwrap();
    let j = json_lines("WM_RANK=0 WM_WORLD_SIZE=1 wm-bench probe --json", &out);
    assert_eq!(j[0]["ranks"], 1);
}

#[test]
fn across_nodes_the_wire_is_measured_beside_the_gather() {
    for (node_size, ty) in [("1", "distributed"), ("1", "hierarchy"), ("2", "distributed")] {
        let mut args = vec!["gather", "--json", "--type", ty, "--ranks", "2", "--node-size", node_size];
        args.extend(SMALL);
        let out = Command::new(WM_BENCH).args(&args).output().unwrap();
        let j = json_lines(&format!("wm-bench {args:?}"), &out);
        let (wire, share) = (j[0]["wire_gbps_per_rank"]["median"].as_f64(), j[0]["wire_share"].as_f64());
        if node_size == "1" {
            // Two simulated nodes: every rank's part from the other crosses.
            assert!(wire.is_some_and(|w| w > 0.0) && share.is_some_and(|s| s > 0.0), "{}", j[0]);
            assert_eq!(j[0]["nodes"], 2, "{}", j[0]);
        } else {
            assert!(wire.is_none() && share.is_none(), "one node, nothing crosses: {}", j[0]);
        }
        assert_eq!(j[0]["verified"], true, "{}", j[0]);
    }
}

#[test]
fn gather_and_scatter_report_the_ratio_batch_by_batch() {
    for (op, base) in [("gather", "one"), ("scatter", "one"), ("gather", "all")] {
        let mut args = vec![op, "--json", "--type", "distributed", "--ranks", "2", "--baseline-ranks", base];
        args.extend(SMALL);
        let out = Command::new(WM_BENCH).args(&args).output().unwrap();
        let j = json_lines(&format!("wm-bench {args:?}"), &out);
        let (ratio, by_batch) = (j[0]["ratio"].as_f64(), j[0]["ratio_batches"].as_f64());
        let (Some(ratio), Some(by_batch)) = (ratio, by_batch) else { panic!("no ratio or ratio_batches: {}", j[0]) };
        // Both compare the same calls with the same baseline batches: both
        // positive and finite (how far apart depends on the machine's stalls).
        assert!(ratio.is_finite() && ratio > 0.0 && by_batch.is_finite() && by_batch > 0.0, "{}", j[0]);
        assert_eq!(j[0]["verified"], true, "{}", j[0]);
        // With every rank on the baseline, the all-ranks figures of both
        // steps are reported beside the per-rank ones.
        let totals = (j[0]["step_gbps_total"].as_f64(), j[0]["baseline_gbps_total"].as_f64());
        if base == "all" {
            let (step, baseline) = (j[0]["step_gbps_per_rank"].as_f64().unwrap_or(0.0), j[0]["baseline_gbps"].as_f64().unwrap_or(0.0));
            assert!(step > 0.0 && baseline > 0.0, "{}", j[0]);
            assert!(twice(totals.0, step) && twice(totals.1, baseline), "{}", j[0]);
        } else {
            assert_eq!(totals, (None, None), "{}", j[0]);
        }
    }
}

#[test]
fn apply_with_every_rank_on_the_baseline_times_steps() {
    let mut args = vec!["apply", "--json", "--type", "distributed", "--ranks", "2", "--node-size", "1", "--baseline-ranks", "all"];
    args.extend(SMALL);
    let out = Command::new(WM_BENCH).args(&args).output().unwrap();
    let j = json_lines(&format!("wm-bench {args:?}"), &out);
    assert_eq!((j.len(), j[0]["op"].as_str(), j[0]["baseline_ranks"].as_str()), (1, Some("apply"), Some("all")), "{j:?}");
    let (step, base, ratio) = (j[0]["step_gbps_per_rank"].as_f64(), j[0]["baseline_gbps"].as_f64(), j[0]["ratio"].as_f64());
    // The ratio compares the two steps.
    let (Some(step), Some(base), Some(ratio)) = (step, base, ratio) else { panic!("no step, baseline or ratio: {}", j[0]) };
    assert!(step > 0.0 && base > 0.0 && (ratio - step / base).abs() <= 1e-9 * ratio.max(1.0), "{}", j[0]);
    // Beside them, both steps for all ranks together.
    let (step_total, base_total) = (j[0]["step_gbps_total"].as_f64(), j[0]["baseline_gbps_total"].as_f64());
    assert!(twice(step_total, step) && twice(base_total, base), "{}", j[0]);
    assert!(j[0]["ratio_batches"].as_f64().is_some_and(|r| r.is_finite() && r > 0.0), "{}", j[0]);
    assert_eq!(j[0]["verified"], true, "{}", j[0]);
}

#[test]
fn apply_refuses_the_options_it_would_ignore() {
    for (bad, named) in [(["--ids", "i32"], "--ids i32"), (["--baseline-pages", "huge"], "--baseline-pages huge")] {
        let mut args = vec!["apply", "--json", "--ranks", "1"];
        args.extend(bad);
        args.extend(SMALL);
        let out = Command::new(WM_BENCH).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(named), "wm-bench {args:?}: {:?}\n{err}", out.status);
        assert!(out.stdout.is_empty(), "wm-bench {args:?} printed {:?}", String::from_utf8_lossy(&out.stdout));
    }
}

/// Runs `wm-bench args... --profile` (small) and checks its `profile`: the
/// timed calls only, each of the phases in `want` among its phases, every
/// phase's min ≤ median ≤ max, and the run verified.
fn profile_has_phases(args: &[&str], want: &[&str]) {
    let mut args = args.to_vec();
    args.extend(["--json", "--profile"]);
    args.extend(SMALL);
    let out = Command::new(WM_BENCH).args(&args).output().unwrap();
    let j = json_lines(&format!("wm-bench {args:?}"), &out);
    let p = &j[0]["profile"];
    // Every timed call (`--iters 2`), none of the warm-up's.
    assert_eq!(p["calls"], 2, "{}", j[0]);
    let Some(phases) = p["ms_per_call"].as_object() else { panic!("no phases: {}", j[0]) };
    let names: Vec<&str> = phases.keys().map(String::as_str).collect();
    for want in want {
        assert!(names.contains(want), "wm-bench {args:?}: no phase {want:?} in {names:?}");
    }
    for (name, s) in phases {
        let (min, med, max) = (s["min"].as_f64(), s["median"].as_f64(), s["max"].as_f64());
        let (Some(min), Some(med), Some(max)) = (min, med, max) else { panic!("phase {name}: {s}") };
        assert!(0.0 <= min && min <= med && med <= max, "phase {name}: {s}");
    }
    assert_eq!(j[0]["verified"], true, "{}", j[0]);
}

#[test]
fn apply_profile_splits_each_call_into_its_phases() {
    profile_has_phases(
        &["apply", "--type", "distributed", "--ranks", "2", "--node-size", "1"],
        &["checks", "group ids", "exchange", "pack", "agree", "merge", "read rows", "update", "write rows", "finish"],
    );
}

#[test]
fn hierarchy_gather_profile_splits_the_fan_out_from_its_copies() {
    profile_has_phases(
        &["gather", "--type", "hierarchy", "--ranks", "4", "--node-size", "2"],
        &["checks", "node ids", "dedup", "cross ids", "owner copy", "own rows", "cross rows", "fan out", "fan copy", "fan place", "agree"],
    );
}

/// A cached run's profile: the cache's phases, and where the timed calls'
/// time went on the CPUs (on a CPU and waiting for one, both paths), on 2
/// simulated nodes.
#[test]
fn a_cached_profile_says_what_the_calls_spent_on_the_cpus() {
    let args = ["gather", "--type", "distributed", "--ranks", "2", "--node-size", "1", "--cache-ratio", "0.5", "--cache-bypass", "off"];
    profile_has_phases(&args, &["cache follow", "cache lookup", "cache misses", "cache hits", "cache place", "cache update"]);
    let mut args = args.to_vec();
    args.extend(["--json", "--profile"]);
    args.extend(SMALL);
    let out = Command::new(WM_BENCH).args(&args).output().unwrap();
    let j = &json_lines(&format!("wm-bench {args:?}"), &out)[0];
    for path in ["cached", "uncached"] {
        let get = |field: &str| j[field][path]["median"].as_f64().unwrap_or_else(|| panic!("no {field}.{path}: {j}"));
        let (wall, cpu, wait) = (get("ms_per_call"), get("cpu_ms_per_call"), get("cpu_wait_ms_per_call"));
        // A call runs on a CPU for some time; whether it waited for one
        // depends on the machine.
        assert!(wall > 0.0 && cpu.is_finite() && cpu > 0.0 && wait.is_finite() && wait >= 0.0, "{path}: {j}");
    }
}
