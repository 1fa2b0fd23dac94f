//! Checks the conversion rules of `convert.cuh` against the CPU kernels,
//! bit for bit, by compiling that file as host C++ (`WM_HOST_TEST`: the
//! PTX bit casts and f16 conversions get host stand-ins with the same IEEE
//! rounding). It covers everything the device code decides itself: the
//! routing through f32 or f64, half's bf16 algorithms, integer narrowing.
//! The hash table of `repeats.cuh` is compiled the same way (sequential
//! stand-ins for the atomics) and run against its Rust reference
//! (`cuda::repeats`) and the rule "the last occurrence wins".
//! Skipped, with a line saying so, when no C++ compiler is installed.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::source::{CONVERT, REPEATS, allowed_pairs, c_type};
use crate::DType;
use crate::kernel::RowConv;

const MAIN: &str = r#"
#include <cstdio>
#include <cstring>
#include <vector>
template <typename S, typename D> int run() {
    std::vector<unsigned char> in;
    unsigned char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, stdin)) > 0) in.insert(in.end(), buf, buf + got);
    for (size_t i = 0; i + sizeof(S) <= in.size(); i += sizeof(S)) {
        S s;
        memcpy(&s, &in[i], sizeof(S));
        D d = WmConvert<S, D>::run(s);
        fwrite(&d, sizeof(D), 1, stdout);
    }
    return 0;
}
int main(int argc, char** argv) {
    if (argc != 3) return 2;
"#;

fn compiler() -> Option<&'static str> {
    ["c++", "g++", "clang++"].into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

fn harness() -> String {
    let mut s = String::from("#define WM_HOST_TEST 1\n#define __device__\n#define __forceinline__ inline\n");
    s.push_str(CONVERT);
    s.push_str(MAIN);
    for (a, b) in allowed_pairs() {
        s.push_str(&format!(
            "    if (!strcmp(argv[1], \"{a}\") && !strcmp(argv[2], \"{b}\")) return run<{}, {}>();\n",
            c_type(a),
            c_type(b)
        ));
    }
    s.push_str("    return 3;\n}\n");
    s
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Inputs of type `d` as bytes: every pattern of the 16-bit types; for the
/// others special values, random bit patterns, and patterns built to sit
/// exactly on or next to a rounding tie of the narrower types.
fn samples(d: DType) -> Vec<u8> {
    let mut rng = Rng(0x5eed ^ d.size() as u64);
    let mut out = Vec::new();
    match d {
        DType::F16 | DType::Bf16 | DType::I16 => (0..=u16::MAX).for_each(|v| out.extend(v.to_le_bytes())),
        DType::I8 => (0..=u8::MAX).for_each(|v| out.push(v)),
        DType::F32 => {
            let special = [0.0f32, -0.0, 1.0, -1.0, 65504.0, 65520.0, 6.1e-5, 5.96e-8, 2.98e-8, f32::MAX, f32::MIN_POSITIVE, 1e-45];
            let mut v: Vec<u32> = special.iter().map(|x| x.to_bits()).collect();
            v.extend([0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0x7f80_0001, 0xffbf_ffff]);
            for _ in 0..40_000 {
                let r = rng.next() as u32;
                // Raw; bf16 tie (low 16 bits 0x8000); f16 tie (low 13 bits 0x1000); just above a tie.
                v.extend([r, (r & !0xffff) | 0x8000, (r & !0x1fff) | 0x1000, (r & !0xffff) | 0x8001]);
                // Small magnitudes, where f16 is subnormal.
                v.push((r & 0x807f_ffff) | ((100 + (r >> 24) % 20) << 23));
            }
            v.iter().for_each(|x| out.extend(x.to_le_bytes()));
        }
        DType::F64 => {
            let special = [0.0f64, -0.0, 1.0, 0.1, 65504.0, 65520.0, 1e300, -1e-300, 3.4e38, 3.5e38, f64::MIN_POSITIVE, 5e-324];
            let mut v: Vec<u64> = special.iter().map(|x| x.to_bits()).collect();
            v.extend([0x7ff0_0000_0000_0000, 0xfff0_0000_0000_0000, 0x7ff8_0000_0000_0000, 0x7ff0_0000_0000_0001, 0x7ff0_0001_0000_0000]);
            for _ in 0..40_000 {
                let r = rng.next();
                // Raw; a bf16 tie in the upper 32 bits, with and without lower bits; an f16 tie; an f32 tie.
                let bf16_tie = (r & !0x1f_ffff_ffff_ffff) | 0x10_0000_0000_0000 >> 8;
                v.extend([
                    r,
                    bf16_tie & !0xffff_ffff,
                    bf16_tie | 1,
                    (r & !0x3ff_ffff_ffff) | 0x200_0000_0000,
                    (r & !0x1fff_ffff) | 0x1000_0000,
                ]);
                // Magnitudes around the f16 / f32 / bf16 ranges.
                let e = [1008u64, 1023, 1040, 900, 1150][(r >> 60) as usize % 5] + (r >> 52) % 16;
                v.push((r & 0x800f_ffff_ffff_ffff) | (e << 52));
            }
            v.iter().for_each(|x| out.extend(x.to_le_bytes()));
        }
        DType::I32 | DType::I64 => {
            for k in 0..20_000u32 {
                let r = rng.next() >> (k % 64);
                let r = if k % 2 == 0 { r } else { r.wrapping_neg() };
                out.extend(&r.to_le_bytes()[..d.size()]);
            }
        }
    }
    out
}

fn build(cxx: &str, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join("convert_harness.cpp");
    std::fs::write(&src, harness()).unwrap();
    let exe = dir.join("convert_harness");
    let out = Command::new(cxx).args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-o"]).arg(&exe).arg(&src).output().unwrap();
    assert!(out.status.success(), "{cxx} could not compile convert.cuh as host C++:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

fn run(exe: &Path, from: DType, to: DType, input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(exe).args([from.name(), to.name()]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "harness {from} -> {to} exited with {}", out.status);
    out.stdout
}

#[test]
fn device_conversions_match_the_cpu_kernels_bit_for_bit() {
    let Some(cxx) = compiler() else {
        println!("SKIP device_conversions_match_the_cpu_kernels_bit_for_bit: no C++ compiler (c++, g++ or clang++)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("wm-convert-check-{}", std::process::id()));
    let exe = build(cxx, &dir);
    // half rounds f64 -> f16 through f32 only where F16C is there; elsewhere
    // its software path differs in rare cases (see docs/kernels.md).
    #[cfg(target_arch = "x86_64")]
    let f16c = std::arch::is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let f16c = false;
    let mut checked = 0;
    for (from, to) in allowed_pairs() {
        if from == DType::F64 && to == DType::F16 && !f16c {
            println!("SKIP f64 -> f16: this CPU has no F16C, so half rounds differently from the device");
            continue;
        }
        let input = samples(from);
        let n = input.len() / from.size();
        let conv = RowConv::new(from, to, n).unwrap();
        let mut want = vec![0u8; conv.dst_bytes()];
        // SAFETY: `input` holds n elements of `from`, `want` n of `to`; they do not overlap.
        unsafe { conv.row(input.as_ptr(), want.as_mut_ptr()) };
        let got = run(&exe, from, to, &input);
        assert_eq!(got.len(), want.len(), "{from} -> {to}: output size");
        let w = to.size();
        for (i, (g, e)) in got.chunks(w).zip(want.chunks(w)).enumerate() {
            // Equal bits, NaN payloads included (the device handles NaNs in shared code, checked here).
            assert!(
                g == e,
                "{from} -> {to}: input {:02x?} gave {g:02x?}, the CPU kernel {e:02x?}",
                &input[i * from.size()..][..from.size()]
            );
        }
        checked += n;
    }
    assert!(checked > 1_000_000, "only {checked} values checked");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads `n` i64 ids and `lo hi` from its arguments, inserts the ids in
/// position order (`forward`) or backwards (`backward`), and writes the keep
/// mask: what the `mark` and `keep` kernels do, one id at a time.
const REPEATS_MAIN: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
int main(int argc, char** argv) {
    if (argc != 5) return 2;
    const long long lo = atoll(argv[1]), hi = atoll(argv[2]);
    const unsigned long long capacity = strtoull(argv[3], 0, 10);
    const bool backward = !strcmp(argv[4], "backward");
    std::vector<long long> ids;
    long long id;
    while (fread(&id, sizeof id, 1, stdin) == 1) ids.push_back(id);
    std::vector<wm_u64> keys(capacity, WM_EMPTY_KEY);
    std::vector<wm_u32> vals(capacity, 0);
    const size_t n = ids.size();
    for (size_t k = 0; k < n; ++k) {
        const size_t i = backward ? n - 1 - k : k;
        if (ids[i] >= lo && ids[i] < hi) wm_repeat_insert(keys.data(), vals.data(), capacity - 1, (wm_u64)ids[i], (wm_u32)i);
    }
    for (size_t i = 0; i < n; ++i) {
        const wm_u8 keep = (ids[i] >= lo && ids[i] < hi) ? wm_repeat_is_last(keys.data(), vals.data(), capacity - 1, (wm_u64)ids[i], (wm_u32)i) : 0;
        fwrite(&keep, 1, 1, stdout);
    }
    return 0;
}
"#;

#[test]
fn the_repeat_table_of_the_device_keeps_the_last_occurrences_like_its_reference() {
    use super::repeats::{capacity, keep_mask, keep_mask_in_order};
    let Some(cxx) = compiler() else {
        println!("SKIP the_repeat_table_of_the_device_keeps_the_last_occurrences_like_its_reference: no C++ compiler");
        return;
    };
    let dir = std::env::temp_dir().join(format!("wm-repeat-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("repeat_harness.cpp");
    let text = format!("#define WM_HOST_TEST 1\n#define __device__\n#define __forceinline__ inline\n{CONVERT}{REPEATS}{REPEATS_MAIN}");
    std::fs::write(&src, text).unwrap();
    let exe = dir.join("repeat_harness");
    let out = Command::new(cxx).args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-o"]).arg(&exe).arg(&src).output().unwrap();
    assert!(out.status.success(), "{cxx} could not compile repeats.cuh as host C++:\n{}", String::from_utf8_lossy(&out.stderr));
    let mut rng = Rng(0x07e9_ea75);
    // Many repeats (a span of 5), some, and almost none; ids out of range on both sides.
    for (n, span) in [(0usize, 5u64), (1, 5), (2_000, 5), (20_000, 1_000), (50_000, 1 << 40)] {
        let ids: Vec<i64> = (0..n).map(|_| (rng.next() % span) as i64 - 1).collect();
        let (lo, hi) = (0i64, span as i64 - 2);
        let mut last = std::collections::HashMap::new();
        for (i, &id) in ids.iter().enumerate() {
            if id >= lo && id < hi {
                last.insert(id, i);
            }
        }
        let rule: Vec<u8> = ids.iter().enumerate().map(|(i, id)| u8::from(last.get(id) == Some(&i))).collect();
        assert_eq!(keep_mask(&ids, lo, hi), rule, "the reference, {n} ids over {span}");
        for order in ["forward", "backward"] {
            let mut child = Command::new(&exe)
                .args([lo.to_string(), hi.to_string(), capacity(n).to_string(), order.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            let input: Vec<u8> = bytemuck::cast_slice(&ids).to_vec();
            let writer = std::thread::spawn(move || stdin.write_all(&input));
            let got = child.wait_with_output().unwrap();
            writer.join().unwrap().unwrap();
            assert!(got.status.success(), "the repeat harness exited with {}", got.status);
            assert_eq!(got.stdout, rule, "repeats.cuh, {order}, {n} ids over {span}");
        }
        let backward = keep_mask_in_order(&ids, lo, hi, (0..n).rev());
        assert_eq!(backward, rule, "the reference inserting backwards");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
