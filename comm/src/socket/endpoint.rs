//! One process's connections to every other rank, and the progress engine
//! that moves frames over them.
//!
//! Every communicator of a process shares one [`Endpoint`]: frames carry a
//! communicator id, and a frame that arrives before anyone asked for it waits
//! in its sender's stash. While an operation waits it polls **every** peer, so
//! a peer that dies is noticed whichever communicator is in use; the endpoint
//! is then broken, tells the other peers (an abort frame naming the lost rank)
//! and every later operation fails with the same error.
//!
//! Every byte on a connection travels in the records of its [`Session`]
//! (`session`): each frame is sealed as records of its own as it goes out,
//! and bytes are read a record at a time, opened, and only then parsed as
//! frames. A record that does not open is a protocol error naming the peer.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use wm_topology::NodeIdentity;

use super::wire::{HEADER_LEN, Header, Kind, Op};
use crate::session::{Opener, PREFIX, RECORD_MAX, Sealer, Session, TAG};
use crate::sys;
use crate::{Error, Result};

/// A connection to one peer.
#[derive(Debug)]
pub(crate) enum Conn {
    /// Same node: a Unix-domain stream (can carry descriptors).
    Unix(UnixStream),
    /// Another node: TCP.
    Tcp(TcpStream),
}

impl Conn {
    fn fd(&self) -> RawFd {
        match self {
            Conn::Unix(s) => s.as_raw_fd(),
            Conn::Tcp(s) => s.as_raw_fd(),
        }
    }
    fn is_unix(&self) -> bool {
        matches!(self, Conn::Unix(_))
    }
}

/// A complete frame that arrived.
#[derive(Debug)]
pub(crate) struct Msg {
    pub hdr: Header,
    /// The payload; of a landed frame, only its head.
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
    /// Whether the payload's rows were received straight into their
    /// places ([`Sink`]); `payload` then holds the sink's head only.
    pub landed: bool,
}

/// Where the payload of one awaited frame lands instead of a buffer of its
/// own: its first `head` bytes in a small buffer (the frame's [`Msg`]),
/// then rows of `row` bytes, row `k` at `out[rows[k] * row..]` of the
/// operation's [`Land`]. Only a frame of exactly that length, with no
/// descriptors, lands; any other is received as usual.
#[derive(Debug)]
pub(crate) struct Sink<'a> {
    pub from: usize,
    pub comm: u64,
    pub op: Op,
    pub seq: u64,
    pub head: usize,
    pub row: usize,
    /// Each row's place, checked by the caller to lie within `out`.
    pub rows: &'a [usize],
}

impl Sink<'_> {
    /// The payload length that lands (none for rows of no bytes: such a
    /// sink lands nothing).
    fn len(&self) -> Option<u64> {
        if self.row == 0 {
            return None;
        }
        let n = self.rows.len().checked_mul(self.row)?.checked_add(self.head)?;
        u64::try_from(n).ok()
    }

    /// Puts `bytes`, the payload from byte `at` on, in their places: the
    /// head's part into `head`, the rest into the rows of `out`.
    fn place(&self, head: &mut [u8], out: &mut [u8], mut at: usize, mut bytes: &[u8]) {
        if at < self.head {
            let n = (self.head - at).min(bytes.len());
            head[at..at + n].copy_from_slice(&bytes[..n]);
            at += n;
            bytes = &bytes[n..];
        }
        while !bytes.is_empty() {
            let body = at - self.head;
            let (k, skip) = (body / self.row, body % self.row);
            let n = (self.row - skip).min(bytes.len());
            let to = self.rows[k] * self.row + skip;
            out[to..to + n].copy_from_slice(&bytes[..n]);
            at += n;
            bytes = &bytes[n..];
        }
    }
}

/// The memory one operation's [`Sink`]s land in.
pub(crate) struct Land<'a> {
    pub out: &'a mut [u8],
    pub sinks: &'a [Sink<'a>],
}

/// A frame being received.
#[derive(Debug)]
enum Body {
    /// Into a buffer of its own, which holds the payload bytes received so
    /// far and grows as more arrive ([`grow`]).
    Buffered { hdr: Header, buf: Vec<u8> },
    /// Into the operation's [`Land`], by `sinks[sink]`: its head, and the
    /// payload bytes received.
    Landing { hdr: Header, head: Vec<u8>, received: usize, sink: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerState {
    Open,
    /// Said goodbye; its end may be closed.
    Finished,
}

#[derive(Debug)]
struct Peer {
    conn: Option<Conn>,
    state: PeerState,
    /// Seals what goes to the peer (`None` for this rank itself).
    sealer: Option<Sealer>,
    opener: Option<Opener>,
    /// The record being received: `rec_got` of its `rec_need` bytes
    /// (its prefix's, until the prefix has arrived); over TCP up to a
    /// prefix of the next record may follow it.
    rec: Vec<u8>,
    rec_got: usize,
    rec_need: usize,
    hdr: [u8; HEADER_LEN],
    hdr_got: usize,
    body: Option<Body>,
    stash: VecDeque<Msg>,
    fds: VecDeque<OwnedFd>,
    /// Why the connection is gone, when it closed without a goodbye while
    /// frames it had sent were still stashed: those are taken first, and
    /// a call that needs more of the peer fails with this.
    gone: Option<String>,
    /// Whether a frame to the peer is under way (a record of it sealed,
    /// and not all of it sent): nothing else may be written to the peer
    /// until it ends, an abort or a goodbye included, which would land
    /// inside the frame and read there as tampering.
    mid_frame: bool,
}

impl Peer {
    fn new(link: Option<(Conn, Session)>) -> Self {
        let (conn, sealer, opener) = match link {
            Some((c, s)) => (Some(c), Some(s.sealer), Some(s.opener)),
            None => (None, None, None),
        };
        Self {
            conn,
            state: PeerState::Open,
            sealer,
            opener,
            rec: Vec::new(),
            rec_got: 0,
            rec_need: PREFIX,
            hdr: [0; HEADER_LEN],
            hdr_got: 0,
            body: None,
            stash: VecDeque::new(),
            fds: VecDeque::new(),
            gone: None,
            mid_frame: false,
        }
    }

    /// `plain` sealed for this peer (empty when there is no connection).
    fn sealed(&mut self, plain: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(s) = &mut self.sealer {
            s.seal(plain, &mut out);
        }
        out
    }
}

/// Memory a frame's buffer may hold beyond the payload bytes that have
/// arrived: the per-connection cap on what a declared length alone can
/// make this process allocate.
pub(crate) const AHEAD_MAX: usize = 64 << 20;

/// Makes room in `buf` for `n` more bytes of a payload of `declared`
/// bytes: it doubles (at least a record's worth), never past the declared
/// length and never more than [`AHEAD_MAX`] beyond what arrived.
fn grow(buf: &mut Vec<u8>, n: usize, declared: usize) -> Result<(), std::collections::TryReserveError> {
    if buf.capacity() - buf.len() >= n {
        return Ok(());
    }
    let ahead = buf.len().clamp(RECORD_MAX, AHEAD_MAX).max(n).min(declared - buf.len());
    buf.try_reserve_exact(ahead)
}

/// How far one outgoing frame has gone: its header and payload are sealed
/// a record at a time, and each record is sent before the next is sealed.
#[derive(Debug, Default)]
struct Sending {
    /// Records sealed (the first carries the header).
    records: usize,
    /// Bytes of the payload sealed so far.
    sealed: usize,
    /// The record staged to send, when it is not in place: the header's
    /// (with a shared payload's first bytes), or a copy of a shared
    /// payload's bytes.
    buf: Vec<u8>,
    /// The record staged to send when it was sealed in a spent payload:
    /// its prefix, the payload's bytes that are its body, its tag.
    in_place: Option<([u8; PREFIX], Range<usize>, [u8; TAG])>,
    /// Bytes of the staged record sent.
    sent: usize,
}

/// Spent payloads shorter than this are sealed in a copy like shared ones,
/// in the same record as their header (one record, one system call).
const IN_PLACE_MIN: usize = 64 << 10;

/// How long an operation polls its peers, at most, while another thread
/// of this process waits for the endpoint, before it hands the endpoint
/// over ([`Endpoint::hand_over`]).
const HANDOVER_POLL_MS: u128 = 5;

impl Sending {
    /// Bytes of the record staged.
    fn staged(&self) -> usize {
        match &self.in_place {
            Some((_, body, _)) => PREFIX + body.len() + TAG,
            None => self.buf.len(),
        }
    }

    fn done(&self, o: &Outgoing<'_>) -> bool {
        self.records > 0 && self.sealed == o.payload.len() && self.sent == self.staged()
    }

    /// Whether no byte of `o` is on its way: not begun, or all sent. Only
    /// then may another operation write to the same peer, whose records
    /// must follow each other whole and in the order they were sealed.
    fn between_frames(&self, o: &Outgoing<'_>) -> bool {
        self.records == 0 || self.done(o)
    }

    /// Seals the next record of `o` (its header first) with `sealer`: a
    /// spent payload where it lies, a shared one into `buf`.
    fn seal_more(&mut self, sealer: &mut Sealer, hdr: &[u8; HEADER_LEN], o: &mut Outgoing<'_>) {
        self.buf.clear();
        self.in_place = None;
        self.sent = 0;
        let len = o.payload.len();
        let first = self.records == 0;
        self.records += 1;
        match &mut o.payload {
            Payload::Spent(p) if len >= IN_PLACE_MIN => {
                if first {
                    sealer.seal_record(hdr, &mut self.buf);
                } else {
                    let body = self.sealed..len.min(self.sealed + RECORD_MAX);
                    let (prefix, tag) = sealer.seal_in_place(&mut p[body.clone()]);
                    self.sealed = body.end;
                    self.in_place = Some((prefix, body, tag));
                }
            }
            p => {
                let p = p.bytes();
                if first {
                    let n = len.min(RECORD_MAX - HEADER_LEN);
                    sealer.seal_parts(&[hdr, &p[..n]], &mut self.buf);
                    self.sealed = n;
                } else {
                    let end = len.min(self.sealed + RECORD_MAX);
                    sealer.seal_record(&p[self.sealed..end], &mut self.buf);
                    self.sealed = end;
                }
            }
        }
    }
}

/// `parts` without their first `at` bytes.
fn skip(parts: [&[u8]; 3], mut at: usize) -> [&[u8]; 3] {
    parts.map(|p| {
        let n = at.min(p.len());
        at -= n;
        &p[n..]
    })
}

/// Why the endpoint stopped working.
#[derive(Debug, Clone)]
struct Broken {
    rank: usize,
    detail: String,
}

#[derive(Debug)]
struct State {
    peers: Vec<Peer>,
    broken: Option<Broken>,
    /// Communicators whose ranks fell out of step (a collective mismatch):
    /// their frames can no longer be matched, so every later call fails.
    poisoned: Vec<(u64, String)>,
    /// Payload buffers handed back by callers, reused for large frames so a
    /// steady stream of exchanges does not fault in fresh pages each time.
    spare: crate::BufferPool<u8>,
}

/// Longest reason an abort frame carries, in bytes.
const REASON_MAX: usize = 1024;

/// Frames at least this large take their buffer from the spares.
const SPARE_MIN: usize = 64 << 10;
/// Spares kept at most.
const SPARE_MAX: usize = 16;

/// A frame to send within one operation.
pub(crate) struct Outgoing<'a> {
    pub to: usize,
    pub hdr: Header,
    pub payload: Payload<'a>,
    pub fds: &'a [RawFd],
}

/// The bytes of an outgoing frame.
pub(crate) enum Payload<'a> {
    /// The caller's, left as they are: sealed in a copy.
    Shared(&'a [u8]),
    /// A buffer the caller gives up: sealed where it lies, so under `aead`
    /// it holds ciphertext once the frame has gone (and, should the
    /// operation fail, any mix of plaintext and ciphertext).
    Spent(&'a mut [u8]),
}

impl Payload<'_> {
    pub(crate) fn len(&self) -> usize {
        self.bytes().len()
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Shared(p) => p,
            Payload::Spent(p) => p,
        }
    }
}

/// A frame one operation waits for.
pub(crate) struct Wanted {
    pub from: usize,
    pub kind: Kind,
    pub comm: u64,
    pub op: Op,
    /// Collective sequence number to check (`None` for point-to-point).
    pub seq: Option<u64>,
}

/// The process's connections to all ranks of the world.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub world_rank: usize,
    pub nodes: Vec<NodeIdentity>,
    pub timeout: Duration,
    /// The largest frame payload sent or accepted, in bytes.
    pub max_frame: u64,
    state: Mutex<State>,
    /// Threads of this process waiting for `state`. An operation that waits
    /// on its peers hands the endpoint over to them between its polls, so
    /// that two threads using two communicators each get their frames out:
    /// otherwise one that holds the endpoint waits on a peer whose own
    /// holder waits on this process's other thread, and neither moves.
    waiting: AtomicUsize,
    /// Rung by a thread that starts waiting for `state`, so that the holder,
    /// asleep in its poll of the peers, wakes and hands the endpoint over
    /// at once rather than when its poll times out (up to a second: the
    /// other thread's frames, which the peers may be waiting for, would sit
    /// that long). `None` when no eventfd could be had: then a holder polls
    /// in short turns whenever the endpoint is shared.
    doorbell: Option<sys::Doorbell>,
    /// Polls of 100 ms or more that ran their full length, finding nothing,
    /// while another thread waited for the endpoint (what the doorbell
    /// prevents).
    #[cfg(test)]
    slept_through: AtomicUsize,
}

/// What a read from one peer produced.
enum ReadOutcome {
    Progress(bool),
    Closed,
}

impl Endpoint {
    /// An endpoint over established connections, each with the keys its
    /// handshake gave (`conns[world_rank]` is `None`).
    pub fn new(
        world_rank: usize,
        nodes: Vec<NodeIdentity>,
        conns: Vec<Option<(Conn, Session)>>,
        timeout: Duration,
        max_frame: u64,
    ) -> Self {
        let peers = conns.into_iter().map(Peer::new).collect();
        let state = Mutex::new(State { peers, broken: None, poisoned: Vec::new(), spare: crate::BufferPool::new(SPARE_MIN, SPARE_MAX) });
        Self {
            world_rank,
            nodes,
            timeout,
            max_frame,
            state,
            waiting: AtomicUsize::new(0),
            doorbell: sys::Doorbell::new().ok(),
            #[cfg(test)]
            slept_through: AtomicUsize::new(0),
        }
    }

    /// Number of ranks in the world.
    pub fn world(&self) -> usize {
        self.nodes.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.lock_ringing(true)
    }

    /// Takes the endpoint; with `ring`, a holder asleep in its poll is woken
    /// to hand it over. [`hand_over`](Self::hand_over) takes it back without
    /// ringing: the thread it let in then has a turn of its own (a short
    /// poll, [`HANDOVER_POLL_MS`]) before handing back, where a ring would
    /// pass the endpoint to and fro at once while both threads wait on their
    /// peers, burning the cores the rest of the program needs.
    fn lock_ringing(&self, ring: bool) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves frames half read; the state
        // is still memory-safe, and `broken` will usually be set by then.
        match self.state.try_lock() {
            Ok(st) => return st,
            Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        if let Some(bell) = self.doorbell.as_ref().filter(|_| ring) {
            bell.ring();
        }
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        st
    }

    /// Lets a thread waiting for the endpoint have it, then takes it back.
    /// A frame half received into `land` goes on into a buffer of its own
    /// first ([`Endpoint::suspend`]): the other thread's operation reads
    /// from the same peers and knows nothing of this one's memory.
    fn hand_over<'a>(&'a self, held: &mut Option<MutexGuard<'a, State>>, land: Option<&Land<'_>>) -> Result<()> {
        let waiting = self.waiting.load(Ordering::SeqCst);
        if let Some(st) = held.as_mut() {
            self.suspend(st, land);
        }
        drop(held.take());
        // A mutex may go back to the thread that just let it go: wait, a
        // little, for a waiter to have it.
        let until = Instant::now() + Duration::from_millis(2);
        while self.waiting.load(Ordering::SeqCst) >= waiting && Instant::now() < until {
            std::thread::yield_now();
        }
        let st = held.insert(self.lock_ringing(false));
        match &st.broken {
            Some(b) => Err(Error::PeerLost { rank: b.rank, op: "a collective", detail: b.detail.clone() }),
            None => Ok(()),
        }
    }

    /// Sends `out`, then waits for `want`; returns the wanted frames in order.
    pub fn transact(&self, op: &'static str, out: &mut [Outgoing<'_>], want: &[Wanted]) -> Result<Vec<Msg>> {
        self.transact_with(op, out, want, &mut || false)
    }

    /// [`Endpoint::transact`], with work that does not depend on the frames
    /// overlapping their transfer: `step` does a bounded piece of it and
    /// says whether more remains. It is called after each turn at the
    /// sockets (the first after the first writes) until it is done, and the
    /// call returns only once it is. It runs with the endpoint locked, so it
    /// must not use any communicator of this process.
    pub fn transact_with(
        &self,
        op: &'static str,
        out: &mut [Outgoing<'_>],
        want: &[Wanted],
        step: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<Msg>> {
        self.transact_landing(op, out, want, None, &mut |_| step())
    }

    /// [`Endpoint::transact_with`], where the wanted frames that match a
    /// sink of `land` are received straight into `land.out` (their
    /// [`Msg::landed`] is set), and `step` gets `land.out` (empty without
    /// one) between the reads.
    pub fn transact_landing(
        &self,
        op: &'static str,
        out: &mut [Outgoing<'_>],
        want: &[Wanted],
        mut land: Option<Land<'_>>,
        step: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<Vec<Msg>> {
        let mut held = Some(self.lock());
        let st = held.as_mut().expect("held");
        if let Some(b) = &st.broken {
            return Err(Error::PeerLost { rank: b.rank, op, detail: b.detail.clone() });
        }
        let comms = out.iter().map(|o| o.hdr.comm).chain(want.iter().map(|w| w.comm));
        for c in comms {
            if let Some((_, why)) = st.poisoned.iter().find(|(id, _)| *id == c) {
                return Err(Error::Mismatch { op, detail: format!("this communicator is out of step since an earlier mismatch: {why}") });
            }
        }
        if let Some(o) = out.iter().find(|o| o.payload.len() as u64 > self.max_frame) {
            let detail = format!(
                "a message of {} bytes for rank {} exceeds the frame limit of {} bytes ({})",
                o.payload.len(),
                o.to,
                self.max_frame,
                wm_topology::env::WM_MAX_FRAME_GIB.name
            );
            // The peers would wait for it: tell them this rank gives up.
            self.abandon(st, self.world_rank, &detail);
            return Err(Error::InvalidArgument(detail));
        }
        let res = self.run(&mut held, op, out, want, &mut land, step);
        let st = held.as_mut().expect("the endpoint is held again after every hand-over");
        // No frame may go on landing in `land.out` after this call.
        self.unland(st, land.as_ref());
        if let Err(e) = &res {
            if let Error::Mismatch { detail, .. } = e {
                let ids: Vec<u64> = want.iter().map(|w| w.comm).collect();
                st.poisoned.extend(ids.into_iter().map(|id| (id, detail.clone())));
            }
            self.mark_broken(st, e);
        }
        res
    }

    fn run<'a>(
        &'a self,
        held: &mut Option<MutexGuard<'a, State>>,
        op: &'static str,
        out: &mut [Outgoing<'_>],
        want: &[Wanted],
        land: &mut Option<Land<'_>>,
        step: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<Vec<Msg>> {
        // Whether the caller's work has steps left.
        let mut working = true;
        let headers: Vec<[u8; HEADER_LEN]> = out.iter().map(|o| o.hdr.encode()).collect();
        let mut written: Vec<Sending> = out.iter().map(|_| Sending::default()).collect();
        let mut got: Vec<Option<Msg>> = (0..want.len()).map(|_| None).collect();
        let mut last_progress = Instant::now();
        for o in out.iter() {
            debug_assert_ne!(o.to, self.world_rank, "frames to self are handled by the caller");
            self.check_open(held.as_ref().expect("held"), o.to, op)?;
        }
        // A frame from another collective ends the wait for that peer, but
        // this rank's own frames still go out, so its peers see the mismatch
        // too instead of waiting for them.
        let mut mismatch: Option<Error> = None;
        let mut settled = vec![false; want.len()];
        loop {
            let st = held.as_mut().expect("held");
            // 1. Take what has arrived (another thread's operation may have
            // read it while this one let the endpoint go).
            let mut progress = false;
            for (i, w) in want.iter().enumerate() {
                if got[i].is_none() && !settled[i] {
                    match self.take(st, w, op) {
                        Ok(m) => {
                            progress |= m.is_some();
                            got[i] = m;
                        }
                        Err(e) => {
                            settled[i] = true;
                            mismatch.get_or_insert(e);
                        }
                    }
                }
            }
            // 2. Push what can be written.
            for (i, o) in out.iter_mut().enumerate() {
                progress |= self.write_some(st, o, &headers[i], &mut written[i], op, land)?;
            }
            // The kernel holds what fitted in the sockets: a step of the
            // caller's own work while it moves, then back to the sockets.
            if working {
                working = step(land.as_mut().map_or(&mut [][..], |l| &mut *l.out));
                progress = true;
            }
            let sends_done = out.iter().zip(&written).all(|(o, w)| w.done(o));
            if !working && sends_done && got.iter().zip(&settled).all(|(g, s)| g.is_some() || *s) {
                if let Some(e) = mismatch {
                    return Err(e);
                }
                return Ok(got.into_iter().map(|m| m.expect("all frames arrived")).collect());
            }
            for ((w, slot), s) in want.iter().zip(&got).zip(&settled) {
                if slot.is_none() && !s {
                    self.check_open(st, w.from, op)?;
                }
            }
            // 3. Wait on every peer: what we need, and news of the dead.
            let mut pfds = Vec::with_capacity(st.peers.len());
            let mut who = Vec::with_capacity(st.peers.len());
            for (rank, p) in st.peers.iter().enumerate() {
                if let Some(c) = &p.conn {
                    let sending = out.iter().zip(&written).any(|(o, w)| o.to == rank && !w.done(o));
                    let events = libc::POLLIN | if sending { libc::POLLOUT } else { 0 };
                    pfds.push(libc::pollfd { fd: c.fd(), events, revents: 0 });
                    who.push(rank);
                }
            }
            if let Some(bell) = &self.doorbell {
                pfds.push(libc::pollfd { fd: bell.fd(), events: libc::POLLIN, revents: 0 });
            }
            let left = self.timeout.saturating_sub(last_progress.elapsed());
            // Another thread waits for the endpoint: look briefly, then let
            // it have its turn (below). A thread that starts waiting during
            // the poll rings the doorbell, which ends it.
            let others = self.waiting.load(Ordering::SeqCst) > 0;
            let turn = if others || self.doorbell.is_none() { HANDOVER_POLL_MS } else { 1000 };
            // With work left, only look: the next step is ready to run.
            let wait_ms = if working { 0 } else { left.as_millis().clamp(1, turn) as i32 };
            let events = sys::poll(&mut pfds, wait_ms).map_err(|e| Error::io("poll on peer sockets", e))?;
            #[cfg(test)]
            if events == 0 && wait_ms >= 100 && self.waiting.load(Ordering::SeqCst) > 0 {
                self.slept_through.fetch_add(1, Ordering::SeqCst);
            }
            #[cfg(not(test))]
            let _ = events;
            if let Some(bell) = &self.doorbell {
                if pfds.pop().is_some_and(|p| p.revents != 0) {
                    bell.answer();
                }
            }
            let others = self.waiting.load(Ordering::SeqCst) > 0;
            for (pfd, &rank) in pfds.iter().zip(&who) {
                if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    progress |= self.read_peer(st, rank, op, land)?;
                }
            }
            if progress {
                last_progress = Instant::now();
            } else if last_progress.elapsed() >= self.timeout {
                let mut ranks: Vec<usize> =
                    want.iter().zip(&got).zip(&settled).filter(|((_, g), s)| g.is_none() && !**s).map(|((w, _), _)| w.from).collect();
                ranks.extend(out.iter().zip(&written).filter(|(o, w)| !w.done(o)).map(|(o, _)| o.to));
                ranks.sort_unstable();
                ranks.dedup();
                return Err(Error::Timeout { op, ranks, secs: self.timeout.as_secs_f64() });
            }
            // Between whole frames only: a peer's records follow each other
            // in the order they were sealed.
            if others && out.iter().zip(&written).all(|(o, w)| w.between_frames(o)) {
                self.hand_over(held, land.as_ref())?;
            }
        }
    }

    /// Ends `land`'s use: a frame still landing (an operation that failed
    /// midway) goes on into a buffer of its own, holding what landed so
    /// far, so the stream stays in step; landed frames nobody took are
    /// dropped (their rows are in memory this call no longer holds).
    fn unland(&self, st: &mut State, land: Option<&Land<'_>>) {
        let Some(land) = land else { return };
        for (rank, peer) in st.peers.iter_mut().enumerate() {
            // Only this operation's: another thread's may wait there too.
            let ours = |m: &Msg| land.sinks.iter().any(|s| s.from == rank && (s.comm, s.op, s.seq) == (m.hdr.comm, m.hdr.op, m.hdr.seq));
            peer.stash.retain(|m| !(m.landed && ours(m)));
        }
        self.suspend(st, Some(land));
    }

    /// A frame still landing in `land.out` goes on into a buffer of its
    /// own, holding what landed so far, so the stream stays in step
    /// whichever operation reads on.
    fn suspend(&self, st: &mut State, land: Option<&Land<'_>>) {
        let Some(land) = land else { return };
        for rank in 0..st.peers.len() {
            let peer = &mut st.peers[rank];
            // A frame of a later operation, already under way, stays.
            if !matches!(peer.body, Some(Body::Landing { .. })) {
                continue;
            }
            let Some(Body::Landing { hdr, head, received: got, sink }) = peer.body.take() else { continue };
            let s = &land.sinks[sink];
            // What landed so far; the rest grows the buffer as it comes.
            let mut buf = match zeroed(got) {
                Ok(b) => b,
                Err(e) => {
                    peer.conn = None;
                    self.abandon(st, self.world_rank, &format!("cannot allocate {got} bytes for a frame from rank {rank}: {e}"));
                    continue;
                }
            };
            let h = got.min(s.head);
            buf[..h].copy_from_slice(&head[..h]);
            for (k, &r) in s.rows.iter().enumerate() {
                let at = s.head + k * s.row;
                if at >= got {
                    break;
                }
                let n = s.row.min(got - at);
                buf[at..at + n].copy_from_slice(&land.out[r * s.row..][..n]);
            }
            peer.body = Some(Body::Buffered { hdr, buf });
        }
    }

    /// Fails when nothing more can come from or go to `rank`. Called for a
    /// wanted frame only when it is not in the stash.
    fn check_open(&self, st: &State, rank: usize, op: &'static str) -> Result<()> {
        let p = &st.peers[rank];
        if p.state == PeerState::Finished {
            return Err(Error::PeerLost { rank, op, detail: "it had already shut down its communicator".into() });
        }
        if p.conn.is_none() {
            let detail = p.gone.clone().unwrap_or_else(|| "its connection is closed".into());
            return Err(Error::PeerLost { rank, op, detail });
        }
        Ok(())
    }

    /// Takes the first stashed frame of `w`'s communicator and kind from its
    /// sender, checking that it belongs to the same collective.
    fn take(&self, st: &mut State, w: &Wanted, op: &'static str) -> Result<Option<Msg>> {
        let stash = &mut st.peers[w.from].stash;
        let Some(pos) = stash.iter().position(|m| m.hdr.comm == w.comm && m.hdr.kind == w.kind) else {
            return Ok(None);
        };
        let m = stash.remove(pos).expect("position is in range");
        if let Some(seq) = w.seq
            && (m.hdr.seq != seq || m.hdr.op != w.op)
        {
            return Err(Error::Mismatch {
                op,
                detail: format!(
                    "rank {} is in {} #{} while rank {} is in {} #{} on the same communicator",
                    w.from,
                    m.hdr.op.name(),
                    m.hdr.seq,
                    self.world_rank,
                    w.op.name(),
                    seq
                ),
            });
        }
        Ok(Some(m))
    }

    fn write_some(
        &self,
        st: &mut State,
        o: &mut Outgoing<'_>,
        hdr: &[u8; HEADER_LEN],
        s: &mut Sending,
        op: &'static str,
        land: &mut Option<Land<'_>>,
    ) -> Result<bool> {
        let peer = &mut st.peers[o.to];
        let (Some(conn), Some(sealer)) = (&peer.conn, &mut peer.sealer) else {
            let detail = peer.gone.as_deref().unwrap_or("its connection is closed");
            return if s.done(o) { Ok(false) } else { Err(self.lost(o.to, op, detail)) };
        };
        let fd = conn.fd();
        let mut progress = false;
        while !s.done(o) {
            if s.sent == s.staged() {
                s.seal_more(sealer, hdr, o);
                peer.mid_frame = true;
            }
            // Descriptors ride on the first byte of the frame's first record.
            let r = if s.records == 1 && s.sent == 0 && !o.fds.is_empty() {
                sys::send_with_fds(fd, &s.buf, o.fds)
            } else if let Some((prefix, body, tag)) = &s.in_place {
                // Prefix, body and tag of a record sealed in place: one call.
                sys::send_vectored(fd, &skip([prefix, &o.payload.bytes()[body.clone()], tag], s.sent))
            } else {
                sys::send(fd, &s.buf[s.sent..])
            };
            match r {
                Ok(n) => {
                    s.sent += n;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN)) => {
                    // The peer may have said why before it went: an abort it
                    // sent names the rank that was really lost.
                    self.read_frames(st, o.to, land)?;
                    return Err(self.lost(o.to, op, &format!("sending to it failed: {e}")));
                }
                Err(e) => return Err(self.lost(o.to, op, &format!("sending to it failed midway: {e}"))),
            }
        }
        st.peers[o.to].mid_frame = !s.done(o);
        Ok(progress)
    }

    /// Reads whatever `rank` has sent, completing frames into its stash.
    fn read_peer(&self, st: &mut State, rank: usize, op: &'static str, land: &mut Option<Land<'_>>) -> Result<bool> {
        match self.read_frames(st, rank, land) {
            Ok(ReadOutcome::Progress(p)) => Ok(p),
            Ok(ReadOutcome::Closed) => {
                const GONE: &str = "its connection closed without a goodbye (the process died or was killed)";
                let p = &mut st.peers[rank];
                p.conn = None;
                if p.state == PeerState::Finished {
                    Ok(true)
                } else if p.stash.is_empty() {
                    Err(self.lost(rank, op, GONE))
                } else {
                    // Frames it sent before it went, read in the same turn
                    // as the close, are delivered first; what needs more
                    // of it fails naming it (`check_open`, `write_some`).
                    p.gone = Some(GONE.into());
                    Ok(true)
                }
            }
            Err(e) => Err(e),
        }
    }

    fn read_frames(&self, st: &mut State, rank: usize, land: &mut Option<Land<'_>>) -> Result<ReadOutcome> {
        let mut progress = false;
        loop {
            let peer = &mut st.peers[rank];
            let Some(conn) = &peer.conn else { return Ok(ReadOutcome::Closed) };
            let fd = conn.fd();
            let unix = conn.is_unix();
            // A record's prefix, then its body and tag: on a Unix socket never
            // past the record, so descriptors (on a frame's first byte)
            // arrive with the prefix of the record they came with; over TCP
            // the next record's prefix comes in the same call as the body.
            let (got, need) = (peer.rec_got, peer.rec_need);
            let upto = if unix || need == PREFIX { need } else { need + PREFIX };
            if peer.rec.len() < upto {
                peer.rec.resize(upto, 0);
            }
            let r = if got < PREFIX && unix {
                let mut fds = Vec::new();
                let r = sys::recv_with_fds(fd, &mut peer.rec[got..PREFIX], &mut fds);
                peer.fds.extend(fds);
                r
            } else {
                sys::recv(fd, &mut peer.rec[got..upto])
            };
            let n = match r {
                Ok(0) => return Ok(ReadOutcome::Closed),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ReadOutcome::Progress(progress)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) => {
                    return Ok(ReadOutcome::Closed);
                }
                Err(e) => return Err(self.lost(rank, "receiving", &format!("its stream cannot be read any more: {e}"))),
            };
            progress = true;
            st.peers[rank].rec_got += n;
            self.open_records(st, rank, land)?;
        }
    }

    /// Opens and feeds every record of `rank` whose bytes have all
    /// arrived; a prefix that arrived behind one is kept for the next.
    fn open_records(&self, st: &mut State, rank: usize, land: &mut Option<Land<'_>>) -> Result<()> {
        let bad = |detail: String| Error::Protocol { rank, op: "receiving", detail };
        loop {
            let peer = &mut st.peers[rank];
            if peer.rec_need == PREFIX {
                if peer.rec_got < PREFIX {
                    return Ok(());
                }
                let prefix: [u8; PREFIX] = peer.rec[..PREFIX].try_into().expect("8 bytes");
                let opener = peer.opener.as_ref().expect("a connection has its keys");
                peer.rec_need = PREFIX + opener.rest(&prefix).map_err(|e| bad(format!("its stream does not authenticate: {e}")))?;
            }
            if peer.rec_got < peer.rec_need {
                return Ok(());
            }
            let mut rec = std::mem::take(&mut peer.rec);
            let (len, extra) = (peer.rec_need, peer.rec_got - peer.rec_need);
            (peer.rec_got, peer.rec_need) = (0, PREFIX);
            let opener = peer.opener.as_mut().expect("a connection has its keys");
            let fed = match opener.open(&mut rec[..len]) {
                Ok(plain) => self.feed(st, rank, plain, land),
                Err(e) => Err(bad(format!("its stream does not authenticate: {e}"))),
            };
            rec.copy_within(len..len + extra, 0);
            let peer = &mut st.peers[rank];
            peer.rec = rec;
            peer.rec_got = extra;
            fed?;
        }
    }

    /// Parses `plain`, bytes of `rank`'s stream that opened, as frames:
    /// headers checked before anything is allocated, payloads into buffers
    /// that grow as they arrive (or into their rows), complete frames into
    /// the stash.
    fn feed(&self, st: &mut State, rank: usize, mut plain: &[u8], land: &mut Option<Land<'_>>) -> Result<()> {
        loop {
            let State { peers, spare, broken, .. } = &mut *st;
            let peer = &mut peers[rank];
            let unix = peer.conn.as_ref().is_some_and(Conn::is_unix);
            let complete = match &mut peer.body {
                None => {
                    if plain.is_empty() {
                        return Ok(());
                    }
                    let n = (HEADER_LEN - peer.hdr_got).min(plain.len());
                    peer.hdr[peer.hdr_got..peer.hdr_got + n].copy_from_slice(&plain[..n]);
                    plain = &plain[n..];
                    peer.hdr_got += n;
                    if peer.hdr_got < HEADER_LEN {
                        continue;
                    }
                    peer.hdr_got = 0;
                    self.begin_body(rank, peer, spare, land.as_ref(), unix)?
                }
                Some(Body::Buffered { hdr, buf }) => {
                    if plain.is_empty() {
                        return Ok(());
                    }
                    let declared = hdr.len as usize;
                    let n = (declared - buf.len()).min(plain.len());
                    grow(buf, n, declared).map_err(|e| {
                        let detail = format!("cannot allocate memory for a frame of {declared} bytes from rank {rank}: {e}");
                        Error::Protocol { rank: self.world_rank, op: "receiving", detail }
                    })?;
                    buf.extend_from_slice(&plain[..n]);
                    plain = &plain[n..];
                    buf.len() == declared
                }
                Some(Body::Landing { hdr, head, received: got, sink }) => {
                    if plain.is_empty() {
                        return Ok(());
                    }
                    // A landing body exists only while its operation runs
                    // (`unland` ends it), unless that operation panicked midway.
                    let Some(l) = land.as_mut() else {
                        let detail = format!("a frame from rank {rank} was left half received by an operation that panicked");
                        return Err(Error::Protocol { rank: self.world_rank, op: "receiving", detail });
                    };
                    let n = (hdr.len as usize - *got).min(plain.len());
                    l.sinks[*sink].place(head, l.out, *got, &plain[..n]);
                    plain = &plain[n..];
                    *got += n;
                    *got as u64 == hdr.len
                }
            };
            if complete {
                self.finish_frame(rank, peer, broken)?;
            }
        }
    }

    /// Starts the frame whose header `rank`'s peer has just completed:
    /// checks it before anything is allocated (length within the limit,
    /// descriptors as announced), then receives its payload into the
    /// matching sink of `land` or into a buffer of its own. Returns whether
    /// the frame is complete already (no payload).
    fn begin_body(
        &self,
        rank: usize,
        peer: &mut Peer,
        spare: &mut crate::BufferPool<u8>,
        land: Option<&Land<'_>>,
        unix: bool,
    ) -> Result<bool> {
        let bad = |detail: String| Error::Protocol { rank, op: "receiving", detail };
        let hdr = Header::decode(&peer.hdr).map_err(|e| bad(format!("its stream is garbled: {e}")))?;
        let limit = if matches!(hdr.kind, Kind::Data) { self.max_frame } else { REASON_MAX as u64 };
        if hdr.len > limit {
            return Err(bad(format!(
                "it announced a {} frame of {} bytes; the limit is {limit} bytes ({})",
                hdr.op.name(),
                hdr.len,
                wm_topology::env::WM_MAX_FRAME_GIB.name
            )));
        }
        let nfds = usize::from(hdr.nfds);
        let fds_allowed = matches!(hdr.kind, Kind::Data | Kind::Fds) && unix && nfds <= sys::MAX_FDS;
        if peer.fds.len() != nfds || (nfds > 0 && !fds_allowed) {
            let detail = format!("it sent {} descriptors with a {:?} frame announcing {nfds}", peer.fds.len(), hdr.kind);
            // Close what came unannounced before reporting it.
            peer.fds.clear();
            return Err(bad(detail));
        }
        // Bounded above by the limit, so this fits a usize.
        let len = hdr.len as usize;
        let sink = land.and_then(|l| {
            l.sinks.iter().position(|s| {
                s.from == rank
                    && (s.comm, s.op, s.seq) == (hdr.comm, hdr.op, hdr.seq)
                    && hdr.kind == Kind::Data
                    && nfds == 0
                    && s.len() == Some(hdr.len)
            })
        });
        if let Some(sink) = sink {
            let head = land.map_or(0, |l| l.sinks[sink].head);
            peer.body = Some(Body::Landing { hdr, head: vec![0; head], received: 0, sink });
        } else {
            // A kept buffer when one is large enough; otherwise
            // one that grows as the payload arrives.
            let buf = if len >= SPARE_MIN { spare.reuse(len).unwrap_or_default() } else { Vec::new() };
            peer.body = Some(Body::Buffered { hdr, buf });
        }
        Ok(len == 0)
    }

    /// Hands over the frame `rank`'s peer has just completed: a goodbye
    /// closes the peer, an abort breaks the endpoint naming the lost rank,
    /// data and descriptors go to the stash.
    fn finish_frame(&self, rank: usize, peer: &mut Peer, broken: &mut Option<Broken>) -> Result<()> {
        let (hdr, payload, landed) = match peer.body.take() {
            Some(Body::Buffered { hdr, buf }) => (hdr, buf, false),
            Some(Body::Landing { hdr, head, .. }) => (hdr, head, true),
            None => return Ok(()),
        };
        let fds: Vec<OwnedFd> = peer.fds.drain(..).collect();
        match hdr.kind {
            Kind::Bye => peer.state = PeerState::Finished,
            Kind::Abort => {
                let lost = usize::try_from(hdr.seq).ok().filter(|&r| r < self.world());
                let Some(lost) = lost else {
                    return Err(Error::Protocol { rank, op: "receiving", detail: format!("it reported losing rank {}", hdr.seq) });
                };
                let why = String::from_utf8_lossy(&payload);
                let detail = if lost == rank {
                    format!("rank {rank} gave up: {why}")
                } else if why.is_empty() {
                    format!("rank {rank} reported that it lost rank {lost}")
                } else {
                    format!("rank {rank} reported that it lost rank {lost}: {why}")
                };
                *broken = Some(Broken { rank: lost, detail: detail.clone() });
                return Err(Error::PeerLost { rank: lost, op: "a collective", detail });
            }
            Kind::Data | Kind::Fds => peer.stash.push_back(Msg { hdr, payload, fds, landed }),
        }
        Ok(())
    }

    /// Writes `bytes` onto the connection to `to` as they are, waiting (up
    /// to the timeout) while the socket is full: a test plays a peer that
    /// breaks the protocol.
    #[cfg(feature = "fault-injection")]
    pub fn inject(&self, to: usize, bytes: &[u8]) -> Result<()> {
        let mut st = self.lock();
        // Sealed as this rank's own frames are: the test plays a rank that
        // holds the key.
        let bytes = &st.peers.get_mut(to).map(|p| p.sealed(bytes)).unwrap_or_default();
        let Some(conn) = st.peers.get(to).and_then(|p| p.conn.as_ref()) else {
            return Err(Error::InvalidArgument(format!("no connection to rank {to}")));
        };
        let start = Instant::now();
        let mut done = 0;
        while done < bytes.len() {
            match sys::send(conn.fd(), &bytes[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && start.elapsed() < self.timeout => {
                    let mut pfd = [libc::pollfd { fd: conn.fd(), events: libc::POLLOUT, revents: 0 }];
                    sys::poll(&mut pfd, 100).map_err(|e| Error::io("poll", e))?;
                }
                Err(e) => return Err(Error::io(format!("injecting bytes for rank {to}"), e)),
            }
        }
        Ok(())
    }

    /// A buffer of `len` bytes for an outgoing frame: a spare when one fits
    /// (its pages are already mapped), else a new one. Give it back with
    /// [`Endpoint::recycle`].
    pub fn buffer(&self, len: usize) -> Vec<u8> {
        if len < SPARE_MIN {
            return vec![0u8; len];
        }
        self.lock().spare.get(len)
    }

    /// Keeps buffers for reuse by later large frames.
    pub fn recycle(&self, bufs: impl IntoIterator<Item = Vec<u8>>) {
        let mut st = self.lock();
        for b in bufs {
            st.spare.keep(b);
        }
    }

    fn lost(&self, rank: usize, op: &'static str, detail: &str) -> Error {
        Error::PeerLost { rank, op, detail: detail.to_owned() }
    }

    /// After a failed operation nothing can be trusted to be in step: remember
    /// why, and tell every other peer which rank was lost.
    fn mark_broken(&self, st: &mut State, e: &Error) {
        if st.broken.is_some() {
            return;
        }
        let (rank, detail) = match e {
            Error::PeerLost { rank, detail, .. } => (*rank, detail.clone()),
            Error::Protocol { rank, detail, .. } => (*rank, detail.clone()),
            Error::Timeout { ranks, secs, op } => {
                (ranks.first().copied().unwrap_or(self.world_rank), format!("an earlier {op} timed out after {secs:.1} s waiting for it"))
            }
            // A mismatch or a local error leaves the streams in step.
            _ => return,
        };
        self.abandon(st, rank, &detail);
    }

    /// Gives up on the world because of `rank` (this rank itself when the
    /// fault is its own): every later call fails naming it, and every other
    /// peer is told, with the reason.
    fn abandon(&self, st: &mut State, rank: usize, detail: &str) {
        if st.broken.is_some() {
            return;
        }
        st.broken = Some(Broken { rank, detail: detail.to_owned() });
        let frame = abort_frame(rank, detail);
        for (r, p) in st.peers.iter_mut().enumerate() {
            // A peer with a frame under way learns of it by its own
            // timeout, or when this process closes the connection.
            if r != rank && p.conn.is_some() && !p.mid_frame {
                let sealed = p.sealed(&frame);
                if let Some(c) = &p.conn {
                    // Best effort: a full socket buffer means that peer is
                    // busy and will find out from its own timeout.
                    let _ = sys::send(c.fd(), &sealed);
                }
            }
        }
    }

    /// Reports that `rank` sent something malformed that the caller found
    /// (a payload that does not describe itself): the world is abandoned
    /// naming it, and the error to return is given back.
    pub fn fail_peer(&self, rank: usize, op: &'static str, detail: String) -> Error {
        let mut st = self.lock();
        self.abandon(&mut st, rank, &detail);
        Error::Protocol { rank, op, detail }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        // A broken endpoint repeats the abort on its way out, so a peer that
        // sees this close first still learns which rank was lost.
        let bye = match &st.broken {
            Some(b) => abort_frame(b.rank, &b.detail),
            None => Header { kind: Kind::Bye, op: Op::Control, nfds: 0, comm: 0, seq: 0, len: 0 }.encode().to_vec(),
        };
        // Not into a frame under way (which would read as tampering): that
        // peer sees a plain close.
        for p in st.peers.iter_mut().filter(|p| !p.mid_frame) {
            let sealed = p.sealed(&bye);
            if let Some(c) = &p.conn {
                // Frames already queued in the kernel go first; a peer whose
                // buffer is full will see a plain close and report us lost.
                let _ = sys::send(c.fd(), &sealed);
            }
        }
    }
}

/// An abort frame naming `rank`, with the reason (cut to [`REASON_MAX`]).
fn abort_frame(rank: usize, why: &str) -> Vec<u8> {
    let mut cut = why.len().min(REASON_MAX);
    while !why.is_char_boundary(cut) {
        cut -= 1;
    }
    let hdr = Header { kind: Kind::Abort, op: Op::Control, nfds: 0, comm: 0, seq: rank as u64, len: cut as u64 };
    [&hdr.encode()[..], &why.as_bytes()[..cut]].concat()
}

/// A zero-filled buffer of `len` bytes, or the allocation error (a frame's
/// length comes from a peer: running out of memory is an error, not an abort).
fn zeroed(len: usize) -> Result<Vec<u8>, std::collections::TryReserveError> {
    let mut b = Vec::new();
    b.try_reserve_exact(len)?;
    b.resize(len, 0);
    Ok(b)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;
    use crate::session::{Sealed, Wire};

    /// An endpoint of rank 0 in a world of two whose peer is the returned
    /// stream: whatever a test writes there is what "rank 1" sent, sealed
    /// with rank 1's keys (its stream beneath takes raw bytes).
    fn endpoint() -> (Endpoint, Sealed<UnixStream>) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let (mine, theirs) = Session::pair(Wire::Aead);
        let node = NodeIdentity::from_parts("n".into(), "h".into(), true);
        let ep = Endpoint::new(0, vec![node.clone(), node], vec![None, Some((Conn::Unix(a), mine))], Duration::from_millis(200), 1 << 20);
        (ep, Sealed::new(b, theirs))
    }

    fn barrier_from_peer(ep: &Endpoint) -> Result<Vec<Msg>> {
        ep.transact("barrier", &mut [], &[Wanted { from: 1, kind: Kind::Data, comm: 7, op: Op::Barrier, seq: Some(0) }])
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_naming_its_sender() {
        let (ep, mut peer) = endpoint();
        let h = Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 7, seq: 0, len: 1 << 62 };
        peer.write_all(&h.encode()).unwrap();
        let e = barrier_from_peer(&ep).unwrap_err();
        assert!(matches!(e, Error::Protocol { rank: 1, .. }), "{e}");
        assert!(e.to_string().contains("4611686018427387904 bytes") && e.to_string().contains("WM_MAX_FRAME_GIB"), "{e}");
        // Every later call fails naming the same rank.
        assert_eq!(barrier_from_peer(&ep).unwrap_err().blamed_rank(), Some(1));
    }

    /// A frame to rank 1 is under way when rank 2 is lost: neither the
    /// abort rank 0 sends its other peers nor its goodbye may land inside
    /// that frame, where rank 1 would read them as the frame's bytes (and
    /// report tampering, as they would not authenticate). Rank 1 gets what
    /// of the frame was sent, then a plain close.
    #[test]
    fn nothing_is_written_into_a_frame_under_way() {
        let node = NodeIdentity::from_parts("n".into(), "h".into(), true);
        let (a1, mut b1) = UnixStream::pair().unwrap();
        let (a2, b2) = UnixStream::pair().unwrap();
        a1.set_nonblocking(true).unwrap();
        a2.set_nonblocking(true).unwrap();
        let ((s1, _), (s2, _)) = (Session::pair(Wire::Aead), Session::pair(Wire::Aead));
        let peers = vec![None, Some((Conn::Unix(a1), s1)), Some((Conn::Unix(a2), s2))];
        let mut ep = Endpoint::new(0, vec![node; 3], peers, Duration::from_secs(2), 1 << 30);
        ep.max_frame = 1 << 30;
        drop(b2);
        let mut big = vec![7u8; 8 << 20];
        let hdr = Header { kind: Kind::Data, op: Op::Alltoallv, nfds: 0, comm: 7, seq: 0, len: big.len() as u64 };
        let mut out = [Outgoing { to: 1, hdr, payload: Payload::Spent(&mut big), fds: &[] }];
        let wanted = [Wanted { from: 2, kind: Kind::Data, comm: 7, op: Op::Alltoallv, seq: Some(0) }];
        let e = ep.transact("alltoallv", &mut out, &wanted).unwrap_err();
        assert_eq!(e.blamed_rank(), Some(2), "{e}");
        // Rank 1 takes what arrived, which makes room in its socket.
        b1.set_nonblocking(true).unwrap();
        let (mut buf, mut before) = (vec![0u8; 1 << 20], 0);
        loop {
            match std::io::Read::read(&mut b1, &mut buf) {
                Ok(0) => break,
                Ok(n) => before += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(before > 0 && before < big.len(), "{before} bytes of the frame arrived");
        drop(ep);
        b1.set_nonblocking(false).unwrap();
        let mut after = Vec::new();
        std::io::Read::read_to_end(&mut b1, &mut after).unwrap();
        assert!(after.is_empty(), "{} bytes were written into the frame under way", after.len());
    }

    #[test]
    fn a_well_formed_frame_arrives() {
        let (ep, mut peer) = endpoint();
        let h = Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 7, seq: 0, len: 3 };
        peer.write_all(&[&h.encode()[..], b"abc"].concat()).unwrap();
        let got = barrier_from_peer(&ep).unwrap();
        assert_eq!(got[0].payload, b"abc");
    }

    /// A spent payload is sealed where it lies, a record at a time, and
    /// arrives whole behind its header.
    #[test]
    fn a_spent_payload_of_several_records_arrives_whole() {
        let (mut ep, mut peer) = endpoint();
        ep.max_frame = 1 << 30;
        let len = 3 * RECORD_MAX + 5;
        let data: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
        let reader = std::thread::spawn(move || {
            let mut hdr = [0u8; HEADER_LEN];
            std::io::Read::read_exact(&mut peer, &mut hdr).unwrap();
            let hdr = Header::decode(&hdr).unwrap();
            let mut got = vec![0u8; hdr.len as usize];
            std::io::Read::read_exact(&mut peer, &mut got).unwrap();
            got
        });
        let mut buf = data.clone();
        let hdr = Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 7, seq: 0, len: len as u64 };
        let mut out = [Outgoing { to: 1, hdr, payload: Payload::Spent(&mut buf), fds: &[] }];
        ep.transact("send", &mut out, &[]).unwrap();
        assert_eq!(reader.join().unwrap(), data);
        assert_ne!(buf, data, "sealed in place: the buffer holds ciphertext");
    }

    /// A thread that needs the endpoint while another holds it, asleep in
    /// its poll, wakes the holder: here the holder's frame comes only once
    /// the peer has the waiting thread's. The holder used to sleep out its
    /// poll (up to a second) before handing over; a GraphSAGE epoch whose prefetch thread and training step
    /// shared a rank's connections so took 10 s instead of 0.1 s. The test
    /// counts such sleeps.
    #[test]
    fn a_thread_waiting_for_the_endpoint_wakes_the_thread_that_holds_it() {
        let (mut ep, mut peer) = endpoint();
        // Long enough for a loaded machine: the count below, not the
        // timeout, is what fails without the doorbell.
        ep.timeout = Duration::from_secs(20);
        let frame = |comm: u64, op: Op| {
            let h = Header { kind: Kind::Data, op, nfds: 0, comm, seq: 0, len: 1 };
            [&h.encode()[..], b"x"].concat()
        };
        let answer = frame(7, Op::Barrier);
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            // Rank 1 answers the holder only after the other thread's frame.
            let mut hdr = [0u8; HEADER_LEN];
            std::io::Read::read_exact(&mut peer, &mut hdr).unwrap();
            let hdr = Header::decode(&hdr).unwrap();
            let mut body = vec![0u8; hdr.len as usize];
            std::io::Read::read_exact(&mut peer, &mut body).unwrap();
            peer.write_all(&answer).unwrap();
            // Open until the holder has its frame: a closed connection
            // read in the same turn as the frame is a lost peer.
            let _ = done_rx.recv();
            (hdr.comm, body)
        });
        std::thread::scope(|s| {
            let holder = s.spawn(|| barrier_from_peer(&ep));
            // Most often the holder is asleep in its poll by now; if not,
            // this thread simply goes first.
            std::thread::sleep(Duration::from_millis(50));
            let mut payload = b"y".to_vec();
            let hdr = Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 9, seq: 0, len: 1 };
            let mut out = [Outgoing { to: 1, hdr, payload: Payload::Spent(&mut payload), fds: &[] }];
            ep.transact("send", &mut out, &[]).unwrap();
            let got = holder.join().unwrap();
            let _ = done_tx.send(());
            assert_eq!(got.unwrap()[0].payload, b"x");
        });
        assert_eq!(ep.slept_through.load(Ordering::SeqCst), 0, "the holder slept through its poll while this thread waited");
        assert_eq!(peer.join().unwrap(), (9, b"y".to_vec()));
    }

    /// A peer whose last frame and the end of its stream are read in one
    /// turn: the frame is delivered (it used to be dropped, the call
    /// failing with a lost peer), and the next call that needs the peer
    /// fails naming it as lost (not as a timeout).
    #[test]
    fn a_frame_read_with_the_close_is_delivered_and_the_loss_follows() {
        let (ep, mut peer) = endpoint();
        let h = Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 7, seq: 0, len: 3 };
        peer.write_all(&[&h.encode()[..], b"abc"].concat()).unwrap();
        drop(peer);
        let got = barrier_from_peer(&ep).unwrap();
        assert_eq!(got[0].payload, b"abc");
        let e = barrier_from_peer(&ep).unwrap_err();
        assert!(matches!(e, Error::PeerLost { rank: 1, .. }), "{e}");
        assert!(e.to_string().contains("without a goodbye"), "{e}");
        // Sending to it fails naming it too.
        let mut payload = b"y".to_vec();
        let hdr = Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 9, seq: 0, len: 1 };
        let mut out = [Outgoing { to: 1, hdr, payload: Payload::Spent(&mut payload), fds: &[] }];
        assert_eq!(ep.transact("send", &mut out, &[]).unwrap_err().blamed_rank(), Some(1));
    }

    /// A peer that closes with nothing stashed is lost at once, as before.
    #[test]
    fn a_close_without_frames_is_a_lost_peer() {
        let (ep, peer) = endpoint();
        drop(peer);
        let e = barrier_from_peer(&ep).unwrap_err();
        assert!(matches!(e, Error::PeerLost { rank: 1, .. }) && e.to_string().contains("without a goodbye"), "{e}");
    }

    #[test]
    fn an_abort_names_the_lost_rank_with_its_reason() {
        let (ep, mut peer) = endpoint();
        peer.write_all(&abort_frame(0, "it timed out")).unwrap();
        let e = barrier_from_peer(&ep).unwrap_err();
        assert_eq!(e.blamed_rank(), Some(0));
        assert!(e.to_string().contains("rank 1 reported that it lost rank 0: it timed out"), "{e}");
    }

    /// Rows land in their places; a frame of a later operation that was
    /// under way when the landing call returned is still received whole.
    #[test]
    fn frames_land_in_their_rows_and_the_next_one_survives_the_call() {
        let (ep, mut peer) = endpoint();
        let frame = |seq: u64, payload: &[u8]| {
            let h = Header { kind: Kind::Data, op: Op::AlltoallvInPlace, nfds: 0, comm: 7, seq, len: payload.len() as u64 };
            [&h.encode()[..], payload].concat()
        };
        // Head "h", then rows 0..3 of two bytes, to output rows 2, 0, 1.
        let first = frame(0, b"hAABBCC");
        let second = frame(1, &[9u8; 100]);
        peer.write_all(&[&first[..], &second[..40]].concat()).unwrap();
        let rows = [2, 0, 1];
        let sinks = [Sink { from: 1, comm: 7, op: Op::AlltoallvInPlace, seq: 0, head: 1, row: 2, rows: &rows }];
        let mut out = [0u8; 6];
        let want = |seq| [Wanted { from: 1, kind: Kind::Data, comm: 7, op: Op::AlltoallvInPlace, seq: Some(seq) }];
        let got = ep.transact_landing("test", &mut [], &want(0), Some(Land { out: &mut out, sinks: &sinks }), &mut |_| false).unwrap();
        assert!(got[0].landed);
        assert_eq!(got[0].payload, b"h");
        assert_eq!(&out, b"BBCCAA");
        peer.write_all(&second[40..]).unwrap();
        let got = ep.transact("test", &mut [], &want(1)).unwrap();
        assert_eq!(got[0].payload, vec![9u8; 100]);
    }

    #[test]
    fn landed_bytes_go_to_their_rows_from_any_point_of_the_payload() {
        let rows = [2, 0, 1];
        let s = Sink { from: 1, comm: 7, op: Op::AlltoallvInPlace, seq: 0, head: 2, row: 3, rows: &rows };
        let payload = b"hhAAABBBCCC";
        // In pieces cut anywhere, heads and rows included.
        for cut in 0..payload.len() {
            let (mut head, mut out) = ([0u8; 2], [0u8; 9]);
            s.place(&mut head, &mut out, 0, &payload[..cut]);
            s.place(&mut head, &mut out, cut, &payload[cut..]);
            assert_eq!((&head, &out), (b"hh", b"BBBCCCAAA"), "cut at {cut}");
        }
    }

    fn frame(seq: u64, payload: &[u8]) -> Vec<u8> {
        let h = Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 7, seq, len: payload.len() as u64 };
        [&h.encode()[..], payload].concat()
    }

    #[test]
    fn a_replayed_or_reordered_frame_is_refused_naming_its_sender() {
        for reorder in [false, true] {
            let (ep, mut peer) = endpoint();
            let (mut first, mut second) = (Vec::new(), Vec::new());
            peer.seal_to(&frame(0, b"one"), &mut first);
            peer.seal_to(&frame(1, b"two"), &mut second);
            let stream = if reorder { [second, first].concat() } else { [first.clone(), first].concat() };
            peer.get_mut().write_all(&stream).unwrap();
            let e = ep.transact("barrier", &mut [], &[Wanted { from: 1, kind: Kind::Data, comm: 7, op: Op::Barrier, seq: None }]);
            // A replay behind a good frame: that frame arrives, the replay
            // breaks the endpoint, and the next call says why.
            let e = if reorder { e.unwrap_err() } else { barrier_from_peer(&ep).unwrap_err() };
            assert_eq!(e.blamed_rank(), Some(1), "{e}");
            assert!(e.to_string().contains("authentication failed"), "{e}");
        }
    }

    #[test]
    fn a_frame_buffer_grows_as_bytes_arrive_never_to_the_declared_length() {
        let declared = 1usize << 31;
        let mut buf = Vec::new();
        let mut got = 0;
        for n in [1usize, 100, RECORD_MAX, RECORD_MAX] {
            grow(&mut buf, n, declared).unwrap();
            buf.resize(got + n, 1);
            got += n;
            assert!(buf.capacity() <= got + AHEAD_MAX.max(RECORD_MAX), "{} bytes held for {got} received", buf.capacity());
        }
        // Never past the declared length.
        let mut small = Vec::new();
        grow(&mut small, 10, 10).unwrap();
        assert_eq!(small.capacity(), 10);
    }

    #[test]
    fn a_declared_length_without_its_bytes_costs_no_memory_and_names_the_sender() {
        let (ep, mut peer) = endpoint();
        let h = Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 7, seq: 0, len: 1 << 19 };
        peer.write_all(&[&h.encode()[..], &[5u8; 1000]].concat()).unwrap();
        drop(peer);
        let e = barrier_from_peer(&ep).unwrap_err();
        assert_eq!(e.blamed_rank(), Some(1), "{e}");
        let st = ep.lock();
        match &st.peers[1].body {
            Some(Body::Buffered { buf, .. }) => assert!(buf.len() == 1000 && buf.capacity() <= RECORD_MAX, "{}", buf.capacity()),
            other => panic!("the frame is not half received: {other:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Whatever bytes a peer sends before closing, the endpoint ends
        /// with a result, never a panic.
        #[test]
        fn arbitrary_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), valid_start in any::<bool>(), raw in any::<bool>()) {
            let (ep, mut peer) = endpoint();
            let mut stream = Vec::new();
            if valid_start {
                // A valid header first reaches the body and frame handling.
                let len = bytes.len().min(40) as u64;
                stream.extend_from_slice(&Header { kind: Kind::Data, op: Op::Barrier, nfds: 0, comm: 7, seq: 0, len }.encode());
            }
            stream.extend_from_slice(&bytes);
            // Sealed (a key holder's garbage reaches the frame parser) or
            // raw (a stranger's never gets past the records).
            let _ = if raw { peer.get_mut().write_all(&stream) } else { peer.write_all(&stream) };
            drop(peer);
            let r = barrier_from_peer(&ep);
            if raw && !stream.is_empty() {
                prop_assert!(r.is_err());
            }
        }
    }
}
