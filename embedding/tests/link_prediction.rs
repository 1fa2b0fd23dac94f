//! The link-prediction example, started as `wm-run` starts it (through
//! `wm_comm::launch`) on a small graph: the loss falls every epoch, the
//! held-out AUC reaches 0.85, and the last line is `auc=<value>` with no
//! rank tag. `cargo test -p wm-embedding` builds the example first; the full
//! size runs with
//! `target/release/wm-run -n 2 -- target/release/examples/link_prediction --epochs 5`.

use std::path::PathBuf;
use std::time::Duration;

use wm_comm::launch::{self, Launch};

/// `target/<profile>/examples/link_prediction`, beside this test's `deps/`.
fn example() -> PathBuf {
    let me = std::env::current_exe().expect("the test's own path");
    let path = me.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps").join("examples").join("link_prediction");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p wm-embedding --examples` (cargo test -p wm-embedding does)",
        path.display()
    );
    path
}

/// Entries of `/dev/shm` named like wholemem's (there should never be any:
/// shared memory is memfd).
fn shm_leftovers() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_ascii_lowercase())
                .filter(|n| n.contains("wholemem") || n.starts_with("wm-") || n.starts_with("wm_"))
                .collect()
        })
        .unwrap_or_default()
}

fn train(ty: &str, node_size: Option<usize>) {
    let args = ["--epochs", "5", "--nodes", "3000", "--blocks", "30", "--batch", "1024", "--dim", "16", "--lr", "0.05", "--type", ty];
    let mut l = Launch::new(2, example(), args);
    l.echo = false;
    l.node_size = node_size;
    l.limit = Some(Duration::from_secs(300));
    let report = launch::run(&l).expect("start the ranks");
    let all: Vec<String> = report.ranks.iter().flat_map(|r| r.output.iter().map(move |l| format!("[{}] {l}", r.rank))).collect();
    assert!(report.success(), "{ty}: {:?}\n{}", report.failures(), all.join("\n"));
    assert!(shm_leftovers().is_empty(), "{ty}: left in /dev/shm: {:?}", shm_leftovers());
    assert!(report.ranks[1].output.is_empty(), "{ty}: only rank 0 prints:\n{}", all.join("\n"));
    let out = &report.ranks[0].output;
    let losses: Vec<f64> = out
        .iter()
        .filter_map(|l| l.strip_prefix("epoch "))
        .map(|l| l.split_once("loss=").and_then(|(_, v)| v.split(' ').next()).and_then(|v| v.parse().ok()).expect("a loss"))
        .collect();
    assert_eq!(losses.len(), 5, "{ty}: {out:?}");
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{ty}: the loss must fall every epoch: {losses:?}");
    let last = out.last().expect("output");
    let auc: f64 = last.strip_prefix("auc=").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{ty}: last line {last:?}"));
    assert!((0.85..=1.0).contains(&auc), "{ty}: auc {auc} after 5 epochs; losses {losses:?}");
}

#[test]
fn distributed_table_learns_the_blocks() {
    train("distributed", None);
}

#[test]
fn hierarchy_table_across_two_simulated_nodes_learns_the_blocks() {
    train("hierarchy", Some(1));
}
