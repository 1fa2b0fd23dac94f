//! The CPU copy kernels by row width and element types: a single-rank
//! chunked table, gathered through the public API with one thread, beside a
//! plain `copy_from_slice` loop over a private table of the same shape.

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wholemem::{Location, MemoryType, WholeTensor};
use wm_comm::{Communicator, SocketComm};
use wm_gather::{DType, Ids, RowLayout, gather};

const ROWS: usize = 1 << 16;
const BATCH: usize = 8192;

fn ids() -> Vec<i64> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..BATCH)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % ROWS as u64) as i64
        })
        .collect()
}

fn kernels(c: &mut Criterion) {
    // One thread, so the figures measure the kernel, not the machine's cores.
    one_thread();
    let world: Arc<dyn Communicator> = Arc::new(SocketComm::bootstrap(0, 1, None, None, Duration::from_secs(60)).expect("single rank"));
    let ids = ids();
    let mut g = c.benchmark_group("gather");
    for cols in [1usize, 7, 32, 128, 129] {
        let t = WholeTensor::<f32>::matrix(&world, MemoryType::Chunked, Location::Host, ROWS, cols, None).expect("table");
        let layout = RowLayout::of(&t).expect("layout");
        for out in [DType::F32, DType::F16, DType::Bf16, DType::F64] {
            g.throughput(Throughput::Bytes((BATCH * cols * out.size()) as u64));
            let mut buf = vec![0u8; BATCH * cols * out.size()];
            g.bench_with_input(BenchmarkId::new(format!("f32->{out}"), cols), &cols, |b, _| {
                b.iter(|| gather(t.memory(), &layout, Ids::I64(&ids), &mut buf, out).expect("gather"));
            });
        }
        let private = vec![1.0f32; ROWS * cols];
        let mut out = vec![0f32; BATCH * cols];
        g.throughput(Throughput::Bytes((BATCH * cols * 4) as u64));
        g.bench_with_input(BenchmarkId::new("baseline copy_from_slice", cols), &cols, |b, _| {
            b.iter(|| {
                for (i, &id) in ids.iter().enumerate() {
                    out[i * cols..][..cols].copy_from_slice(&private[id as usize * cols..][..cols]);
                }
            });
        });
        t.free().expect("free");
    }
    g.finish();
}

fn one_thread() {
    if std::env::var_os("WM_THREADS").is_none() {
        // SAFETY: no other thread runs yet in this benchmark process.
        unsafe { std::env::set_var("WM_THREADS", "1") };
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500)).sample_size(20);
    targets = kernels
}
criterion_main!(benches);
