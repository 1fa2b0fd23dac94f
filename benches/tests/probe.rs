//! `wm-bench probe` as cluster validation runs it: here, with no GPU, every
//! host combination the ranks allow is supported and passes the active
//! check, and every device combination is refused with the reason.

use std::process::Command;

const WM_RUN: &str = env!("CARGO_BIN_EXE_wm-run");
const WM_BENCH: &str = env!("CARGO_BIN_EXE_wm-bench");

fn probe(ranks: &[&str], extra: &[&str]) -> (serde_json::Value, i32) {
    let mut cmd = Command::new(WM_RUN);
    cmd.args(ranks).args(["--", WM_BENCH, "probe", "--json"]).args(extra);
    let out = cmd.output().unwrap();
    // What a validation script does: parse the output as it comes. Rank 0
    // prints one JSON line and nothing else goes to stdout.
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line expected on stdout: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let j = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (j, out.status.code().unwrap_or(-1))
}

fn cell<'a>(j: &'a serde_json::Value, ty: &str, loc: &str) -> &'a serde_json::Value {
    j["matrix"].as_array().unwrap().iter().find(|c| c["type"] == ty && c["location"] == loc).unwrap()
}

#[test]
fn active_probe_passes_every_supported_combination() {
    for (ranks, one_node) in
        [(&["-n", "1"][..], true), (&["-n", "2"], true), (&["-n", "4"], true), (&["-n", "4", "--node-size", "2"], false)]
    {
        let (j, code) = probe(ranks, &["--active"]);
        assert_eq!(code, 0, "{ranks:?}: {j}");
        for ty in ["continuous", "chunked", "distributed", "hierarchy"] {
            let host = cell(&j, ty, "host");
            let mapped = ty == "continuous" || ty == "chunked";
            if mapped && !one_node {
                assert_eq!(host["supported"], false, "{ranks:?} {ty}");
                // One host posing as two nodes: named by their node ids.
                assert!(host["reason"].as_str().unwrap().contains("ranks 0 and 2 are on different nodes (node0 and node1)"), "{host}");
            } else {
                assert_eq!(host["supported"], true, "{ranks:?} {ty}: {host}");
                assert_eq!(host["active"], "passed", "{ranks:?} {ty}: {host}");
            }
            // Device answers depend on the machine: with no driver (as here)
            // every cell says so; with one, a supported cell must pass.
            let dev = cell(&j, ty, "device");
            match wholemem::device::status() {
                Err(why) => {
                    assert_eq!(dev["supported"], false, "{dev}");
                    assert!(dev["reason"].as_str().unwrap().contains(&why), "{dev} should say {why:?}");
                }
                Ok(_) if dev["supported"] == true => assert_eq!(dev["active"], "passed", "{ranks:?} {ty}: {dev}"),
                Ok(_) => assert!(!dev["reason"].as_str().unwrap().is_empty(), "{dev}"),
            }
        }
        assert!(j["nodes"].as_array().unwrap().iter().all(|n| n["cpu"]["pus"].as_u64().unwrap() >= 1));
    }
}

#[test]
fn require_fails_for_what_is_not_supported() {
    let (j, code) = probe(&["-n", "2"], &["--require", "chunked:host,continuous:device"]);
    assert_eq!(code, 4, "{j}");
    assert_eq!(j["required_missing"], serde_json::json!(["continuous:device"]));
    let (_, code) = probe(&["-n", "2"], &["--require", "chunked:host,distributed:host"]);
    assert_eq!(code, 0);
}

#[test]
fn a_malformed_requirement_is_named() {
    let out = Command::new(WM_BENCH).args(["probe", "--require", "chunky:host"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(r#"unknown memory type "chunky""#), "{out:?}");
}
