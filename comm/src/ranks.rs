//! Rank and world size from the launcher's environment.

use wm_topology::env::{WM_RANK, WM_WORLD_SIZE};

use crate::{Error, Result};

/// Where the rank and world size came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankSource {
    /// `WM_RANK` / `WM_WORLD_SIZE` (wm-run, or set by hand).
    Wholemem,
    /// `SLURM_PROCID` / `SLURM_NTASKS`.
    Slurm,
    /// `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE`.
    OpenMpi,
    /// `PMI_RANK` / `PMI_SIZE` (MPICH, Intel MPI, other PMI launchers).
    Pmi,
    /// Nothing was set: a single rank.
    Singleton,
}

/// This process's place in the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankEnv {
    /// 0-based rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Which variables said so.
    pub source: RankSource,
}

const SOURCES: [(RankSource, &str, &str); 4] = [
    (RankSource::Wholemem, WM_RANK.name, WM_WORLD_SIZE.name),
    (RankSource::Slurm, "SLURM_PROCID", "SLURM_NTASKS"),
    (RankSource::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    (RankSource::Pmi, "PMI_RANK", "PMI_SIZE"),
];

impl RankEnv {
    /// Reads the environment: `WM_*` first, then Slurm, Open MPI and PMI.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when a pair is half set, does not parse, or the
    /// rank is not below the world size.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// The same as [`RankEnv::from_env`] over any lookup, for tests.
    ///
    /// # Errors
    /// As [`RankEnv::from_env`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        for (source, rank_var, size_var) in SOURCES {
            match (get(rank_var), get(size_var)) {
                (None, None) => continue,
                (Some(r), Some(s)) => {
                    let parse = |name: &str, v: &str| {
                        v.trim().parse::<usize>().map_err(|_| Error::Bootstrap(format!("{name}={v:?} is not a non-negative integer")))
                    };
                    let rank = parse(rank_var, &r)?;
                    let world = parse(size_var, &s)?;
                    if world == 0 || rank >= world {
                        return Err(Error::Bootstrap(format!("{rank_var}={rank} is not below {size_var}={world}")));
                    }
                    return Ok(Self { rank, world, source });
                }
                (r, _) => {
                    let (set, unset) = if r.is_some() { (rank_var, size_var) } else { (size_var, rank_var) };
                    return Err(Error::Bootstrap(format!("{set} is set but {unset} is not")));
                }
            }
        }
        Ok(Self { rank: 0, world: 1, source: RankSource::Singleton })
    }
}

/// The variables read, in order, for messages.
pub fn searched() -> String {
    SOURCES.iter().map(|(_, r, s)| format!("{r}/{s}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn order_is_wm_then_slurm_then_ompi_then_pmi() {
        let all = [
            ("WM_RANK", "1"),
            ("WM_WORLD_SIZE", "2"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("PMI_RANK", "7"),
            ("PMI_SIZE", "8"),
        ];
        let e = RankEnv::from_lookup(env(&all)).unwrap();
        assert_eq!((e.rank, e.world, e.source), (1, 2, RankSource::Wholemem));
        let e = RankEnv::from_lookup(env(&all[2..])).unwrap();
        assert_eq!((e.rank, e.world, e.source), (3, 4, RankSource::Slurm));
        let e = RankEnv::from_lookup(env(&all[4..])).unwrap();
        assert_eq!((e.rank, e.world, e.source), (5, 6, RankSource::OpenMpi));
        let e = RankEnv::from_lookup(env(&all[6..])).unwrap();
        assert_eq!((e.rank, e.world, e.source), (7, 8, RankSource::Pmi));
        let e = RankEnv::from_lookup(env(&[])).unwrap();
        assert_eq!((e.rank, e.world, e.source), (0, 1, RankSource::Singleton));
    }

    #[test]
    fn bad_values_are_named() {
        let err = RankEnv::from_lookup(env(&[("WM_RANK", "x"), ("WM_WORLD_SIZE", "2")])).unwrap_err();
        assert!(err.to_string().contains("WM_RANK=\"x\""), "{err}");
        let err = RankEnv::from_lookup(env(&[("WM_RANK", "2"), ("WM_WORLD_SIZE", "2")])).unwrap_err();
        assert!(err.to_string().contains("WM_RANK=2"), "{err}");
        let err = RankEnv::from_lookup(env(&[("SLURM_PROCID", "0")])).unwrap_err();
        assert!(err.to_string().contains("SLURM_NTASKS is not"), "{err}");
    }
}
