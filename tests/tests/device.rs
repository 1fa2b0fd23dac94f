//! The host-memory test bodies again, on device memory, with real rank
//! processes: every type fills and reads back, gathers and scatters (with
//! conversions, repeats, empty id lists, bad ids), stores and loads sharded
//! files, trains embeddings against the reference optimizers, serves
//! one-sided reads through a host mirror, on 1–4 ranks. With one
//! GPU the ranks share it (continuous and chunked memory then map each
//! other's allocations on the same device).
//!
//! Where no GPU is usable each test prints why and skips;
//! `WM_REQUIRE_GPU=1` turns the skip into a failure (for GPU runners).

use wm_tests::World;

const RANK: &str = env!("CARGO_BIN_EXE_wm-test-rank");
const LOAD: &str = env!("CARGO_BIN_EXE_wm-test-load");
const EMB: &str = env!("CARGO_BIN_EXE_wm-test-embedding");
const CACHE: &str = env!("CARGO_BIN_EXE_wm-test-cache");
const ONESIDED: &str = env!("CARGO_BIN_EXE_wm-test-onesided");

/// Whether a GPU is usable here; prints the reason when not, and panics
/// instead when `WM_REQUIRE_GPU=1`.
fn gpu_or_skip(test: &str) -> bool {
    match wholemem::device::status() {
        Ok(_) => true,
        Err(why) if wm_topology::env::require_gpu() => panic!("{test}: WM_REQUIRE_GPU=1, but no GPU is usable: {why}"),
        Err(why) => {
            println!("SKIP {test}: needs a GPU: {why}");
            false
        }
    }
}

/// `program` with `args` on 1, 2, 3 and 4 ranks, each run passing.
fn on_1_to_4_ranks(program: &str, args: &[&str]) {
    for n in 1..=4 {
        World::new(n).run_ok(program, args);
    }
}

#[test]
fn device_memory_of_every_type_fills_and_reads_back_on_1_to_4_ranks() {
    if gpu_or_skip("device fill-read") {
        on_1_to_4_ranks(RANK, &["fill-read", "device"]);
    }
}

#[test]
fn device_gather_and_scatter_match_the_reference_on_1_to_4_ranks() {
    if gpu_or_skip("device gather") {
        on_1_to_4_ranks(RANK, &["gather", "device"]);
    }
}

#[test]
fn device_buffers_gather_and_scatter_checked_and_deduplicated_on_the_device_on_1_to_4_ranks() {
    if !gpu_or_skip("device calls") {
        return;
    }
    on_1_to_4_ranks(RANK, &["device-calls"]);
    // Across simulated nodes: the host route of the collective types.
    World::new(4).nodes_of(2).run_ok(RANK, &["device-calls"]);
}

#[test]
fn device_hierarchy_and_distributed_cross_simulated_nodes() {
    if !gpu_or_skip("device gather on two nodes") {
        return;
    }
    World::new(4).nodes_of(2).run_ok(RANK, &["gather", "device"]);
}

#[test]
fn device_tables_store_and_load_sharded_files_on_1_to_4_ranks() {
    if !gpu_or_skip("device store and load") {
        return;
    }
    for n in 1..=4 {
        let dir = std::env::temp_dir().join(format!("wm-test-device-load.{}.{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        World::new(n).run_ok(LOAD, &["round-trip", dir.to_str().expect("a UTF-8 path"), "device"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn device_embeddings_train_like_the_reference_on_1_to_4_ranks() {
    if gpu_or_skip("device optimizers") {
        on_1_to_4_ranks(EMB, &["optimizers", "device"]);
    }
}

#[test]
fn device_caches_of_host_rows_train_like_no_cache_on_2_ranks_and_2_nodes() {
    if !gpu_or_skip("device cache") {
        return;
    }
    World::new(2).run_ok(CACHE, &["device"]);
    World::new(4).nodes_of(2).run_ok(CACHE, &["device"]);
}

#[test]
fn device_tables_are_read_one_sidedly_through_a_host_mirror_on_1_to_4_ranks() {
    if gpu_or_skip("device one-sided reads") {
        on_1_to_4_ranks(ONESIDED, &["mirror", "device"]);
    }
}

/// Every rank program's device scenario, with `WM_REQUIRE_GPU=1` and no
/// GPU: each must fail, naming the variable and the reason, instead of
/// passing on skips. Without the variable the same runs pass, skipping.
#[test]
fn require_gpu_turns_every_device_skip_of_every_rank_program_into_a_failure() {
    let why = match wholemem::device::status() {
        Err(why) => why,
        Ok(_) => {
            println!("require_gpu…: a GPU is usable here, so the device scenarios run instead of skipping (the GPU check covers them)");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("wm-test-require-gpu.{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let dir_arg = dir.to_str().expect("a UTF-8 path");
    let programs: [(&str, Vec<&str>); 7] = [
        (RANK, vec!["fill-read", "device"]),
        (RANK, vec!["gather", "device"]),
        (RANK, vec!["device-calls"]),
        (LOAD, vec!["round-trip", dir_arg, "device"]),
        (EMB, vec!["optimizers", "device"]),
        (CACHE, vec!["device"]),
        (ONESIDED, vec!["mirror", "device"]),
    ];
    for (program, args) in &programs {
        let name = std::path::Path::new(program).file_name().unwrap_or_default().to_string_lossy().into_owned();
        let strict = World::new(2).env("WM_REQUIRE_GPU", "1").run(program, args);
        let out = wm_tests::transcript(&strict);
        assert!(!strict.success(), "{name} {args:?} passed under WM_REQUIRE_GPU=1 without a GPU:\n{out}");
        assert!(out.contains("WM_REQUIRE_GPU=1, but") && out.contains(&why), "{name} {args:?} does not say why it failed:\n{out}");
        let lenient = World::new(2).env("WM_REQUIRE_GPU", "0").run_ok(program, args);
        let out = wm_tests::transcript(&lenient);
        assert!(out.contains("skip device") && out.contains(&why), "{name} {args:?} does not print its skips:\n{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_a_gpu_the_skip_names_the_reason() {
    // Here (no driver) the reason names the driver or the GPU; on a GPU
    // runner the driver sees at least one device.
    match wholemem::device::status() {
        Err(why) => assert!(why.contains("CUDA") || why.contains("GPU"), "{why}"),
        Ok(gpus) => assert!(gpus >= 1),
    }
}
