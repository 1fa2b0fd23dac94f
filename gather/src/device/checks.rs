//! Checking ids on the device: which range a call's ids must fall in, what
//! the check kernel leaves in its status word, and the error that names
//! the first bad id. The kernel lowers the word to the position of every
//! bad id (`atomicMin`), so it ends as the first bad position whatever
//! order the threads ran in: one pass, read once when the call waits for
//! the stream anyway. Only on failure does the call read that one id back
//! (a second, small copy) to name it.

use wholemem::WholeMemory;

use crate::Error;
use crate::cuda::STATUS_OK;

/// What the status word says about `n` ids: the first bad position, or
/// `None` when every id passed. A word that names no position among them
/// cannot come from the kernel; it is reported as position `n` (the
/// caller's error then says so rather than passing the ids).
pub(crate) fn first_bad(status: u64, n: usize) -> Option<usize> {
    if status == STATUS_OK {
        return None;
    }
    Some(usize::try_from(status).ok().filter(|&p| p < n).unwrap_or(n))
}

/// What the check kernel leaves in a status word that was [`STATUS_OK`],
/// for ids checked against `lo..hi`: its host reference.
#[cfg(test)]
pub(crate) fn reference(ids: &[i64], lo: i64, hi: i64) -> u64 {
    ids.iter().enumerate().filter(|&(_, &id)| id < lo || id >= hi).map(|(i, _)| i as u64).min().unwrap_or(STATUS_OK)
}

/// The error for id `index` at `position` of this rank's ids: out of range
/// for `mem`'s rows.
pub(crate) fn out_of_range(mem: &WholeMemory, position: usize, index: i64) -> Error {
    Error::IndexOutOfRange { index, position, rank: mem.comm().world_rank(), rows: mem.rows() }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::Ids;

    #[test]
    fn the_word_names_the_first_bad_position_or_none() {
        assert_eq!(first_bad(STATUS_OK, 10), None);
        assert_eq!(first_bad(0, 10), Some(0));
        assert_eq!(first_bad(9, 10), Some(9));
        // Not a position among the ids: never silently a pass.
        assert_eq!(first_bad(10, 10), Some(10));
        assert_eq!(first_bad(u64::MAX - 1, 10), Some(10));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The device check flags exactly the ids the host check does, and
        /// the first of them: for i64 and for i32 ids (widened as the kernel
        /// widens them), negative ones and the bounds included.
        #[test]
        fn the_device_check_finds_the_first_id_the_host_check_finds(
            rows in 0usize..1000,
            raw in prop::collection::vec(any::<i64>(), 0..200),
            wide in any::<bool>(),
        ) {
            // Mostly valid ids, with the edges and a few strays.
            let ids: Vec<i64> = raw.iter().map(|&r| match r.rem_euclid(23) {
                0 => -1,
                1 => rows as i64,
                2 => r,
                3 => i64::from(i32::MIN),
                _ => r.rem_euclid(rows.max(1) as i64),
            }).collect();
            let narrow: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
            let (host, device) = if wide {
                (Ids::I64(&ids).first_out_of_range(rows), reference(&ids, 0, rows as i64))
            } else {
                let widened: Vec<i64> = narrow.iter().map(|&x| i64::from(x)).collect();
                (Ids::I32(&narrow).first_out_of_range(rows), reference(&widened, 0, rows as i64))
            };
            prop_assert_eq!(host.map(|(p, _)| p), first_bad(device, ids.len()));
        }
    }
}
