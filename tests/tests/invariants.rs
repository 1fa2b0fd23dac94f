//! The architecture invariants a reading of the source can check: where
//! unsafe code may live, that every crate root denies or forbids it
//! elsewhere, and that no FFI type appears in a public signature but at
//! the documented seams. ARCHITECTURE.md states them; this test keeps the
//! statement and the code together.

use std::path::{Path, PathBuf};

/// The workspace root (this crate lives in `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A path relative to the workspace root, with `/` separators.
fn relative(root: &Path, f: &Path) -> String {
    f.strip_prefix(root).expect("under the root").to_string_lossy().replace('\\', "/")
}

/// The library crates and tools whose sources are checked (their `src/`;
/// tests, examples and benchmarks of a crate may use unsafe code to set up
/// what they test, e.g. a signal to themselves).
const CRATES: &[&str] = &["topology", "comm", "wholemem", "gather", "embedding", "graph", "onesided", "fabric-sys", "benches"];

/// The files that may hold unsafe code, as ARCHITECTURE.md lists them
/// (paths from the workspace root; one ending in `/` covers a directory).
const UNSAFE_ALLOWED: &[&str] = &[
    "comm/src/sys.rs",
    "comm/src/socket/shm.rs",
    "comm/src/socket/mod.rs",
    "comm/src/launch/group.rs",
    "comm/src/mpi_backend.rs",
    "comm/src/nccl.rs",
    "wholemem/src/host/map.rs",
    "wholemem/src/host/mod.rs",
    "wholemem/src/host/locks.rs",
    "wholemem/src/handle.rs",
    "wholemem/src/handle/rows.rs",
    "wholemem/src/tensor.rs",
    "wholemem/src/files/mod.rs",
    "wholemem/src/device/",
    "gather/src/kernel.rs",
    "gather/src/mapped.rs",
    "gather/src/exchange/local.rs",
    "gather/src/exchange/scatter.rs",
    "gather/src/rows.rs",
    "gather/src/column.rs",
    "gather/src/cuda/",
    "gather/src/device/",
    "onesided/src/shm.rs",
    "onesided/src/transport.rs",
    "onesided/src/reader.rs",
    "onesided/src/fabric/",
    "onesided/src/mpi_rma.rs",
    "fabric-sys/",
];

/// Whether `text` holds unsafe code (outside comments).
fn has_unsafe(text: &str) -> bool {
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with("//"))
        .any(|l| l.contains("unsafe {") || l.contains("unsafe fn ") || l.contains("unsafe impl ") || l.contains("unsafe extern"))
}

fn allowed(rel: &str) -> bool {
    UNSAFE_ALLOWED.iter().any(|a| rel == *a || (a.ends_with('/') && rel.starts_with(a)))
}

#[test]
fn unsafe_code_lives_only_in_the_modules_architecture_md_lists() {
    let root = root();
    let mut offenders = Vec::new();
    let mut seen = 0;
    for c in CRATES {
        for f in sources(&root.join(c).join("src")) {
            let rel = relative(&root, &f);
            let text = std::fs::read_to_string(&f).expect("a readable source file");
            if has_unsafe(&text) {
                seen += 1;
                if !allowed(&rel) {
                    offenders.push(rel);
                }
            }
        }
    }
    assert!(seen > 10, "the scan found unsafe code in only {seen} files: is it reading the sources?");
    assert!(offenders.is_empty(), "unsafe code outside the modules ARCHITECTURE.md lists: {offenders:?}");
    // And the list is ARCHITECTURE.md's: each entry named there.
    let arch = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let unnamed: Vec<&&str> = UNSAFE_ALLOWED.iter().filter(|a| !arch.contains(a.trim_end_matches('/'))).collect();
    assert!(unnamed.is_empty(), "ARCHITECTURE.md does not name these modules with unsafe code: {unnamed:?}");
}

#[test]
fn every_crate_root_denies_or_forbids_unsafe_code() {
    let root = root();
    let mut roots = vec![];
    for c in CRATES.iter().filter(|c| **c != "fabric-sys") {
        roots.push(format!("{c}/src/lib.rs"));
    }
    for f in sources(&root.join("benches/src/bin")) {
        roots.push(relative(&root, &f));
    }
    for r in &roots {
        let text = std::fs::read_to_string(root.join(r)).unwrap_or_else(|e| panic!("crate root {r}: {e}"));
        assert!(
            text.contains("#![forbid(unsafe_code)]") || text.contains("#![deny(unsafe_code)]"),
            "{r} neither denies nor forbids unsafe code"
        );
    }
}

/// Paths of foreign-function types that must not appear in a public
/// signature.
const FFI: &[&str] =
    &["libc::", "cudarc::", "mpi::ffi", "mpi_sys::", "nvml_wrapper::", "hwlocality::", "wm_fabric_sys::", "c_void", "c_int"];
/// The documented seams: `wholemem::device::raw` (a table's CUDA context
/// and stream, for `wm-gather`'s kernels), `MpiComm::with_raw` (the raw MPI
/// communicator, for `wm-onesided`'s windows), and the bindings crate.
const FFI_SEAMS: &[&str] = &["wholemem/src/device/raw.rs", "comm/src/mpi_backend.rs", "fabric-sys/"];

/// Public function signatures and public fields of `text`, one string
/// each, outside `#[cfg(test)]` modules.
fn public_signatures(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_test = false;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            in_test = true;
        }
        if in_test {
            continue;
        }
        if t.starts_with("pub fn ") || t.starts_with("pub unsafe fn ") || t.starts_with("pub const fn ") {
            let mut sig = t.to_owned();
            while !sig.contains('{') && !sig.contains(';') {
                match lines.next() {
                    Some(l) => sig.push_str(l.trim()),
                    None => break,
                }
            }
            out.push(sig.split('{').next().unwrap_or_default().to_owned());
        } else if t.starts_with("pub ") && t.contains(": ") && !t.starts_with("pub use") && !t.starts_with("pub mod") {
            // A field, constant or static: its type, not its value.
            out.push(t.split(" = ").next().unwrap_or_default().to_owned());
        }
    }
    out
}

#[test]
fn no_ffi_type_appears_in_a_public_signature_but_at_the_seams() {
    let root = root();
    let mut found = Vec::new();
    for c in CRATES {
        for f in sources(&root.join(c).join("src")) {
            let rel = relative(&root, &f);
            if FFI_SEAMS.iter().any(|s| rel == *s || (s.ends_with('/') && rel.starts_with(s))) {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("a readable source file");
            for sig in public_signatures(&text) {
                if FFI.iter().any(|p| sig.contains(p)) {
                    found.push(format!("{rel}: {sig}"));
                }
            }
        }
    }
    assert!(found.is_empty(), "FFI types in public signatures:\n{}", found.join("\n"));
}

#[test]
fn the_checks_see_what_they_look_for() {
    assert!(has_unsafe("fn f() { unsafe { g() } }"));
    assert!(has_unsafe("unsafe impl Send for X {}"));
    assert!(!has_unsafe("// unsafe { g() }\nfn f() {}"));
    assert!(allowed("wholemem/src/device/copy.rs") && allowed("comm/src/sys.rs"));
    assert!(!allowed("comm/src/auth.rs") && !allowed("wholemem/src/host/other.rs"));
    let sigs = public_signatures("pub fn f(x: libc::c_int,\n    y: u8) -> u8 {\n}\n#[cfg(test)]\npub fn g(p: libc::pollfd) {}\n");
    assert_eq!(sigs.len(), 1, "{sigs:?}");
    assert!(sigs[0].contains("libc::c_int") && sigs[0].contains("y: u8"), "{sigs:?}");
    // A constant's type counts, its value does not.
    assert_eq!(
        public_signatures("pub const S: i32 = libc::F_SEAL_SEAL;\npub x: libc::pid_t,\n"),
        ["pub const S: i32", "pub x: libc::pid_t,"]
    );
}

/// Issue 30, item 7: `Mailbox::bytes_mut` handed out a safe `&mut [u8]`
/// over memory another process writes at the same time, and
/// `Transport::register` kept its contract in prose. Each is now an
/// `unsafe fn` whose doc comment has a `# Safety` section.
#[test]
fn shared_memory_slices_and_registrations_are_unsafe_fns_with_a_safety_section() {
    for (file, name) in [
        ("comm/src/socket/shm.rs", "bytes_mut"),
        ("wholemem/src/handle/rows.rs", "local_bytes_for_io"),
        ("wholemem/src/handle/rows.rs", "local_bytes_for_output"),
        ("onesided/src/transport.rs", "register"),
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let lines: Vec<&str> = text.lines().collect();
        let at = lines.iter().position(|l| l.contains(&format!("fn {name}("))).unwrap_or_else(|| panic!("{file} has no fn {name}"));
        assert!(lines[at].contains(&format!("unsafe fn {name}(")), "{file}: fn {name} is not an unsafe fn: {}", lines[at].trim());
        // Its doc comment (the `///` lines above, attributes and plain
        // comments skipped) has a `# Safety` section.
        let doc = lines[..at]
            .iter()
            .rev()
            .take_while(|l| {
                let t = l.trim_start();
                t.starts_with("///") || t.starts_with("#[") || t.starts_with("//")
            })
            .any(|l| l.trim_start() == "/// # Safety");
        assert!(doc, "{file}: unsafe fn {name} has no # Safety section");
    }
}
