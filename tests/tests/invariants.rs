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

// ------------------------------------------------------------ file loops

/// The module path of a source file of a crate's `src/` (`lib.rs` and
/// `main.rs` are the root, `a/mod.rs` is `a`), or `None` for a file that
/// roots a crate of its own (`src/bin/`).
fn module_of(src: &Path, f: &Path) -> Option<Vec<String>> {
    let rel = f.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    match last.as_str() {
        "mod.rs" => {}
        "lib.rs" | "main.rs" if parts.is_empty() => {}
        _ => parts.push(last.trim_end_matches(".rs").to_owned()),
    }
    Some(parts)
}

/// `text` without its comments (line comments, doc comments included, and
/// block comments), so that doc links do not count as uses.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |e| &after[e + 2..]);
        } else if rest.starts_with("//") {
            rest = rest.find('\n').map_or("", |e| &rest[e..]);
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Every path a `use` tree names, its braces expanded:
/// `crate::{a, b::{self, C}}` gives `crate::a`, `crate::b` and `crate::b::C`.
fn use_paths(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else { return vec![tree.trim_end_matches("::self").to_owned()] };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start, mut out) = (0usize, 0usize, Vec::new());
    for (i, c) in inner.char_indices().chain(std::iter::once((inner.len(), ','))) {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                let item = &inner[start..i];
                start = i + 1;
                if item.is_empty() {
                    continue;
                }
                for p in use_paths(item) {
                    out.push(if p == "self" { prefix.to_owned() } else { format!("{prefix}::{p}") });
                }
            }
            _ => {}
        }
    }
    out
}

/// The paths `code` names that start with `crate::`, `super::`, `self::`
/// or one of `children` (modules declared in the file): from its `use`
/// items, expanded, and from paths written in place.
fn named_paths(code: &str, children: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for stmt in code.split(';') {
        let s = stmt.trim_start();
        let s = s.strip_prefix("pub(crate) ").or_else(|| s.strip_prefix("pub(super) ")).or_else(|| s.strip_prefix("pub ")).unwrap_or(s);
        if let Some(tree) = s.strip_prefix("use ") {
            out.extend(use_paths(tree));
        }
    }
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let starts: Vec<&str> = ["crate", "super", "self"].into_iter().chain(children.iter().map(String::as_str)).collect();
    for (i, _) in code.match_indices("::") {
        // The identifier chain that ends here, back to its first segment.
        let mut b = i;
        loop {
            let seg_start = code[..b].rfind(|c: char| !word(c)).map_or(0, |p| p + 1);
            if seg_start >= 2 && &code[seg_start - 2..seg_start] == "::" {
                b = seg_start - 2;
            } else {
                b = seg_start;
                break;
            }
        }
        let first_end = code[b..].find("::").map_or(b, |e| b + e);
        if b > 0 && code[..b].ends_with(['\'', '"']) {
            continue;
        }
        if !starts.contains(&&code[b..first_end]) {
            continue;
        }
        let end = code[i + 2..].find(|c: char| !(word(c) || c == ':')).map_or(code.len(), |e| i + 2 + e);
        out.push(code[b..end].trim_end_matches(':').to_owned());
    }
    out
}

/// The module of this crate a `path` named in module `at` leads to: the
/// longest prefix of it that is a module with a file of its own.
fn resolve(path: &str, at: &[String], children: &[String], modules: &[Vec<String>]) -> Option<Vec<String>> {
    let segs: Vec<&str> = path.split("::").collect();
    let mut full: Vec<String> = match segs.first()? {
        &"crate" => Vec::new(),
        &"self" => at.to_vec(),
        &"super" => at[..at.len().checked_sub(1)?].to_vec(),
        first if children.iter().any(|c| c == first) => {
            let mut v = at.to_vec();
            v.push((*first).to_owned());
            v
        }
        _ => return None,
    };
    let skip = usize::from(matches!(segs[0], "crate" | "self" | "super") || !children.iter().any(|c| c == segs[0]));
    let mut rest = segs.iter().skip(skip).peekable();
    while rest.peek() == Some(&&"super") {
        full.pop();
        rest.next();
    }
    full.extend(rest.map(|s| (*s).to_owned()));
    (0..=full.len()).rev().map(|n| full[..n].to_vec()).find(|m| modules.contains(m))
}

/// Issue 33: the files of a crate depend on each other in one direction.
/// A file may use what the modules above it define (its parent, the crate
/// root); every other use is an arrow between two files, and no file may
/// come back to itself along those arrows. The six loops the issue found
/// (comm's communicator, MPI backend and socket backend; its bootstrap and
/// rendezvous; wholemem's handle and storage; embedding's cache and
/// table; graph's route and sample; wm-bench's cached and gather) each
/// failed this.
#[test]
fn no_file_of_a_crate_comes_back_to_itself_through_its_uses() {
    let root = root();
    let mut loops = Vec::new();
    for krate in CRATES.iter().copied().chain(["python"]) {
        let src = root.join(krate).join("src");
        let files: Vec<(Vec<String>, PathBuf)> = sources(&src).into_iter().filter_map(|f| module_of(&src, &f).map(|m| (m, f))).collect();
        let modules: Vec<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
        let mut arrows: Vec<(usize, usize, String)> = Vec::new();
        for (i, (at, f)) in files.iter().enumerate() {
            let code = code_only(&std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
            let children: Vec<String> =
                modules.iter().filter(|m| m.len() == at.len() + 1 && m.starts_with(at)).map(|m| m[at.len()].clone()).collect();
            for p in named_paths(&code, &children) {
                let Some(to) = resolve(&p, at, &children, &modules) else { continue };
                // Its own module or one above it: not an arrow.
                if at.starts_with(&to) {
                    continue;
                }
                let j = modules.iter().position(|m| *m == to).expect("a module of the crate");
                if !arrows.iter().any(|(a, b, _)| (*a, *b) == (i, j)) {
                    arrows.push((i, j, p));
                }
            }
        }
        // A loop is a file that reaches itself: search from each file.
        for start in 0..files.len() {
            let mut trail = vec![start];
            let mut seen = vec![false; files.len()];
            if let Some(found) = back_to(start, start, &arrows, &mut seen, &mut trail) {
                let names: Vec<String> = found
                    .windows(2)
                    .map(|w| {
                        format!(
                            "{} (uses {})",
                            relative(&root, &files[w[0]].1),
                            arrows.iter().find(|(a, b, _)| (*a, *b) == (w[0], w[1])).map_or("", |x| x.2.as_str())
                        )
                    })
                    .collect();
                let key = {
                    let mut k = found[..found.len() - 1].to_vec();
                    k.sort_unstable();
                    k
                };
                if !loops.iter().any(|(k, _): &(Vec<usize>, String)| *k == key) {
                    loops.push((key, format!("{krate}: {}", names.join(" -> "))));
                }
            }
        }
    }
    assert!(
        loops.is_empty(),
        "files that come back to themselves through their uses:\n{}",
        loops.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>().join("\n")
    );
}

/// A trail of arrows from `at` back to `start`, depth first.
fn back_to(start: usize, at: usize, arrows: &[(usize, usize, String)], seen: &mut [bool], trail: &mut Vec<usize>) -> Option<Vec<usize>> {
    for (_, to, _) in arrows.iter().filter(|(a, _, _)| *a == at) {
        if *to == start {
            let mut t = trail.clone();
            t.push(start);
            return Some(t);
        }
        if !seen[*to] {
            seen[*to] = true;
            trail.push(*to);
            if let Some(t) = back_to(start, *to, arrows, seen, trail) {
                return Some(t);
            }
            trail.pop();
        }
    }
    None
}

/// The loop check sees a loop where there is one, through grouped `use`
/// items, `super::` and child modules named in place, and none where a
/// file only uses its parent.
#[test]
fn the_loop_check_reads_uses_as_rust_does() {
    assert_eq!(use_paths("crate::{Error, kernel::{self, RowAddr}}"), vec!["crate::Error", "crate::kernel", "crate::kernel::RowAddr"]);
    let modules: Vec<Vec<String>> = vec![vec![], vec!["a".into()], vec!["a".into(), "b".into()], vec!["c".into()]];
    let at = vec!["a".to_owned(), "b".to_owned()];
    assert_eq!(resolve("super::Thing", &at, &[], &modules), Some(vec!["a".to_owned()]));
    assert_eq!(resolve("crate::c::f", &at, &[], &modules), Some(vec!["c".to_owned()]));
    assert_eq!(resolve("super::super::c::g", &at, &[], &modules), Some(vec!["c".to_owned()]));
    assert_eq!(resolve("b::h", &["a".to_owned()], &["b".to_owned()], &modules), Some(at.clone()));
    let code = code_only("/// [`crate::c::x`]\nuse crate::{c::{self, y}};\nfn f() { super::z(); b::w(); \"crate::q::r\"; }");
    let named = named_paths(&code, &["b".to_owned()]);
    assert!(
        named.contains(&"crate::c".to_owned()) && named.contains(&"super::z".to_owned()) && named.contains(&"b::w".to_owned()),
        "{named:?}"
    );
    assert!(!named.iter().any(|p| p.contains("::x")), "a doc link is not a use: {named:?}");
}
