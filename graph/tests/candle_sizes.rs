//! `candle_bridge::gather_tensor` with output sizes past `usize::MAX`
//! (feature `candle`; one rank, no launcher): issue 30, item 6.

use candle_core::Device;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use wholemem::{Location, MemoryType, TensorDesc, WholeTensor};
use wm_graph::candle_bridge::gather_tensor;

/// `ids.len() * cols` was not checked: a table whose second dimension is a
/// broadcast (stride 0) of any number of columns made the output's length
/// wrap (or, checked by the debug build, panic). Extreme column counts and a
/// few ids: an error naming both, never a panic, and the table still
/// usable.
#[test]
fn gather_tensor_output_size_overflow() {
    let world = wm_comm::init().unwrap();
    let config = Config { cases: 256, failure_persistence: None, ..Config::default() };
    // Columns whose product with 2 to 9 ids is past usize::MAX elements,
    // or past it in bytes only (4 per f32).
    let cols = prop_oneof![usize::MAX / 2 + 1..=usize::MAX, usize::MAX / 32..=usize::MAX / 16];
    let n_ids = prop_oneof![2usize..=9];
    let mut runner = TestRunner::new(config);
    runner
        .run(&(cols, n_ids), |(cols, n)| {
            let n = if cols > usize::MAX / 16 { n } else { n.max(5) };
            let desc = TensorDesc::new(&[4, cols], &[1, 0], 0).unwrap();
            let t = WholeTensor::<f32>::allocate(&world, MemoryType::Continuous, Location::Host, desc, None).unwrap();
            let ids: Vec<i64> = (0..n as i64).map(|i| i % 4).collect();
            let e = gather_tensor(&t, &ids, &Device::Cpu).expect_err("an output past usize::MAX bytes");
            let text = e.to_string();
            t.free().unwrap();
            prop_assert!(
                text.contains(&n.to_string()) && text.contains(&cols.to_string()),
                "{} does not name {} ids and {} columns",
                text,
                n,
                cols
            );
            Ok(())
        })
        .unwrap();
}
