//! Host memory of every type with real rank processes: fill and read back,
//! simulated nodes, and bad inputs.

use wm_tests::World;

const RANK: &str = env!("CARGO_BIN_EXE_wm-test-rank");

/// Every host type × widths 1, 7, 128 × equal, uneven and zero-row
/// partitions: each rank fills its rows with a function of (row, column),
/// and mapped types read every global row through the mapping.
#[test]
fn every_type_fills_and_reads_back_on_1_to_4_ranks() {
    for n in 1..=4 {
        World::new(n).run_ok(RANK, &["fill-read"]);
    }
}

/// Tables of over 16 huge pages per rank: laid out and mapped for huge
/// pages, built from them where the kernel allows, and read back exactly —
/// and the same with `WM_HUGE_PAGES=off`.
#[test]
fn large_mapped_tables_use_huge_pages_and_read_back() {
    World::new(2).run_ok(RANK, &["huge-pages"]);
    World::new(3).env("WM_HUGE_PAGES", "off").run_ok(RANK, &["huge-pages", "off"]);
}

#[test]
fn two_nodes_refuse_mapped_types_and_split_communicators() {
    World::new(4).nodes_of(2).run_ok(RANK, &["two-nodes"]);
}

#[test]
fn bad_inputs_fail_on_every_rank_and_leave_them_usable() {
    for n in 1..=3 {
        World::new(n).run_ok(RANK, &["bad-input"]);
    }
}
