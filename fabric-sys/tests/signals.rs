//! Loading libfabric leaves the process's signal dispositions as they were.
//!
//! Debian's libfabric pulls in `libpsm_infinipath`, whose constructor
//! installs handlers for SIGTERM and others when the library is opened;
//! `api()` undoes that. This file holds one test so that it runs alone in
//! its process: a second thread loading the library at the same time could
//! be caught between the dlopen and the restore.
#![cfg(feature = "libfabric")]

/// The handler of `sig` now.
fn handler(sig: i32) -> usize {
    // SAFETY: an all-zero sigaction is a valid out-value; a null new action
    // makes sigaction only read.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) }, 0);
    old.sa_sigaction
}

#[test]
fn loading_leaves_every_signal_handler_alone() {
    let watched = [libc::SIGINT, libc::SIGTERM, libc::SIGILL, libc::SIGABRT, libc::SIGBUS, libc::SIGSEGV];
    let before: Vec<usize> = watched.iter().map(|&s| handler(s)).collect();
    assert_eq!(before[1], libc::SIG_DFL, "the test harness leaves SIGTERM at its default");
    wm_fabric_sys::api().expect("libfabric is installed where this crate's feature is on");
    let after: Vec<usize> = watched.iter().map(|&s| handler(s)).collect();
    assert_eq!(after, before, "libfabric's dependencies took over signals {watched:?}");
}
