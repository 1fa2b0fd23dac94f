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
//! A record only says where the owners' read servers are; every server
//! then checks the reader's key again (and the reader checks the
//! server's), so a planted record leads nowhere.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wm_comm::auth::{self, ReaderId};
use wm_comm::session::Sealed;
use wm_comm::{JobKey, Rendezvous};

use crate::record::RECORD_MAX;
use crate::{Error, Result};

/// The nonce readers name when they call a catalogue.
const CATALOGUE_NONCE: u64 = 0;
/// Lookups a catalogue serves at once.
const IN_FLIGHT_MAX: usize = 64;
/// Longest a lookup may take a catalogue.
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
    match at {
        Rendezvous::Dir(dir) => write_private(&record_file(dir, name), record)
            .map_err(|e| Error::io(format!("publishing table {name:?} in {}", dir.display()), e)),
        Rendezvous::Tcp(addr) => {
            let mut svc = SERVICE.lock().unwrap_or_else(|p| p.into_inner());
            if svc.is_none() {
                *svc = Some(Service::start(addr, key)?);
            }
            let s = svc.as_ref().ok_or_else(|| Error::InvalidArgument("no catalogue".into()))?;
            if s.fingerprint != key.fingerprint() {
                return Err(Error::InvalidArgument(format!("this process already serves a catalogue at {} for another job key", s.addr)));
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
}

/// Looks a table up once.
///
/// # Errors
/// A catalogue that refuses this reader (the wrong key) or breaks the
/// protocol; a record file that cannot be read.
pub(crate) fn lookup(at: &Rendezvous, name: &str, key: &JobKey, timeout: Duration) -> Result<Found> {
    match at {
        Rendezvous::Dir(dir) => {
            let path = record_file(dir, name);
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Nothing(format!("{} does not exist", path.display()))),
                Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
            };
            if meta.len() > RECORD_MAX as u64 {
                return Err(Error::Malformed {
                    from: path.display().to_string(),
                    detail: format!("a record of {} bytes (at most {RECORD_MAX})", meta.len()),
                });
            }
            match std::fs::read(&path) {
                Ok(b) => Ok(Found::Record(b)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Nothing(format!("{} does not exist", path.display()))),
                Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
            }
        }
        Rendezvous::Tcp(addr) => ask(&resolve(addr)?, name, key, timeout),
    }
}

/// `host:port`, with port 0 read from `WM_RENDEZVOUS_PORT_FILE`.
fn resolve(addr: &str) -> Result<String> {
    match addr.rsplit_once(':') {
        Some((host, "0")) => {
            let var = wm_topology::env::WM_RENDEZVOUS_PORT_FILE;
            let path = var.get().ok_or_else(|| {
                Error::InvalidArgument(format!("the rendezvous {addr} has port 0: name the job's port, or set {}", var.name))
            })?;
            let port: u16 = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .filter(|&p| p != 0)
                .ok_or_else(|| Error::InvalidArgument(format!("{} ({path}) holds no port", var.name)))?;
            Ok(format!("{host}:{port}"))
        }
        _ => Ok(addr.to_owned()),
    }
}

fn ask(addr: &str, name: &str, key: &JobKey, timeout: Duration) -> Result<Found> {
    let deadline = Instant::now() + timeout.min(LOOKUP_LIMIT);
    let target = match addr.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return Err(Error::InvalidArgument(format!("{addr} resolves to nothing"))),
        Err(e) => return Err(Error::io(format!("resolving {addr}"), e)),
    };
    let mut s = match TcpStream::connect_timeout(&target, timeout.min(LOOKUP_LIMIT)) {
        Ok(s) => s,
        Err(e) => return Ok(Found::Nothing(format!("nothing answers at {addr} ({e})"))),
    };
    let session = match auth::call_as_reader(&mut s, key, ReaderId::Outside, CATALOGUE_NONCE, deadline) {
        Ok(session) => session,
        Err(detail) => return Err(Error::Refused { at: format!("the catalogue at {addr}"), detail }),
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
        0 if len <= RECORD_MAX => {
            // Grows as the bytes arrive, never to the announced length first.
            let mut body = Vec::new();
            Read::by_ref(&mut s).take(len as u64).read_to_end(&mut body).map_err(io_err)?;
            if body.len() < len {
                return Err(bad(format!("a record cut short at {} of {len} bytes", body.len())));
            }
            Ok(Found::Record(body))
        }
        0 => Err(bad(format!("a record of {len} bytes (at most {RECORD_MAX})"))),
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
        let listener = TcpListener::bind(&addr)
            .map_err(|e| Error::io(format!("serving the table catalogue at {addr} (the job's rendezvous address)"), e))?;
        let tables: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let (t, k) = (tables.clone(), key.clone());
        let in_flight = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new()
            .name("wm-onesided-catalogue".into())
            .spawn(move || {
                for s in listener.incoming() {
                    let Ok(s) = s else { continue };
                    let from = s.peer_addr().map_or_else(|_| "an unknown address".to_owned(), |a| a.to_string());
                    if in_flight.load(Ordering::Relaxed) >= IN_FLIGHT_MAX {
                        wm_comm::warn(&format!("the table catalogue refused {from}: {IN_FLIGHT_MAX} lookups are in flight"));
                        continue;
                    }
                    in_flight.fetch_add(1, Ordering::Relaxed);
                    let (t, k, n) = (t.clone(), k.clone(), in_flight.clone());
                    let spawned = std::thread::Builder::new().name("wm-onesided-lookup".into()).spawn(move || {
                        if let Err(why) = answer(s, &t, &k) {
                            wm_comm::warn(&format!("the table catalogue refused {from}: {why}"));
                        }
                        n.fetch_sub(1, Ordering::Relaxed);
                    });
                    if spawned.is_err() {
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            })
            .map_err(|e| Error::io("starting the table catalogue", e))?;
        Ok(Self { addr, fingerprint: key.fingerprint(), tables })
    }
}

/// One lookup: the handshake, a name, the record or "not published".
fn answer(mut s: TcpStream, tables: &Mutex<HashMap<String, Vec<u8>>>, key: &JobKey) -> std::result::Result<(), String> {
    let deadline = Instant::now() + LOOKUP_LIMIT;
    let (_, session) = auth::serve_reader(&mut s, key, CATALOGUE_NONCE, deadline)?;
    s.set_read_timeout(Some(LOOKUP_LIMIT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(LOOKUP_LIMIT)).map_err(|e| e.to_string())?;
    let mut s = Sealed::new(s, session);
    let mut len = [0u8; 2];
    s.read_exact(&mut len).map_err(|e| format!("no name arrived: {e}"))?;
    let len = u16::from_le_bytes(len) as usize;
    if len > 64 {
        return Err(format!("a table name of {len} bytes"));
    }
    let mut name = vec![0u8; len];
    s.read_exact(&mut name).map_err(|e| format!("no name arrived: {e}"))?;
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
    s.write_all(&reply).map_err(|e| e.to_string())
}
