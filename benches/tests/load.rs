//! `wm-bench load` as a user runs it: it starts its own ranks, writes
//! uneven shards, loads and verifies them, prints one JSON object with the
//! figures and `"verified": true`, and removes the files it made (keeps
//! them when `--dir` names the directory, and `--reuse` loads them again).

use std::process::Command;

const WM_BENCH: &str = env!("CARGO_BIN_EXE_wm-bench");

/// Runs `wm-bench load --json` and returns its JSON line and exit code.
fn run(args: &[&str]) -> (serde_json::Value, i32) {
    let out =
        Command::new(WM_BENCH).arg("load").args(["--json", "--rows", "20011", "--dim", "9", "--iters", "2"]).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line =
        text.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    (serde_json::from_str(line).unwrap(), out.status.code().unwrap_or(-1))
}

fn load(args: &[&str]) -> serde_json::Value {
    let (j, code) = run(args);
    assert_eq!(code, 0, "{args:?}: {j}");
    j
}

#[test]
fn loads_verifies_and_reports_a_baseline() {
    for (ranks, ty, format, dtype) in
        [("1", "chunked", "npy", "f32"), ("2", "continuous", "raw", "bf16"), ("3", "distributed", "npy", "i16")]
    {
        let j = load(&["--ranks", ranks, "--type", ty, "--format", format, "--dtype", dtype, "--write-shards", "5"]);
        assert_eq!(j["verified"], true, "{j}");
        assert_eq!(j["ranks"].as_u64().unwrap().to_string(), ranks);
        let rows: Vec<u64> = j["shard_rows"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!((rows.len(), rows.iter().sum::<u64>()), (5, 20011), "{j}");
        assert!(rows.windows(2).any(|w| w[0] != w[1]), "shards are uneven: {rows:?}");
        for k in ["gbps_total", "baseline_gbps", "ratio"] {
            assert!(j[k].as_f64().unwrap() > 0.0, "{k}: {j}");
        }
        let spread = &j["gbps_per_rank"];
        assert!(spread["min"].as_f64().unwrap() <= spread["max"].as_f64().unwrap());
        let dir = j["dir"].as_str().unwrap();
        assert!(!std::path::Path::new(dir).exists(), "{dir} was left behind");
    }
}

#[test]
fn a_named_directory_is_kept_and_can_be_reused() {
    let dir = std::env::temp_dir().join(format!("wm-bench-load-test.{}", std::process::id()));
    let d = dir.to_str().unwrap();
    let j = load(&["--ranks", "2", "--dir", d, "--write-shards", "3"]);
    assert_eq!(j["verified"], true, "{j}");
    let names: Vec<String> = (0..3).map(|i| format!("shard_{i:04}.npy")).collect();
    for n in &names {
        assert!(dir.join(n).is_file(), "{n} missing");
    }
    let j = load(&["--ranks", "2", "--dir", d, "--write-shards", "3", "--reuse", "--type", "hierarchy"]);
    assert_eq!(j["verified"], true, "{j}");
    // A changed element in the data is found, and the exit code says so.
    let victim = dir.join(&names[1]);
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x40;
    std::fs::write(&victim, bytes).unwrap();
    let (j, code) = run(&["--ranks", "2", "--dir", d, "--write-shards", "3", "--reuse"]);
    assert_eq!((code, &j["verified"]), (3, &serde_json::json!(false)), "{j}");
    std::fs::remove_dir_all(&dir).unwrap();
}
