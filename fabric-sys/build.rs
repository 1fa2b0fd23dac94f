//! Finds the system's libfabric (pkg-config), generates bindings with
//! bindgen, and compiles C wrappers for libfabric's `static inline` calls
//! (`fi_domain`, `fi_read`, `fi_cq_read`, … are all inline in the headers).

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    #[cfg(feature = "libfabric")]
    bind();
}

#[cfg(feature = "libfabric")]
fn bind() {
    use std::env;
    use std::path::PathBuf;

    let lib = match pkg_config::Config::new().atleast_version("1.10").probe("libfabric") {
        Ok(l) => l,
        Err(e) => {
            // The one place a build without libfabric can tell the user what to do.
            panic!("wm-fabric-sys needs libfabric 1.10 or newer and its headers (Debian/Ubuntu: apt-get install libfabric-dev): {e}");
        }
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let wrappers = out.join("fabric_static_fns");
    // Only libfabric's `static inline` calls are bound at build time (as C
    // wrappers: they call through the function tables of the objects they
    // take, never a symbol of the library); the few exported functions
    // are looked up at run time (`dynamic.rs`), so nothing links the
    // library and a binary built with it runs where it is missing.
    let builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function(INLINE.join("|"))
        .allowlist_type("fi_.*|fid_.*|fid")
        .allowlist_var("FI_.*")
        .derive_default(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    let builder = lib.include_paths.iter().fold(builder, |b, p| b.clang_arg(format!("-I{}", p.display())));
    let bindings = builder.generate().expect("bindgen could not read libfabric's headers");
    bindings.write_to_file(out.join("bindings.rs")).expect("writing the bindings");

    let mut cc = cc::Build::new();
    cc.file(wrappers.with_extension("c")).include(env::current_dir().expect("the crate's directory")).warnings(false);
    for p in &lib.include_paths {
        cc.include(p);
    }
    cc.compile("wm_fabric_static_fns");
}

/// The `static inline` calls of libfabric's headers that are wrapped.
#[cfg(feature = "libfabric")]
const INLINE: &[&str] = &[
    "fi_domain",
    "fi_av_open",
    "fi_av_insert",
    "fi_cq_open",
    "fi_cq_read",
    "fi_cq_sread",
    "fi_cq_readerr",
    "fi_cq_strerror",
    "fi_endpoint",
    "fi_ep_bind",
    "fi_enable",
    "fi_getname",
    "fi_mr_reg",
    "fi_mr_desc",
    "fi_mr_key",
    "fi_read",
    "fi_readmsg",
    "fi_close",
];
