//! What a process believes of the file system: directories other users
//! cannot write, files of its own opened without following links, and
//! records signed with the job key.
//!
//! Every record a process of the job reads from a directory or receives
//! before a channel of its own exists — a rank's rendezvous record, the
//! rank table rank 0 sends, a published table's record — is signed with
//! the job key (HMAC-SHA256 under a label per kind of record) and checked
//! before any field of it is used. A directory is trusted only when no
//! other user can put a file into it (or, with the sticky bit, when it is
//! ours), and a file only when it is ours; a planted record is refused
//! three times over.

use std::sync::Mutex;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::auth::JobKey;
pub use crate::owned_files::{check_dir, open_owned, read_owned};

/// The kinds of signed record; each signs under a label of its own, so a
/// record of one kind is never taken for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordKind {
    /// A rank's rendezvous record (a `dir:` file, or sent to rank 0).
    Rank,
    /// The table of every rank's record rank 0 sends back.
    RankTable,
    /// A one-sided table's published record (file or catalogue answer).
    Table,
}

impl RecordKind {
    fn label(self) -> &'static [u8] {
        match self {
            Self::Rank => b"wholemem signed rank record v1",
            Self::RankTable => b"wholemem signed rank table v1",
            Self::Table => b"wholemem signed table record v1",
        }
    }
}

/// What a signed record starts with, before its MAC in hex and a newline.
const SIGNED_MAGIC: &[u8] = b"WMSIG1 ";
/// Bytes before the body: the magic, 64 hex digits, a newline.
pub const SIGNED_OVERHEAD: usize = SIGNED_MAGIC.len() + 64 + 1;

fn record_mac(key: &JobKey, kind: RecordKind, body: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key.bytes()).expect("HMAC takes keys of any length");
    m.update(kind.label());
    m.update(&(body.len() as u64).to_le_bytes());
    m.update(body);
    m
}

impl JobKey {
    /// `body` signed with this key as a record of `kind`:
    /// `WMSIG1 <MAC in hex>\n<body>`.
    pub fn sign_record(&self, kind: RecordKind, body: &[u8]) -> Vec<u8> {
        let mac = record_mac(self, kind, body).finalize().into_bytes();
        let mut out = Vec::with_capacity(SIGNED_OVERHEAD + body.len());
        out.extend_from_slice(SIGNED_MAGIC);
        for b in mac {
            out.extend_from_slice(format!("{b:02x}").as_bytes());
        }
        out.push(b'\n');
        out.extend_from_slice(body);
        out
    }

    /// The body of a record of `kind` signed with this key.
    ///
    /// # Errors
    /// Why it is refused, in words: not a signed record, or a signature
    /// this key did not make (another job's key, or a forgery).
    pub fn open_record<'a>(&self, kind: RecordKind, signed: &'a [u8]) -> std::result::Result<&'a [u8], String> {
        if signed.len() < SIGNED_OVERHEAD || !signed.starts_with(SIGNED_MAGIC) || signed[SIGNED_OVERHEAD - 1] != b'\n' {
            return Err("it is not a signed record (no `WMSIG1` signature line)".into());
        }
        let hex = &signed[SIGNED_MAGIC.len()..SIGNED_OVERHEAD - 1];
        let mut mac = [0u8; 32];
        for (i, m) in mac.iter_mut().enumerate() {
            let pair = std::str::from_utf8(&hex[2 * i..2 * i + 2]).map_err(|_| "its signature is not hexadecimal".to_owned())?;
            *m = u8::from_str_radix(pair, 16).map_err(|_| "its signature is not hexadecimal".to_owned())?;
        }
        let body = &signed[SIGNED_OVERHEAD..];
        record_mac(self, kind, body)
            .verify_slice(&mac)
            .map_err(|_| "its signature does not verify with this job's key (another job's record, or a forgery)".to_owned())?;
        Ok(body)
    }
}

/// The key this process's last communicator was started with.
static PROCESS_KEY: Mutex<Option<JobKey>> = Mutex::new(None);

/// Remembers the key a communicator of this process was started with, so
/// that layers above (one-sided tables) use the key the job already shares
/// instead of sending one.
pub(crate) fn remember_key(key: &JobKey) {
    *PROCESS_KEY.lock().unwrap_or_else(|p| p.into_inner()) = Some(key.clone());
}

/// The job key this process's communicator was started with, if any
/// (never sent: every rank got it from its launcher, its rendezvous
/// directory or its MPI runtime).
pub fn process_key() -> Option<JobKey> {
    PROCESS_KEY.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("wm-trust.{tag}.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn signed_records_open_only_with_their_key_and_kind() {
        let k = JobKey::generate().unwrap();
        let signed = k.sign_record(RecordKind::Table, b"{\"a\":1}");
        assert_eq!(k.open_record(RecordKind::Table, &signed).unwrap(), b"{\"a\":1}");
        let e = k.open_record(RecordKind::Rank, &signed).unwrap_err();
        assert!(e.contains("does not verify"), "{e}");
        let other = JobKey::generate().unwrap();
        assert!(other.open_record(RecordKind::Table, &signed).unwrap_err().contains("does not verify"));
        let mut changed = signed.clone();
        *changed.last_mut().unwrap() = b'2';
        assert!(k.open_record(RecordKind::Table, &changed).unwrap_err().contains("does not verify"));
        let e = k.open_record(RecordKind::Table, b"{\"a\":1}").unwrap_err();
        assert!(e.contains("not a signed record"), "{e}");
    }

    #[test]
    fn directories_others_can_write_are_refused() {
        let d = scratch("dirs");
        check_dir(&d, "directory").unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_dir(&d, "directory").unwrap_err().to_string();
        assert!(e.contains("mode 777") && e.contains("other users can write"), "{e}");
        // Sticky and ours: others may add files, never replace ours.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_dir(&d, "directory").unwrap();
        // /tmp: sticky, but root's: refused unless we are root.
        if crate::sys::effective_uid() != 0 {
            let e = check_dir(Path::new("/tmp"), "directory").unwrap_err().to_string();
            assert!(e.contains("sticky"), "{e}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_are_opened_without_following_links_and_checked_on_the_descriptor() {
        let d = scratch("files");
        let f = d.join("key");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(open_owned(&f, true, "file").unwrap().is_some());
        assert!(open_owned(&d.join("absent"), true, "file").unwrap().is_none());
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = open_owned(&f, true, "file").unwrap_err().to_string();
        assert!(e.contains("mode 640"), "{e}");
        assert!(open_owned(&f, false, "file").unwrap().is_some());
        let link = d.join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = open_owned(&link, false, "file").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
