//! The embedded socket backend: always compiled, needs nothing but the OS.
//!
//! Ranks meet through [`Rendezvous`], then hold one connection per pair of
//! ranks — a Unix-domain stream between ranks of one node (it can carry
//! descriptors), TCP between nodes. Collectives are built from point-to-point
//! frames moved by a polling engine that also watches every other peer, so a
//! dead rank is noticed by whichever operation is waiting.

mod bootstrap;
mod dir_key;
mod endpoint;
mod mesh;
mod rendezvous;
// The mailboxes' shared mappings.
#[allow(unsafe_code)]
mod shm;
pub(crate) mod wire;

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

pub use bootstrap::{Exchange, Rendezvous};
use endpoint::{Endpoint, Land, Outgoing, Payload, Sink, Wanted};
pub use rendezvous::take_kept_listener;
use wire::{Header, Kind, Op};
use wm_topology::{NodeIdentity, NodeLayout};

use crate::auth::JobKey;
use crate::communicator::Communicator;
use crate::plan::{Delivery, ExchangePlan, ReceivedPart};
use crate::ranks::RankEnv;
use crate::{Error, Result};

/// A communicator of the socket backend.
#[derive(Debug, Clone)]
pub struct SocketComm {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ep: Arc<Endpoint>,
    id: u64,
    members: Vec<usize>,
    nodes: Vec<NodeIdentity>,
    me: usize,
    seq: AtomicU64,
    splits: AtomicU64,
    local: OnceLock<SocketComm>,
    cross: OnceLock<SocketComm>,
    /// Shared-memory mailboxes to and from this communicator's ranks on
    /// this node (`Communicator::exchange`).
    channels: Mutex<shm::Channels>,
}

/// The first word of an in-place exchange's payload: the bytes follow.
const INLINE: u64 = 0;
/// The first word of an in-place exchange's payload, plus the mailbox index
/// (0 or 1): the bytes are in that mailbox; their count is the second word.
const IN_MAILBOX: u64 = 2;

/// A bootstrap timeout reports the configured limit.
fn with_secs(e: Error, timeout: std::time::Duration) -> Error {
    match e {
        Error::Timeout { op, ranks, .. } => Error::Timeout { op, ranks, secs: timeout.as_secs_f64() },
        e => e,
    }
}

/// The frame limit from `WM_MAX_FRAME_GIB` (default 16 GiB).
fn frame_limit() -> Result<u64> {
    let var = wm_topology::env::WM_MAX_FRAME_GIB;
    match var.parse::<f64>().map_err(Error::Bootstrap)? {
        None => Ok(16 << 30),
        Some(g) if g.is_finite() && g > 0.0 && g <= (1u64 << 32) as f64 => Ok((g * f64::from(1u32 << 30)) as u64),
        Some(g) => Err(Error::Bootstrap(format!("{}={g} must be a positive number of GiB, at most 2^32", var.name))),
    }
}

/// A stable 64-bit mix for communicator ids (FNV-1a over the parts).
fn mix(parts: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl SocketComm {
    /// The most memory a frame's declared length alone can make this
    /// process hold for one connection, beyond the bytes that arrived: the
    /// frame buffer's allowance ahead of them and the buffer of the record
    /// being received.
    pub const CONNECTION_AHEAD_MAX: usize =
        endpoint::AHEAD_MAX + crate::session::PREFIX + crate::session::RECORD_MAX + crate::session::TAG + crate::session::PREFIX;

    /// The world communicator from the environment (`WM_RANK`, Slurm, Open
    /// MPI or PMI for the rank; `WM_RENDEZVOUS` for the meeting point;
    /// `WM_JOB_KEY` for the job's key).
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when the environment is incomplete or wrong
    /// (a `host:port` rendezvous without a job key, say);
    /// [`Error::Timeout`] naming the ranks that never arrived.
    pub fn from_env() -> Result<Self> {
        let env = RankEnv::from_env()?;
        let timeout = wm_topology::env::timeout().map_err(Error::Bootstrap)?;
        let how = Rendezvous::from_env()?;
        Self::bootstrap(env.rank, env.world, how.as_ref(), None, timeout)
    }

    /// The world communicator for an explicit rank, size and rendezvous.
    /// `key` is the job's key; `None` takes it from the environment (or, for
    /// `dir:`, the directory's key file).
    ///
    /// # Errors
    /// As [`SocketComm::from_env`].
    pub fn bootstrap(
        rank: usize,
        world: usize,
        how: Option<&Rendezvous>,
        key: Option<&JobKey>,
        timeout: std::time::Duration,
    ) -> Result<Self> {
        let node = NodeIdentity::discover();
        let max_frame = frame_limit()?;
        if world == 1 {
            let ep = Endpoint::new(0, vec![node], vec![None], timeout, max_frame);
            return Ok(Self::world(ep));
        }
        if rank >= world {
            return Err(Error::Bootstrap(format!("rank {rank} is not below the world size {world}")));
        }
        let how = how.ok_or_else(|| {
            Error::Bootstrap(format!(
                "this is rank {rank} of {world} but {} is not set: start the ranks with `wm-run`, or set it to `host:port` or `dir:/shared/path`",
                wm_topology::env::WM_RENDEZVOUS.name
            ))
        })?;
        let key = match key {
            Some(k) => k.clone(),
            None => bootstrap::job_key(how)?,
        };
        crate::gate::handshake_limit()?;
        crate::gate::descriptor_budget();
        crate::trust::remember_key(&key);
        let deadline = Instant::now() + timeout;
        let (l, infos) = rendezvous::run(rank, world, &node, how, &key, deadline).map_err(|e| with_secs(e, timeout))?;
        let comm = Self::connect(&l, infos, Some(how), &key, deadline, timeout, max_frame)?;
        rendezvous::remove_rank_file(how, rank);
        Ok(comm)
    }

    /// The world communicator, meeting through `exchange` instead of
    /// `WM_RENDEZVOUS`: it receives this rank's record and returns every
    /// rank's, in rank order (another communicator's allgather, e.g. MPI's,
    /// trusted to deliver what each rank put in). Connections between the
    /// ranks are still authenticated with `key`.
    ///
    /// # Errors
    /// As [`SocketComm::from_env`], and whatever `exchange` returns.
    pub fn bootstrap_with(
        rank: usize,
        world: usize,
        timeout: std::time::Duration,
        key: &JobKey,
        exchange: &mut Exchange<'_>,
    ) -> Result<Self> {
        let node = NodeIdentity::discover();
        let max_frame = frame_limit()?;
        if world == 1 {
            return Ok(Self::world(Endpoint::new(0, vec![node], vec![None], timeout, max_frame)));
        }
        crate::gate::handshake_limit()?;
        crate::gate::descriptor_budget();
        crate::trust::remember_key(key);
        let deadline = Instant::now() + timeout;
        let (l, infos) = bootstrap::exchange(rank, world, &node, exchange)?;
        Self::connect(&l, infos, None, key, deadline, timeout, max_frame)
    }

    fn connect(
        l: &bootstrap::Listeners,
        mut infos: Vec<bootstrap::RankInfo>,
        how: Option<&Rendezvous>,
        key: &JobKey,
        deadline: Instant,
        timeout: std::time::Duration,
        max_frame: u64,
    ) -> Result<Self> {
        let conns = mesh::mesh(l, &mut infos, how, key, deadline).map_err(|e| with_secs(e, timeout))?;
        let nodes = infos.iter().map(|i| i.node()).collect();
        let comm = Self::world(Endpoint::new(l.info.rank, nodes, conns, timeout, max_frame));
        // Everyone has read every record once all are connected.
        comm.barrier()?;
        Ok(comm)
    }

    fn world(ep: Endpoint) -> Self {
        let members = (0..ep.world()).collect();
        let me = ep.world_rank;
        let nodes = ep.nodes.clone();
        Self::with_members(Arc::new(ep), mix(&[u64::from_le_bytes(*b"WM-WORLD")]), members, nodes, me)
    }

    fn with_members(ep: Arc<Endpoint>, id: u64, members: Vec<usize>, nodes: Vec<NodeIdentity>, me: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                ep,
                id,
                members,
                nodes,
                me,
                seq: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                local: OnceLock::new(),
                cross: OnceLock::new(),
                channels: Mutex::new(shm::Channels::default()),
            }),
        }
    }

    fn sub(&self, id: u64, ranks: &[usize]) -> SocketComm {
        let i = &self.inner;
        let members: Vec<usize> = ranks.iter().map(|&r| i.members[r]).collect();
        let nodes = ranks.iter().map(|&r| i.nodes[r].clone()).collect();
        let me = ranks.iter().position(|&r| r == i.me).expect("this rank is a member");
        Self::with_members(i.ep.clone(), id, members, nodes, me)
    }

    /// Writes `bytes` as they are onto this process's connection to world
    /// rank `to`, outside any framing: for tests that play a broken or
    /// hostile peer (feature `fault-injection`).
    ///
    /// # Errors
    /// When there is no connection to `to` or the write fails.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn inject_raw(&self, to: usize, bytes: &[u8]) -> Result<()> {
        self.inner.ep.inject(to, bytes)
    }

    /// A frame header as the socket backend encodes it, for tests that
    /// build hostile frames (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn raw_header(kind: u8, op: u8, nfds: u16, comm: u64, seq: u64, len: u64) -> [u8; wire::HEADER_LEN] {
        let mut h = Header { kind: Kind::Data, op: Op::Barrier, nfds, comm, seq, len }.encode();
        h[4] = kind;
        h[5] = op;
        h
    }

    /// This communicator's id on the wire (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn wire_id(&self) -> u64 {
        self.inner.id
    }

    /// [`Communicator::split`], as a `SocketComm`.
    ///
    /// # Errors
    /// As [`Communicator::split`].
    pub fn split_socket(&self, color: u32, key: u32) -> Result<SocketComm> {
        let mine = [color.to_le_bytes(), key.to_le_bytes()].concat();
        let all = self.allgather(&mine)?;
        let word = |i: usize| u32::from_le_bytes(all[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        let mut ranks: Vec<usize> = (0..self.size()).filter(|&r| word(2 * r) == color).collect();
        ranks.sort_by_key(|&r| (word(2 * r + 1), r));
        let n = self.inner.splits.fetch_add(1, Ordering::Relaxed);
        Ok(self.sub(mix(&[self.inner.id, 0x5b117, n, u64::from(color)]), &ranks))
    }

    /// [`Communicator::local`], as a `SocketComm`.
    pub fn local_socket(&self) -> SocketComm {
        self.inner
            .local
            .get_or_init(|| {
                let i = &self.inner;
                let ranks: Vec<usize> = (0..i.members.len()).filter(|&r| i.nodes[r] == i.nodes[i.me]).collect();
                self.sub(mix(&[i.id, 0x10ca1]), &ranks)
            })
            .clone()
    }

    /// [`Communicator::cross`], as a `SocketComm`.
    pub fn cross_socket(&self) -> SocketComm {
        self.inner
            .cross
            .get_or_init(|| {
                let i = &self.inner;
                let layout = NodeLayout::of(&i.nodes);
                let mine = layout.local[i.me];
                let ranks: Vec<usize> = (0..layout.nodes).filter_map(|n| layout.rank_at(n, mine)).collect();
                self.sub(mix(&[i.id, 0xc2055, mine as u64]), &ranks)
            })
            .clone()
    }

    /// One collective: sends `send[r]` (if any) to each rank `r` and waits
    /// for a frame from each rank in `from`. Returns frames indexed by rank.
    fn collective(&self, op: Op, send: &[(usize, &[u8])], from: &[usize]) -> Result<Vec<Option<Vec<u8>>>> {
        let i = &self.inner;
        let seq = i.seq.fetch_add(1, Ordering::Relaxed);
        let mut out: Vec<Outgoing<'_>> = send
            .iter()
            .filter(|(r, _)| *r != i.me)
            .map(|&(r, payload)| Outgoing {
                to: i.members[r],
                hdr: Header { kind: Kind::Data, op, nfds: 0, comm: i.id, seq, len: payload.len() as u64 },
                payload: Payload::Shared(payload),
                fds: &[],
            })
            .collect();
        let want: Vec<Wanted> = from
            .iter()
            .filter(|&&r| r != i.me)
            .map(|&r| Wanted { from: i.members[r], kind: Kind::Data, comm: i.id, op, seq: Some(seq) })
            .collect();
        let msgs = i.ep.transact(op.name(), &mut out, &want)?;
        let mut res: Vec<Option<Vec<u8>>> = (0..i.members.len()).map(|_| None).collect();
        for (w, m) in from.iter().filter(|&&r| r != i.me).zip(msgs) {
            res[*w] = Some(m.payload);
        }
        Ok(res)
    }

    /// Writes the parts for the other ranks of an in-place exchange: into
    /// a shared-memory mailbox for a rank of this node when large enough
    /// (and one can be had), else inline behind a word that says so.
    /// Returns each peer's frame payload (inline bytes, or where the
    /// mailbox bytes are) and the descriptor of a new mailbox to send along.
    // Writes mailboxes through `shm::Mailbox::bytes_mut` (see the SAFETY
    // note at the call).
    #[allow(unsafe_code)]
    fn fill_parts(
        &self,
        channels: &mut shm::Channels,
        sizes: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]),
    ) -> (Vec<Vec<u8>>, Vec<Option<std::os::fd::RawFd>>) {
        let i = &self.inner;
        let (n, me) = (i.members.len(), i.me);
        let mut payloads: Vec<Vec<u8>> = (0..n).map(|_| Vec::new()).collect();
        let mut new_boxes: Vec<Option<std::os::fd::RawFd>> = vec![None; n];
        for r in (0..n).filter(|&r| r != me) {
            let len = sizes[r];
            if len >= shm::MAILBOX_MIN && self.same_node(r, me) {
                // A mailbox that cannot be made (out of memory or
                // descriptors) only costs speed: the bytes go inline.
                if let Ok((index, mailbox, fresh)) = channels.next_outbox(r, len) {
                    // SAFETY: `next_outbox` sized the mailbox for `len`. The
                    // peer last read this outbox in an exchange at least two
                    // before this one, and had finished before this rank's
                    // previous exchange ended (`shm::Channels`); it reads it
                    // next after the frame that announces it, which
                    // `in_place` sends once `fill` has returned and the
                    // slice is gone; it never writes it (it maps it
                    // read-only).
                    fill(r, unsafe { mailbox.bytes_mut(len) });
                    payloads[r] = [(IN_MAILBOX + index as u64).to_le_bytes(), (len as u64).to_le_bytes()].concat();
                    new_boxes[r] = fresh.then(|| mailbox.fd().as_raw_fd());
                    continue;
                }
            }
            let mut buf = i.ep.buffer(8 + len);
            buf[..8].copy_from_slice(&INLINE.to_le_bytes());
            fill(r, &mut buf[8..]);
            payloads[r] = buf;
        }
        (payloads, new_boxes)
    }

    /// Carries out `plan`: parts for other nodes whose landing matches are
    /// received straight into the plan's output; every part goes through
    /// the plan's delivery, in rank order.
    // Writes and reads mailboxes through `shm::Mailbox::bytes_mut` and
    // `bytes`, whose contracts the exchange's protocol keeps (see the
    // SAFETY notes at the calls).
    #[allow(unsafe_code)]
    fn in_place(&self, plan: ExchangePlan<'_>) -> Result<()> {
        plan.check(self.size())?;
        let ExchangePlan { sizes, fill, out, landing, mut work, receiver } = plan;
        let mut delivery = Delivery::new(landing, receiver);
        let i = &self.inner;
        let (n, me) = (i.members.len(), i.me);
        let op = Op::AlltoallvInPlace;
        // Held to the end: the descriptors of new mailboxes are borrowed
        // from it while they travel, and the receiver reads inboxes.
        let mut channels = i.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut payloads, new_boxes) = self.fill_parts(&mut channels, sizes, fill);
        let mut own = vec![0u8; sizes[me]];
        fill(me, &mut own);
        let seq = i.seq.fetch_add(1, Ordering::Relaxed);
        let fd_lists: Vec<Vec<std::os::fd::RawFd>> = new_boxes.iter().map(|f| f.iter().copied().collect()).collect();
        // The payloads are this call's own buffers, recycled once it ends:
        // they are sealed where they lie.
        let mut frames: Vec<Outgoing<'_>> = payloads
            .iter_mut()
            .enumerate()
            .filter(|&(r, _)| r != me)
            .map(|(r, payload)| Outgoing {
                to: i.members[r],
                hdr: Header { kind: Kind::Data, op, nfds: fd_lists[r].len() as u16, comm: i.id, seq, len: payload.len() as u64 },
                payload: Payload::Spent(payload),
                fds: &fd_lists[r],
            })
            .collect();
        let want: Vec<Wanted> =
            (0..n).filter(|&r| r != me).map(|r| Wanted { from: i.members[r], kind: Kind::Data, comm: i.id, op, seq: Some(seq) }).collect();
        // Parts from other nodes of their landing's length (behind the
        // inline word) go straight to their rows; a mailbox note never
        // comes from another node, so it cannot be taken for one.
        let sinks: Vec<Sink<'_>> = (0..n)
            .filter(|&r| r != me && !self.same_node(r, me) && landing.lands_rows(r))
            .map(|r| Sink {
                from: i.members[r],
                comm: i.id,
                op,
                seq,
                head: 8 + landing.head,
                row: landing.row_bytes,
                rows: landing.rows[r],
            })
            .collect();
        let land = Land { out: &mut *out, sinks: &sinks };
        let msgs = i.ep.transact_landing(op.name(), &mut frames, &want, Some(land), &mut |out| work.step(out))?;
        drop(frames);
        let mut msgs = msgs.into_iter();
        let mut received = Vec::with_capacity(n);
        for r in 0..n {
            if r == me {
                delivery.hand_over(me, ReceivedPart::borrowed(&own), out);
                continue;
            }
            let mut m = msgs.next().expect("transact returns one frame per wanted peer");
            let peer = i.members[r];
            let word = |k: usize| m.payload.get(8 * k..8 * k + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
            let bad = |what: String| i.ep.fail_peer(peer, op.name(), format!("it sent {what}"));
            match word(0) {
                Some(INLINE) if m.landed => delivery.hand_over(r, ReceivedPart::landed_head(&m.payload[8..]), out),
                _ if m.landed => return Err(bad("a part of an in-place exchange that is not inline".into())),
                // Its own buffer: the receiver may keep it (then an empty one is
                // left to recycle).
                Some(INLINE) if m.fds.is_empty() => delivery.hand_over(r, ReceivedPart::owned(&mut m.payload, 8), out),
                Some(w) if (w == IN_MAILBOX || w == IN_MAILBOX + 1) && m.payload.len() == 16 && m.fds.len() <= 1 => {
                    let Some(len) = word(1).and_then(|l| usize::try_from(l).ok()) else {
                        return Err(bad("a mailbox note without a length".into()));
                    };
                    let index = (w - IN_MAILBOX) as usize;
                    let mailbox = match channels.inbox(r, index, m.fds.pop()) {
                        Ok(mb) => mb,
                        Err(e) => return Err(bad(format!("a mailbox this rank cannot use: {e}"))),
                    };
                    // SAFETY: the peer wrote these bytes before sending the
                    // frame that announced them, and writes this mailbox
                    // again only after this rank has begun a later in-place
                    // exchange on this communicator (`shm::Channels`);
                    // the receiver runs before this call returns.
                    match unsafe { mailbox.bytes(len) } {
                        Ok(bytes) => delivery.hand_over(r, ReceivedPart::borrowed(bytes), out),
                        Err(e) => return Err(bad(e)),
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "a frame of {} bytes and {} descriptors that is not an in-place exchange part",
                        m.payload.len(),
                        m.fds.len()
                    )));
                }
            }
            received.push(m.payload);
        }
        payloads.extend(received);
        i.ep.recycle(payloads);
        Ok(())
    }

    fn all(&self) -> Vec<usize> {
        (0..self.inner.members.len()).collect()
    }

    fn check_rank(&self, r: usize, what: &str) -> Result<()> {
        if r >= self.size() {
            return Err(Error::InvalidArgument(format!("{what} {r} is not a rank of a communicator of {} ranks", self.size())));
        }
        Ok(())
    }
}

impl Communicator for SocketComm {
    fn rank(&self) -> usize {
        self.inner.me
    }

    fn size(&self) -> usize {
        self.inner.members.len()
    }

    fn world_ranks(&self) -> &[usize] {
        &self.inner.members
    }

    fn nodes(&self) -> &[NodeIdentity] {
        &self.inner.nodes
    }

    fn backend(&self) -> &'static str {
        "socket"
    }

    fn barrier(&self) -> Result<()> {
        let all = self.all();
        let send: Vec<(usize, &[u8])> = all.iter().map(|&r| (r, &[][..])).collect();
        self.collective(Op::Barrier, &send, &all).map(drop)
    }

    fn broadcast(&self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        self.check_rank(root, "broadcast root")?;
        if self.rank() == root {
            let send: Vec<(usize, &[u8])> = self.all().into_iter().map(|r| (r, &data[..])).collect();
            self.collective(Op::Broadcast, &send, &[])?;
        } else {
            let mut got = self.collective(Op::Broadcast, &[], &[root])?;
            *data = got[root].take().expect("root's frame arrived");
        }
        Ok(())
    }

    fn allgatherv(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let all = self.all();
        let send: Vec<(usize, &[u8])> = all.iter().map(|&r| (r, data)).collect();
        let got = self.collective(Op::Allgather, &send, &all)?;
        Ok(got.into_iter().map(|g| g.unwrap_or_else(|| data.to_vec())).collect())
    }

    fn alltoallv(&self, send: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        if send.len() != self.size() {
            return Err(Error::InvalidArgument(format!(
                "alltoallv got {} send buffers for a communicator of {} ranks",
                send.len(),
                self.size()
            )));
        }
        let all = self.all();
        let pairs: Vec<(usize, &[u8])> = send.iter().enumerate().map(|(r, s)| (r, *s)).collect();
        let got = self.collective(Op::Alltoallv, &pairs, &all)?;
        let me = self.rank();
        Ok(got.into_iter().enumerate().map(|(r, g)| g.unwrap_or_else(|| if r == me { send[me].to_vec() } else { Vec::new() })).collect())
    }

    fn exchange(&self, plan: ExchangePlan<'_>) -> Result<()> {
        self.in_place(plan)
    }

    fn split(&self, color: u32, key: u32) -> Result<Arc<dyn Communicator>> {
        Ok(Arc::new(self.split_socket(color, key)?))
    }

    fn local(&self) -> Arc<dyn Communicator> {
        Arc::new(self.local_socket())
    }

    fn cross(&self) -> Arc<dyn Communicator> {
        Arc::new(self.cross_socket())
    }

    fn send_fds(&self, dest: usize, fds: &[BorrowedFd<'_>]) -> Result<()> {
        self.check_rank(dest, "send_fds destination")?;
        let i = &self.inner;
        if dest == i.me || !self.same_node(dest, i.me) {
            return Err(Error::Unsupported {
                what: format!("passing descriptors from rank {} to rank {}", self.world_rank(), i.members[dest]),
                reason: if dest == i.me { "a rank cannot send descriptors to itself".into() } else { "they are on different nodes".into() },
            });
        }
        if fds.len() > crate::sys::MAX_FDS {
            return Err(Error::InvalidArgument(format!("{} descriptors in one message; at most {}", fds.len(), crate::sys::MAX_FDS)));
        }
        let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let mut out = [Outgoing {
            to: i.members[dest],
            hdr: Header { kind: Kind::Fds, op: Op::Fds, nfds: raw.len() as u16, comm: i.id, seq: 0, len: 0 },
            payload: Payload::Shared(&[]),
            fds: &raw,
        }];
        i.ep.transact(Op::Fds.name(), &mut out, &[]).map(drop)
    }

    fn recycle(&self, bufs: Vec<Vec<u8>>) {
        self.inner.ep.recycle(bufs);
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn recv_fds(&self, src: usize, count: usize) -> Result<Vec<OwnedFd>> {
        self.check_rank(src, "recv_fds source")?;
        let i = &self.inner;
        let want = [Wanted { from: i.members[src], kind: Kind::Fds, comm: i.id, op: Op::Fds, seq: None }];
        let mut msgs = i.ep.transact(Op::Fds.name(), &mut [], &want)?;
        let fds = msgs.pop().expect("one frame").fds;
        if fds.len() != count {
            return Err(Error::Mismatch {
                op: "recv_fds",
                detail: format!("rank {} sent {} descriptors, rank {} expected {count}", i.members[src], fds.len(), self.world_rank()),
            });
        }
        Ok(fds)
    }
}
