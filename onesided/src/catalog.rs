//! Where readers outside the job find a published table: through the
//! job's rendezvous.
//!
//! - `dir:/path` — rank 0 writes the table's record to
//!   `/path/onesided-<name>.json` (mode 600, through a temporary file and a
//!   rename) at each publish and removes it when the table is freed.
//! - `host:port` — rank 0 keeps listening at the rendezvous address once
//!   the job has met (the port the job's ranks used; with port 0, the one
//!   in `WM_RENDEZVOUS_PORT_FILE`) and answers lookups by name from
//!   readers that prove they hold the job's key.
//!
//! A record is signed with the job key (`wm_comm::trust`, its own label)
//! and checked before any field is used; a `dir:` catalogue must be a
//! directory no other user can write, and the record file this user's,
//! opened without following links. Every server then checks the reader's
//! key again (and the reader checks the server's). The `host:port`
//! catalogue serves on the listener rank 0 kept from the rendezvous (never
//! a port released and bound again), behind a gate like every listener's.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wholemem::CommonError;
use wm_comm::auth::{self, ReaderId};
use wm_comm::gate::{Gate, Shut};
use wm_comm::session::Sealed;
use wm_comm::trust::{self, RecordKind};
use wm_comm::{JobKey, Rendezvous};

use crate::record::RECORD_MAX;
use crate::{Error, Result};

/// The nonce readers name when they call a catalogue.
const CATALOGUE_NONCE: u64 = 0;
/// Longest a reader waits for a catalogue's answer.
const LOOKUP_LIMIT: Duration = Duration::from_secs(10);

/// The file holding a table's record in a `dir:` rendezvous.
pub(crate) fn record_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("onesided-{name}.json"))
}

/// `at`, in words.
pub(crate) fn describe(at: &Rendezvous) -> String {
    match at {
        Rendezvous::Dir(d) => format!("dir:{}", d.display()),
        Rendezvous::Tcp(a) => a.clone(),
    }
}

/// Publishes (or republishes) a table's record at `at`: rank 0's part of
/// a publish.
pub(crate) fn publish(at: &Rendezvous, name: &str, record: &[u8], key: &JobKey) -> Result<()> {
    let record = &key.sign_record(RecordKind::Table, record);
    match at {
        Rendezvous::Dir(dir) => {
            trust::check_dir(dir, "the publish directory")?;
            write_private(&record_file(dir, name), record)
                .map_err(|e| Error::io(format!("publishing table {name:?} in {}", dir.display()), e))
        }
        Rendezvous::Tcp(addr) => {
            let mut svc = SERVICE.lock().unwrap_or_else(|p| p.into_inner());
            if svc.is_none() {
                *svc = Some(Service::start(addr, key)?);
            }
            let s = svc.as_ref().ok_or_else(|| Error::Common(CommonError::InvalidArgument("no catalogue".into())))?;
            if s.fingerprint != key.fingerprint() {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "this process already serves a catalogue at {} for another job key",
                    s.addr
                ))));
            }
            s.tables.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), record.to_vec());
            Ok(())
        }
    }
}

/// Withdraws a table's record (the table is freed).
pub(crate) fn withdraw(at: &Rendezvous, name: &str) {
    match at {
        Rendezvous::Dir(dir) => {
            let _ = std::fs::remove_file(record_file(dir, name));
        }
        Rendezvous::Tcp(_) => {
            if let Some(s) = SERVICE.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                s.tables.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
            }
        }
    }
}

/// Writes `body` to `path` atomically, readable only by this user.
fn write_private(path: &Path, body: &[u8]) -> io::Result<()> {
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("record");
    let tmp = path.with_file_name(format!(".{file}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(body).and_then(|_| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// What a lookup found.
pub(crate) enum Found {
    /// The record's bytes.
    Record(Vec<u8>),
    /// Nothing (yet): `why`.
    Nothing(String),
    /// The catalogue closed the connection during the handshake: the
    /// error to report if that goes on.
    Closed(Error),
}

/// Looks a table up once.
///
/// # Errors
/// A catalogue that refuses this reader (the wrong key) or breaks the
/// protocol; a record file that cannot be read.
pub(crate) fn lookup(at: &Rendezvous, name: &str, key: &JobKey, timeout: Duration) -> Result<Found> {
    let (signed, from) = match at {
        Rendezvous::Dir(dir) => {
            trust::check_dir(dir, "the publish directory")?;
            let path = record_file(dir, name);
            match trust::read_owned(&path, RECORD_MAX + trust::SIGNED_OVERHEAD, "the table record")? {
                Some(b) => (b, path.display().to_string()),
                None => return Ok(Found::Nothing(format!("{} does not exist", path.display()))),
            }
        }
        Rendezvous::Tcp(addr) => {
            let addr = resolve(addr)?;
            match ask(&addr, name, key, timeout)? {
                Found::Record(b) => (b, format!("the catalogue at {addr}")),
                nothing => return Ok(nothing),
            }
        }
    };
    // A record this key did not sign was published by a process that
    // cannot prove the key this reader holds: refused as such.
    let body = key.open_record(RecordKind::Table, &signed).map_err(|why| Error::Refused {
        at: from,
        detail: format!(
            "the table's record is refused: {why}; a key mismatch (does this process hold the job's key, {}?) or a planted record",
            wm_topology::env::WM_JOB_KEY.name
        ),
    })?;
    Ok(Found::Record(body.to_vec()))
}

/// `host:port`, with port 0 read from `WM_RENDEZVOUS_PORT_FILE`.
fn resolve(addr: &str) -> Result<String> {
    match addr.rsplit_once(':') {
        Some((host, "0")) => {
            let var = wm_topology::env::WM_RENDEZVOUS_PORT_FILE;
            let path = var.get().ok_or_else(|| {
                Error::Common(CommonError::InvalidArgument(format!(
                    "the rendezvous {addr} has port 0: name the job's port, or set {}",
                    var.name
                )))
            })?;
            let port: u16 = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .filter(|&p| p != 0)
                .ok_or_else(|| Error::Common(CommonError::InvalidArgument(format!("{} ({path}) holds no port", var.name))))?;
            Ok(format!("{host}:{port}"))
        }
        _ => Ok(addr.to_owned()),
    }
}

fn ask(addr: &str, name: &str, key: &JobKey, timeout: Duration) -> Result<Found> {
    let deadline = Instant::now() + timeout.min(LOOKUP_LIMIT);
    let target = match addr.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return Err(Error::Common(CommonError::InvalidArgument(format!("{addr} resolves to nothing")))),
        Err(e) => return Err(Error::io(format!("resolving {addr}"), e)),
    };
    let mut s = match TcpStream::connect_timeout(&target, timeout.min(LOOKUP_LIMIT)) {
        Ok(s) => s,
        Err(e) => return Ok(Found::Nothing(format!("nothing answers at {addr} ({e})"))),
    };
    let session = match auth::call_as_reader(&mut s, key, ReaderId::Outside, CATALOGUE_NONCE, deadline) {
        Ok(session) => session,
        // Closed without a verdict: a key mismatch, or a catalogue
        // shedding unauthenticated connections under a flood; the caller
        // asks again for a while.
        Err(r) if r.closed => return Ok(Found::Closed(Error::Refused { at: format!("the catalogue at {addr}"), detail: r.detail })),
        Err(r) => return Err(Error::Refused { at: format!("the catalogue at {addr}"), detail: r.detail }),
    };
    let mut s = Sealed::new(s, session);
    let io_err = |e: io::Error| Error::io(format!("looking up table {name:?} at {addr}"), e);
    let mut req = (name.len() as u16).to_le_bytes().to_vec();
    req.extend_from_slice(name.as_bytes());
    s.write_all(&req).map_err(io_err)?;
    let mut head = [0u8; 5];
    s.read_exact(&mut head).map_err(io_err)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let bad = |d: String| Error::Malformed { from: format!("the catalogue at {addr}"), detail: d };
    match head[0] {
        0 if len <= RECORD_MAX + trust::SIGNED_OVERHEAD => {
            // Grows as the bytes arrive, never to the announced length first.
            let mut body = Vec::new();
            Read::by_ref(&mut s).take(len as u64).read_to_end(&mut body).map_err(io_err)?;
            if body.len() < len {
                return Err(bad(format!("a record cut short at {} of {len} bytes", body.len())));
            }
            Ok(Found::Record(body))
        }
        0 => Err(bad(format!("a record of {len} bytes (at most {})", RECORD_MAX + trust::SIGNED_OVERHEAD))),
        1 if len == 0 => Ok(Found::Nothing(format!("the job at {addr} has published no table of that name (now)"))),
        s => Err(bad(format!("the answer {s} with {len} bytes"))),
    }
}

/// The catalogue rank 0 serves at a `host:port` rendezvous.
struct Service {
    addr: String,
    fingerprint: [u8; 32],
    tables: Arc<Mutex<HashMap<String, Vec<u8>>>>,
}

static SERVICE: Mutex<Option<Service>> = Mutex::new(None);

impl Service {
    fn start(addr: &str, key: &JobKey) -> Result<Self> {
        let addr = resolve(addr)?;
        let port = addr.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
        // Rank 0's rendezvous listener when it is this address: the port
        // stays this job's from the rendezvous on.
        let listener = match port.and_then(wm_comm::socket::take_kept_listener) {
            Some(l) => l,
            None => TcpListener::bind(&addr)
                .map_err(|e| Error::io(format!("serving the table catalogue at {addr} (the job's rendezvous address)"), e))?,
        };
        listener.set_nonblocking(false).map_err(|e| Error::io("the table catalogue's listener", e))?;
        let limit = wm_comm::gate::handshake_limit()?;
        let tables: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let (t, k) = (tables.clone(), key.clone());
        let gate = Gate::new("the table catalogue");
        std::thread::Builder::new()
            .name("wm-onesided-catalogue".into())
            .spawn(move || {
                for s in listener.incoming() {
                    let s = match s {
                        Ok(s) => s,
                        Err(e) => {
                            // Out of descriptors, say: do not spin.
                            wm_comm::warn(&format!("the table catalogue: accepting failed: {e}"));
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        }
                    };
                    let from = s.peer_addr().map_or_else(|_| "an unknown address".to_owned(), |a| a.to_string());
                    let peer = s.peer_addr().map_or_else(|_| from.clone(), |a| a.ip().to_string());
                    let Ok(kill) = s.try_clone() else { continue };
                    let ticket = match gate.admit(&peer, 2, Box::new(move || Shut::Tcp(kill).shutdown())) {
                        Ok(t) => t,
                        Err(why) => {
                            wm_comm::warn(&format!("the table catalogue refused {from}: {why}"));
                            continue;
                        }
                    };
                    let (t, k) = (t.clone(), k.clone());
                    let spawned = std::thread::Builder::new().name("wm-onesided-lookup".into()).spawn(move || {
                        if let Err(why) = answer(s, &t, &k, Instant::now() + limit, &ticket)
                            && !ticket.evicted()
                        {
                            wm_comm::warn(&format!("the table catalogue refused {from}: {why}"));
                        }
                        drop(ticket);
                    });
                    drop(spawned);
                }
            })
            .map_err(|e| Error::io("starting the table catalogue", e))?;
        Ok(Self { addr, fingerprint: key.fingerprint(), tables })
    }
}

/// One lookup: the handshake, a name, the record or "not published".
fn answer(
    mut s: TcpStream,
    tables: &Mutex<HashMap<String, Vec<u8>>>,
    key: &JobKey,
    deadline: Instant,
    ticket: &wm_comm::gate::Ticket,
) -> std::result::Result<(), String> {
    let (_, session) = auth::serve_reader(&mut s, key, CATALOGUE_NONCE, deadline)?;
    ticket.authenticated();
    let mut s = Sealed::new(s, session);
    let mut len = [0u8; 2];
    auth::read_by(&mut s, &mut len, deadline).map_err(|e| format!("no name arrived: {e}"))?;
    let len = u16::from_le_bytes(len) as usize;
    if len > 64 {
        return Err(format!("a table name of {len} bytes"));
    }
    let mut name = vec![0u8; len];
    auth::read_by(&mut s, &mut name, deadline).map_err(|e| format!("no name arrived: {e}"))?;
    let record = std::str::from_utf8(&name).ok().and_then(|n| tables.lock().unwrap_or_else(|p| p.into_inner()).get(n).cloned());
    let mut reply = Vec::new();
    match record {
        Some(r) => {
            reply.push(0);
            reply.extend_from_slice(&(r.len() as u32).to_le_bytes());
            reply.extend_from_slice(&r);
        }
        None => reply.extend_from_slice(&[1, 0, 0, 0, 0]),
    }
    auth::write_by(&mut s, &reply, deadline).map_err(|e| e.to_string())
}
