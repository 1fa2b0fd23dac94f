//! The job key a `dir:` rendezvous keeps in its directory: created by the
//! first rank that needs it, read by the others and by processes that join
//! the job later.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::auth::{self, JobKey};
use crate::trust;
use crate::{Error, Result};

/// The name of a `dir:` rendezvous's key file.
const KEY_FILE: &str = "job.key";

/// The job key kept in a rendezvous directory: read when it is there,
/// created (by whichever rank comes first) when it is not. Only a
/// directory of this user's that nobody else can write may hold it —
/// anyone who can write the directory could plant a key of their own.
pub(crate) fn dir_key(dir: &Path) -> Result<JobKey> {
    dir_key_with(dir, true)
}

/// The job key kept in a rendezvous directory, for a process that joins
/// a running job (a one-sided reader): read it, never create it.
pub(crate) fn existing_dir_key(dir: &Path) -> Result<JobKey> {
    dir_key_with(dir, false)
}

fn dir_key_with(dir: &Path, create: bool) -> Result<JobKey> {
    trust::check_dir(dir, "rendezvous directory")?;
    let path = dir.join(KEY_FILE);
    if !path.exists() && !create {
        return Err(Error::Bootstrap(format!(
            "rendezvous directory {} holds no {KEY_FILE}: set {} to the job's key",
            dir.display(),
            wm_topology::env::WM_JOB_KEY.name
        )));
    }
    if !path.exists() {
        // Write a fresh key beside it and link it into place: `link` fails
        // if another rank got there first, and then its key is the one.
        let fresh = JobKey::generate()?;
        let tmp = dir.join(format!(".{KEY_FILE}.{:016x}.tmp", auth::random_u64()?));
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| writeln!(f, "{}", fresh.to_hex()))
            .and_then(|_| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        match made {
            Ok(()) => return Ok(fresh),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(format!("creating the job key file {}", path.display()), e)),
        }
    }
    JobKey::read_file(&path)
}
