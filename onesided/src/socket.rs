//! The socket transport: each owner's read server answers requests for
//! its rows. One request per owner is in flight at once — every owner's
//! sent before any answer is read — and a call larger than one request
//! goes in rounds. Every answer is checked against the request it must
//! answer (`wire`) before any of it is placed; a connection goes back to
//! the pool only in step (every answer read in full, an error answer
//! included), and is closed otherwise.

use std::io::Read;
use std::sync::Mutex;
use std::time::Instant;

use wholemem::CommonError;
use wm_gather::rows::{RowSource, gather_from};
use wm_gather::{DType, RowLayout};

use crate::client::{self, Addr, Conn, Identity};
use crate::profile::{Counters, Span, timed};
use crate::transport::{ReadRequest, Transport};
use crate::wire::{self, Request};
use crate::{Error, Method, Result};

/// One owner's server, and idle connections to it.
#[derive(Debug)]
pub(crate) struct Target {
    /// The owner's world rank.
    pub rank: usize,
    pub at: Addr,
    pub nonce: u64,
    pool: Mutex<Vec<Conn>>,
}

impl Target {
    pub(crate) fn new(rank: usize, at: Addr, nonce: u64) -> Self {
        Self { rank, at, nonce, pool: Mutex::new(Vec::new()) }
    }
}

/// The socket transport of one reader (shared by its clones).
#[derive(Debug)]
pub(crate) struct SocketTransport {
    table: String,
    /// Per owner: its server, when its rows come this way.
    targets: Vec<Option<Target>>,
    /// Each owner's first global row.
    first: Vec<usize>,
    id: Identity,
}

impl SocketTransport {
    pub(crate) fn new(table: &str, targets: Vec<Option<Target>>, first: Vec<usize>, id: Identity) -> Self {
        Self { table: table.to_owned(), targets, first, id }
    }

    fn take(&self, t: &Target) -> Result<Conn> {
        let idle = t.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(c) => Ok(c),
            None => client::connect(&self.table, t.rank, &t.at, t.nonce, &self.id),
        }
    }

    fn give_back(&self, t: &Target, c: Conn) {
        t.pool.lock().unwrap_or_else(|p| p.into_inner()).push(c);
    }
}

/// One owner's share of a call.
struct Share<'t, 'o> {
    target: &'t Target,
    conn: Conn,
    rows: Vec<u64>,
    slots: Vec<usize>,
    dest: Dest<'o>,
}

/// Where a share's rows land.
enum Dest<'o> {
    /// In a buffer, then converted into place.
    Staged(Vec<u8>),
    /// Straight into their output rows (no conversion), in request order.
    Direct(Vec<&'o mut [u8]>),
}

impl Transport for SocketTransport {
    fn method(&self) -> Method {
        Method::Socket
    }

    fn read(&self, req: &mut ReadRequest<'_>, profile: Option<&Counters>) -> Result<()> {
        let n_owners = self.targets.len();
        let mut rows: Vec<Vec<u64>> = vec![Vec::new(); n_owners];
        let mut slots: Vec<Vec<usize>> = vec![Vec::new(); n_owners];
        for (i, (&row, &o)) in req.rows.iter().zip(req.owners).enumerate() {
            rows[o].push((row - self.first[o]) as u64);
            slots[o].push(req.slots.map_or(i, |s| s[i]));
        }
        // Without conversion every row is read straight into its place.
        let direct = req.out_dtype == req.layout.dtype();
        let out_row = req.layout.cols() * req.out_dtype.size();
        let mut out = Some(&mut *req.out);
        let mut places: Vec<Option<&mut [u8]>> = match (direct, out_row) {
            (true, 1..) => out.take().map_or_else(Vec::new, |o| o.chunks_mut(out_row).map(Some).collect()),
            _ => Vec::new(),
        };
        let mut shares = Vec::new();
        for (o, (rows, slots)) in rows.into_iter().zip(slots).enumerate() {
            if rows.is_empty() {
                continue;
            }
            let target = self.targets[o].as_ref().ok_or_else(|| {
                Error::Common(CommonError::InvalidArgument(format!("rows of owner {o} routed to a socket it has none of")))
            })?;
            let dest = if places.is_empty() {
                Dest::Staged(Vec::new())
            } else {
                let mine: Option<Vec<&mut [u8]>> = slots.iter().map(|&s| places.get_mut(s).and_then(Option::take)).collect();
                Dest::Direct(mine.ok_or_else(|| {
                    Error::Common(CommonError::InvalidArgument("an output row asked for twice or past the output".into()))
                })?)
            };
            let conn = timed(profile, Span::LockWait, || self.take(target))?;
            shares.push(Share { target, conn, rows, slots, dest });
        }
        let result = self.exchange(&mut shares, req.layout, req.out_dtype, &mut out, profile);
        // Connections whose every answer was read in full (an error
        // answer included) carry the next call; the others — an answer
        // still on its way, or out of step — are closed.
        for s in shares {
            if s.conn.in_step() {
                self.give_back(s.target, s.conn);
            }
        }
        result
    }
}

impl SocketTransport {
    /// Every share's requests and answers, in rounds: each round sends
    /// every owner's request, then reads every answer, checking that it
    /// answers that request before placing a byte of it.
    fn exchange(
        &self,
        shares: &mut [Share<'_, '_>],
        layout: &RowLayout,
        out_dtype: DType,
        out: &mut Option<&mut [u8]>,
        profile: Option<&Counters>,
    ) -> Result<()> {
        let (skip, len) = (layout.skip_bytes(), layout.bytes());
        let per = wire::MAX_ROWS.min(wire::MAX_BYTES / len).max(1);
        let rounds = shares.iter().map(|s| s.rows.len().div_ceil(per)).max().unwrap_or(0);
        let staged = RowLayout::new(layout.dtype(), layout.cols(), 0)?;
        let mut request = Vec::new();
        for round in 0..rounds {
            // Every owner's request first...
            let t = Instant::now();
            for s in shares.iter_mut() {
                let Some(chunk) = s.rows.chunks(per).nth(round) else { continue };
                request.clear();
                request.extend_from_slice(&Request::Read { rows: chunk.len(), skip, len }.encode());
                request.extend_from_slice(bytemuck::cast_slice(chunk));
                s.conn.send(&request).map_err(|e| client::lost(&self.table, s.target.rank, &s.target.at, "sending a read", &e))?;
            }
            if let Some(p) = profile {
                p.add(Span::Post, t);
            }
            // ...then every answer, placed as it arrives.
            for s in shares.iter_mut() {
                let Some(chunk) = s.rows.chunks(per).nth(round) else { continue };
                let (n, first) = (chunk.len(), round * per);
                let bytes = n * len;
                let t = Instant::now();
                let r = s.conn.answer(&self.table, s.target.rank, &s.target.at, bytes)?;
                if !r.ok {
                    let msg = s.conn.message(r.bytes, &self.table, s.target.rank, &s.target.at)?;
                    return Err(Error::Common(CommonError::PeerFailed { rank: s.target.rank, detail: msg }));
                }
                let lost = |e: std::io::Error| client::lost(&self.table, s.target.rank, &s.target.at, "reading rows", &e);
                match &mut s.dest {
                    Dest::Direct(places) => {
                        s.conn.read_into(&mut places[first..first + n]).map_err(lost)?;
                        s.conn.settled();
                        if let Some(p) = profile {
                            p.add(Span::Wait, t);
                        }
                    }
                    Dest::Staged(staging) => {
                        staging.resize(bytes, 0);
                        s.conn.read_exact(staging).map_err(lost)?;
                        s.conn.settled();
                        if let Some(p) = profile {
                            p.add(Span::Wait, t);
                        }
                        let src = RowSource::from_slice(staging, len)?;
                        let order: Vec<usize> = (0..n).collect();
                        let out = out
                            .as_deref_mut()
                            .ok_or_else(|| Error::Common(CommonError::InvalidArgument("no output to convert into".into())))?;
                        timed(profile, Span::Copy, || {
                            gather_from(&src, &staged, &order, Some(&s.slots[first..first + n]), out, out_dtype, 1)
                        })?;
                    }
                }
            }
        }
        Ok(())
    }
}
