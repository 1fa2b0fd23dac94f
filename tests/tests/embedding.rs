//! Embeddings with real rank processes: every optimizer (SGD, lazy Adam,
//! AdamW, AdaGrad, RMSProp, with and without weight decay) on every host
//! memory type, f32/bf16 (and f16) tables, i32 and i64 ids, random
//! partitions with zero-row ranks, repeated ids within and across ranks,
//! ranks with empty batches — compared after several steps with a plain
//! single-process reference in `wm-test-embedding`; bad input failing on
//! every rank with the value named; initial values that do not depend on
//! the rank count. With the `candle` feature: the candle bridge's
//! `EmbeddingVar::apply` under AdamW, where rows no loss read keep their
//! bits.

use wm_tests::World;

const EMB: &str = env!("CARGO_BIN_EXE_wm-test-embedding");

#[test]
fn optimizers_match_the_reference_on_every_host_type_on_1_to_4_ranks() {
    for n in 1..=4 {
        World::new(n).run_ok(EMB, &["optimizers"]);
    }
}

#[test]
fn optimizers_match_the_reference_across_simulated_nodes() {
    let report = World::new(4).nodes_of(2).run_ok(EMB, &["optimizers"]);
    // Distributed and hierarchy run; the mapped types say why they cannot.
    let out = wm_tests::transcript(&report);
    assert!(out.contains("skip host continuous: ranks 0 and 2 are on different nodes"), "{out}");
}

#[test]
fn bad_input_fails_on_every_rank_and_the_next_call_works() {
    for n in [1, 2, 4] {
        World::new(n).run_ok(EMB, &["bad-input"]);
    }
    World::new(4).nodes_of(2).run_ok(EMB, &["bad-input"]);
}

#[test]
fn initial_values_do_not_depend_on_rank_count_or_memory_type() {
    let mut digests = Vec::new();
    for n in [1, 2, 3] {
        let report = World::new(n).run_ok(EMB, &["init-digest"]);
        let lines: Vec<String> = report.ranks[0].output.iter().filter(|l| l.starts_with("digest ")).cloned().collect();
        // Two initialisations on each of the four host types.
        assert_eq!(lines.len(), 8, "{lines:?}");
        digests.extend(lines);
    }
    let normal: std::collections::HashSet<&String> = digests.iter().filter(|l| l.contains("Normal")).collect();
    let uniform: std::collections::HashSet<&String> = digests.iter().filter(|l| l.contains("Uniform")).collect();
    assert!(normal.len() == 1 && uniform.len() == 1, "digests differ: {digests:#?}");
}

#[cfg(feature = "candle")]
mod candle {
    use super::*;

    /// Issue 30, item 4: `EmbeddingVar::apply` sent zero gradients for the
    /// rows of a batch the loss did not read, so AdamW moved them.
    #[test]
    fn candle_apply_sends_no_zero_gradients_for_rows_the_step_did_not_touch() {
        for n in 1..=4 {
            let report = World::new(n).run_ok(EMB, &["candle"]);
            assert!(wm_tests::transcript(&report).contains("candle distributed: untouched rows kept their bits"));
        }
        World::new(4).nodes_of(2).run_ok(EMB, &["candle"]);
    }
}
