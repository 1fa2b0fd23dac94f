//! How this rank's GPU reaches a host table's rows: registered with CUDA
//! (page-locked and mapped for the GPU, so kernels read them in place over
//! the bus), or not, and then why. The decision apart from the driver call,
//! so that it is tested without a GPU.
//!
//! A refused registration is a degradation, not a failure: the table keeps
//! its GPU, so device buffers, the device cache and gathers into device
//! memory still work; they copy host rows up instead of reading them in
//! place.

use std::fmt::Display;

/// How a host table's rank reaches its rows from a GPU.
#[derive(Debug)]
pub(crate) struct HostReach<G, R> {
    /// The rank's GPU, or why it has none. A refused registration leaves it
    /// here.
    pub(crate) gpu: Result<G, String>,
    /// The registrations, by the rank whose rows each holds: every region's,
    /// or none.
    pub(crate) registered: Vec<(usize, R)>,
    /// Why the rows are not registered although there is a GPU.
    pub(crate) refused: Option<String>,
}

/// With a GPU (`gpu`), registers every region (`rank`, first byte, length)
/// with `register`, all or none: at the first refusal the registrations
/// made so far are dropped (given back), the GPU stays, and the outcome
/// names the region's rank, its length and the driver's error. Without a
/// GPU nothing is registered.
pub(crate) fn reach_host<G, R, E: Display>(
    gpu: Result<G, String>,
    regions: &[(usize, *mut u8, usize)],
    mut register: impl FnMut(&G, *mut u8, usize) -> Result<R, E>,
) -> HostReach<G, R> {
    let Ok(g) = &gpu else { return HostReach { gpu, registered: Vec::new(), refused: None } };
    let mut registered = Vec::with_capacity(regions.len());
    for &(rank, ptr, len) in regions {
        match register(g, ptr, len) {
            Ok(reg) => registered.push((rank, reg)),
            Err(e) => {
                drop(registered);
                let why = format!(
                    "cuMemHostRegister refused the {len} bytes of rank {rank}'s rows ({e}); the GPU copies these host rows \
                     instead of reading them in place"
                );
                return HostReach { gpu, registered: Vec::new(), refused: Some(why) };
            }
        }
    }
    HostReach { gpu, registered, refused: None }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A registration that counts how many are held.
    struct Held<'a>(&'a Cell<usize>);

    impl Drop for Held<'_> {
        fn drop(&mut self) {
            self.0.set(self.0.get() - 1);
        }
    }

    #[test]
    fn a_refused_host_registration_kept_the_gpu_and_gives_back_the_others() {
        let held = Cell::new(0);
        let mut a = [0u8; 64];
        let mut b = [0u8; 32];
        let mut c = [0u8; 16];
        let regions = [(0, a.as_mut_ptr(), a.len()), (1, b.as_mut_ptr(), b.len()), (3, c.as_mut_ptr(), c.len())];
        let mut calls = 0;
        // The driver refuses the second region: the GPU stays the table's
        // (before, a refusal took it away, and with it device buffers, the
        // device cache and device outputs), and the reason names the rows.
        let got = reach_host(Ok("gpu 0"), &regions, |_, _, len| {
            calls += 1;
            if len == 32 {
                return Err("CUDA_ERROR_NOT_PERMITTED");
            }
            held.set(held.get() + 1);
            Ok(Held(&held))
        });
        assert_eq!(got.gpu, Ok("gpu 0"));
        assert!(got.registered.is_empty());
        let why = got.refused.expect("a reason");
        assert!(why.contains("32 bytes of rank 1's rows") && why.contains("CUDA_ERROR_NOT_PERMITTED"), "{why}");
        assert!(why.contains("copies these host rows"), "{why}");
        assert_eq!((calls, held.get()), (2, 0), "stops at the refusal and gives back the first region");
        // Every region accepted: all registered, by rank, held until dropped.
        let got = reach_host(Ok("gpu 0"), &regions, |_, _, _| {
            held.set(held.get() + 1);
            Ok::<_, String>(Held(&held))
        });
        assert_eq!(got.registered.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1, 3]);
        assert!(got.refused.is_none() && held.get() == 3);
        drop(got);
        assert_eq!(held.get(), 0);
        // No GPU: nothing tried, its reason kept; no region (a rank without
        // rows): nothing to refuse.
        let got = reach_host(Err::<&str, _>("no CUDA driver on this host".into()), &regions, |_, _, _| Err::<Held<'_>, _>("unused"));
        assert_eq!((got.gpu, got.registered.len(), got.refused), (Err("no CUDA driver on this host".into()), 0, None));
        let got = reach_host(Ok("gpu 0"), &[], |_, _, _| Err::<Held<'_>, _>("unused"));
        assert!(got.registered.is_empty() && got.refused.is_none());
    }
}
