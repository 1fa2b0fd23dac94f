//! Files and directories only this user controls: a directory nobody else
//! can put a file into, and files opened without following links and
//! checked on the open descriptor (owner, type, mode), so they cannot be
//! swapped between the check and the read.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::{Error, Result};

/// Checks that no other user can put a file into `dir`: it is a
/// directory owned by this user or root, writable by group or others only
/// when it has the sticky bit and is this user's own.
///
/// # Errors
/// [`Error::Untrusted`] naming the directory, its owner and mode.
pub fn check_dir(dir: &Path, what: &str) -> Result<()> {
    let meta = std::fs::metadata(dir).map_err(|e| Error::Bootstrap(format!("{what} {}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(Error::Bootstrap(format!("{what} {} is not a directory", dir.display())));
    }
    let me = crate::sys::effective_uid();
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    let others_write = mode & 0o022 != 0;
    let sticky = mode & 0o1000 != 0;
    let why = if uid != me && uid != 0 {
        Some(format!("it belongs to uid {uid}, who can put files into it"))
    } else if others_write && !sticky {
        Some("other users can write into it".to_owned())
    } else if others_write && uid != me {
        Some("other users can create files in it (a shared sticky directory)".to_owned())
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(Error::Untrusted(format!(
            "{what} {} (owner uid {uid}, mode {mode:o}) is not trusted: {why}, so a record or key in it could be planted by another user; \
             use a directory of your own that only you can write (`mkdir -m 700`)",
            dir.display()
        ))),
    }
}

/// Opens `path` for reading without following a symbolic link at its
/// end, then checks on the open descriptor that it is a regular file of
/// this user (and, when `private`, readable by nobody else). `Ok(None)`
/// when there is no such file.
///
/// # Errors
/// [`Error::Untrusted`] naming the file and what is wrong with it; the
/// open's error otherwise.
pub fn open_owned(path: &Path, private: bool, what: &str) -> Result<Option<File>> {
    let f = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Error::Untrusted(format!("{what} {} is a symbolic link: refusing to follow it", path.display())));
        }
        Err(e) => return Err(Error::io(format!("opening {what} {}", path.display()), e)),
    };
    let meta = f.metadata().map_err(|e| Error::io(format!("{what} {}", path.display()), e))?;
    let me = crate::sys::effective_uid();
    if !meta.file_type().is_file() {
        return Err(Error::Untrusted(format!("{what} {} is not a regular file", path.display())));
    }
    if meta.uid() != me {
        return Err(Error::Untrusted(format!(
            "{what} {} belongs to uid {}, not to this user (uid {me}): refusing a file someone else controls",
            path.display(),
            meta.uid()
        )));
    }
    if private && meta.mode() & 0o077 != 0 {
        return Err(Error::Untrusted(format!(
            "{what} {} has mode {:o}: other users can read it; `chmod 600` it",
            path.display(),
            meta.mode() & 0o777
        )));
    }
    Ok(Some(f))
}

/// The bytes of `path` (at most `max`), opened as [`open_owned`] does;
/// `Ok(None)` when there is no such file.
///
/// # Errors
/// As [`open_owned`]; a file longer than `max` bytes.
pub fn read_owned(path: &Path, max: usize, what: &str) -> Result<Option<Vec<u8>>> {
    let Some(f) = open_owned(path, false, what)? else { return Ok(None) };
    let mut body = Vec::new();
    f.take(max as u64 + 1).read_to_end(&mut body).map_err(|e| Error::io(format!("reading {what} {}", path.display()), e))?;
    if body.len() > max {
        return Err(Error::Bootstrap(format!("{what} {} is longer than {max} bytes", path.display())));
    }
    Ok(Some(body))
}
