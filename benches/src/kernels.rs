//! `wm-bench kernels`: the CUDA kernels compiled with NVRTC for each
//! architecture (`--check`), or prebuilt into CUBINs for GPU machines
//! without NVRTC (`--prebuild DIR`).

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

/// The options of `wm-bench kernels`.
#[derive(Debug, Clone, clap::Args)]
pub struct KernelsArgs {
    /// Compile every kernel (no cache) and report per architecture; exit non-zero on any error.
    #[arg(long)]
    pub check: bool,
    /// Architectures to compile for (repeatable) [default: sm_80 and sm_90].
    #[arg(long = "arch", value_parser = |s: &str| s.parse::<wm_gather::cuda::Arch>())]
    pub archs: Vec<wm_gather::cuda::Arch>,
    /// Write CUBINs of every kernel for each architecture into DIR, for GPU machines without NVRTC (point WM_KERNEL_CACHE there).
    #[arg(long, value_name = "DIR")]
    pub prebuild: Option<std::path::PathBuf>,
}

/// Runs `wm-bench kernels`: with `--check`, one line per architecture and
/// the NVRTC log on failure. Returns the exit code (1 when a kernel failed
/// to compile).
///
/// # Errors
/// Neither `--check` nor `--prebuild` given, no NVRTC, a CUBIN that cannot
/// be written.
pub fn run(a: &KernelsArgs) -> Result<i32> {
    use wm_gather::cuda;
    ensure!(a.check || a.prebuild.is_some(), "nothing to do: pass --check or --prebuild DIR");
    let archs = if a.archs.is_empty() { cuda::Arch::DEFAULT_CHECK.to_vec() } else { a.archs.clone() };
    let version = match cuda::nvrtc_version() {
        Ok((major, minor)) => format!("{major}.{minor}"),
        Err(e) => bail!("{e}"),
    };
    let mut failed = 0;
    if let Some(dir) = &a.prebuild {
        for &arch in &archs {
            let start = Instant::now();
            let file = cuda::prebuild(arch, dir)?;
            println!("{arch}: prebuilt {} in {:.2} s (NVRTC {version})", file.display(), start.elapsed().as_secs_f64());
        }
        if !a.check {
            return Ok(0);
        }
    }
    for arch in archs {
        let start = Instant::now();
        let (_, result) = cuda::check(&[arch]).pop().context("check returned nothing")?;
        match result {
            Ok(n) => println!("{arch}: {n} kernels compiled in {:.2} s (NVRTC {version})", start.elapsed().as_secs_f64()),
            Err(e) => {
                println!("{arch}: FAILED after {:.2} s", start.elapsed().as_secs_f64());
                eprintln!("{e}");
                failed += 1;
            }
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}
