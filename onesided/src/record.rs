//! What a reader needs to know about a published table, and the checks
//! every record passes before anything indexes by it: a record comes from a
//! file or a socket, so it is input like any other.

use serde::{Deserialize, Serialize};
use wholemem::CommonError;
use wholemem::{Location, MemoryType, Partition};
use wm_gather::DType;
use wm_topology::NodeIdentity;

use crate::{Error, Result};

/// The version of the record format, and of the read servers' protocol
/// (`wire`) that its addresses lead to: 2 since answers carry the id of
/// their request. A reader of another version is refused with both named.
pub(crate) const VERSION: u32 = 2;
/// The largest record accepted, in bytes.
pub(crate) const RECORD_MAX: usize = 16 << 20;
/// The most owners a record may list.
const OWNERS_MAX: usize = 1 << 16;
/// The most memfds one owner's rows lie in.
pub(crate) const PIECES_MAX: usize = 8;
/// Longest host name, node id or socket name in a record.
const NAME_MAX: usize = 512;
/// The prefix of every read server's abstract socket name.
pub(crate) const UNIX_PREFIX: &str = "wholemem.onesided.";

/// How a reader reaches one rank's rows over libfabric.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct FabricRecord {
    /// The provider that registered the rows (`tcp;ofi_rxm`, `verbs;ofi_rxm`, …).
    pub provider: String,
    /// The endpoint's address (`fi_getname`), hexadecimal.
    pub addr: String,
    /// The registration's key.
    pub key: u64,
    /// The remote address of the first row: the virtual address where the
    /// provider wants one (`FI_MR_VIRT_ADDR`), else an offset (0).
    pub base: u64,
}

/// One rank's part of a table: where its rows are and how to reach them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct OwnerRecord {
    /// Its world rank.
    pub rank: usize,
    /// Its node (id, host name, whether `WM_NODE_ID` set it).
    pub node_id: String,
    pub hostname: String,
    pub node_overridden: bool,
    /// Its read server: an abstract Unix socket name (same node) and a TCP
    /// address.
    pub unix_name: String,
    pub tcp_addr: String,
    /// The nonce a reader names in its handshake.
    pub nonce: u64,
    /// The memfds holding its rows, by size (mapped side by side), and
    /// where the first row starts in them.
    pub pieces: Vec<u64>,
    pub offset: u64,
    /// Its libfabric registration, if it made one.
    pub fabric: Option<FabricRecord>,
}

impl OwnerRecord {
    pub(crate) fn node(&self) -> NodeIdentity {
        NodeIdentity::from_parts(self.node_id.clone(), self.hostname.clone(), self.node_overridden)
    }
}

/// Everything a reader needs about a published table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct TableRecord {
    pub version: u32,
    pub name: String,
    /// A random id of this table's life: a record of an earlier table of
    /// the same name has another.
    pub id: u64,
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// The element type and elements per row.
    pub dtype: String,
    pub cols: u64,
    pub memory_type: String,
    pub location: String,
    /// Rows per rank.
    pub counts: Vec<u64>,
    /// Publishes so far when this record was written.
    pub epoch: u64,
    pub owners: Vec<OwnerRecord>,
}

/// A table name: 1 to 64 of `[A-Za-z0-9_.-]`, not starting with a dot (it
/// becomes part of a file name).
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] naming the name.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Common(CommonError::InvalidArgument(format!(
            "table name {name:?}: use 1 to 64 letters, digits, `_`, `.` or `-`, not starting with `.`"
        ))))
    }
}

impl TableRecord {
    /// Checks every field, so that nothing computed from the record later
    /// overflows or indexes out of bounds. `from` names the source.
    pub(crate) fn check(&self, from: &str) -> Result<Checked> {
        let bad = |detail: String| Error::Malformed { from: from.to_owned(), detail: format!("table record: {detail}") };
        if self.version != VERSION {
            return Err(bad(format!("version {} (this build reads version {VERSION})", self.version)));
        }
        check_name(&self.name).map_err(|e| bad(e.to_string()))?;
        let dtype: DType = self.dtype.parse().map_err(|_| bad(format!("unknown element type {:?}", self.dtype)))?;
        let ty: MemoryType = self.memory_type.parse().map_err(|_| bad(format!("unknown memory type {:?}", self.memory_type)))?;
        let loc: Location = self.location.parse().map_err(|_| bad(format!("unknown location {:?}", self.location)))?;
        let n = self.owners.len();
        if n == 0 || n > OWNERS_MAX || self.counts.len() != n {
            return Err(bad(format!("{n} owners and {} row counts (1 to {OWNERS_MAX}, one each)", self.counts.len())));
        }
        let row_bytes =
            usize::try_from(self.row_bytes).ok().filter(|&b| b > 0).ok_or_else(|| bad(format!("rows of {} bytes", self.row_bytes)))?;
        let cols = usize::try_from(self.cols).ok().filter(|&c| c > 0).ok_or_else(|| bad(format!("{} elements per row", self.cols)))?;
        if cols.checked_mul(dtype.size()) != Some(row_bytes) {
            return Err(bad(format!("{cols} {dtype} elements are not rows of {row_bytes} bytes")));
        }
        // Reads convert: a row in the widest element type must fit an
        // address space too (a record of no rows may not claim any width).
        let widest = DType::ALL.iter().map(|d| d.size()).max().unwrap_or(8);
        let widest_row = wholemem::checked_size("a row converted to the widest element type, columns × bytes", &[cols, widest])
            .map_err(|e| bad(e.to_string()))?;
        if widest_row > isize::MAX as usize {
            return Err(bad(format!("rows of {cols} elements of up to {widest} bytes are more than any address space")));
        }
        let mut counts = Vec::with_capacity(n);
        let mut sum = 0usize;
        for &c in &self.counts {
            let c = usize::try_from(c).map_err(|_| bad(format!("a count of {c} rows")))?;
            sum = sum.checked_add(c).ok_or_else(|| bad("row counts add up past usize::MAX".into()))?;
            counts.push(c);
        }
        let rows = usize::try_from(self.rows)
            .ok()
            .filter(|&r| r == sum)
            .ok_or_else(|| bad(format!("{} rows but counts adding up to {sum}", self.rows)))?;
        if rows.checked_mul(row_bytes).is_none_or(|t| t > isize::MAX as usize) {
            return Err(bad(format!("{rows} rows of {row_bytes} bytes are more than any address space")));
        }
        for (r, o) in self.owners.iter().enumerate() {
            let bad_owner = |d: String| bad(format!("owner {r}: {d}"));
            if o.rank > OWNERS_MAX * 64 {
                return Err(bad_owner(format!("world rank {}", o.rank)));
            }
            if o.node_id.is_empty() || o.node_id.len() > NAME_MAX || o.hostname.len() > NAME_MAX {
                return Err(bad_owner(format!("a node id or host name empty or longer than {NAME_MAX} bytes")));
            }
            if !o.unix_name.starts_with(UNIX_PREFIX) || o.unix_name.len() > 100 {
                return Err(bad_owner(format!("a socket name that is not `{UNIX_PREFIX}…` of at most 100 bytes")));
            }
            match o.tcp_addr.parse::<std::net::SocketAddr>() {
                Ok(a) if !a.ip().is_unspecified() && a.port() != 0 => {}
                _ => return Err(bad_owner(format!("TCP address {:?}", o.tcp_addr))),
            }
            let need = (counts[r] * row_bytes) as u64;
            if o.pieces.len() > PIECES_MAX {
                return Err(bad_owner(format!("{} portion pieces (at most {PIECES_MAX})", o.pieces.len())));
            }
            let file_bytes = o.pieces.iter().try_fold(0u64, |a, &b| a.checked_add(b)).filter(|&t| t <= isize::MAX as u64);
            match file_bytes {
                Some(f) if o.offset.checked_add(need).is_some_and(|end| end <= f) => {}
                _ => {
                    return Err(bad_owner(format!(
                        "{} rows of {row_bytes} bytes from byte {} do not fit its portion of {:?} bytes",
                        counts[r], o.offset, o.pieces
                    )));
                }
            }
            if let Some(f) = &o.fabric {
                if f.provider.is_empty()
                    || f.provider.len() > 64
                    || f.addr.len() > 1024
                    || f.addr.len() % 2 != 0
                    || !f.addr.bytes().all(|b| b.is_ascii_hexdigit())
                {
                    return Err(bad_owner("a libfabric record with a bad provider or address".into()));
                }
            }
        }
        Ok(Checked { dtype, cols, row_bytes, rows, ty, loc, partition: Partition::from_counts(&counts) })
    }

    /// Parses and checks a record.
    pub(crate) fn parse(bytes: &[u8], from: &str) -> Result<(Self, Checked)> {
        if bytes.len() > RECORD_MAX {
            return Err(Error::Malformed {
                from: from.to_owned(),
                detail: format!("a table record of {} bytes (at most {RECORD_MAX})", bytes.len()),
            });
        }
        let r: Self = serde_json::from_slice(bytes)
            .map_err(|e| Error::Malformed { from: from.to_owned(), detail: format!("the table record does not parse: {e}") })?;
        let c = r.check(from)?;
        Ok((r, c))
    }
}

/// What a checked record says, in the types the reader works with.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub dtype: DType,
    pub cols: usize,
    pub row_bytes: usize,
    pub rows: usize,
    pub ty: MemoryType,
    pub loc: Location,
    pub partition: Partition,
}

/// Hexadecimal of bytes.
#[cfg_attr(not(feature = "fabric"), allow(dead_code))]
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes from hexadecimal (checked by the record's check first).
#[cfg_attr(not(feature = "fabric"), allow(dead_code))]
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    pub(crate) fn sample() -> TableRecord {
        let owner = |rank: usize, count: u64| OwnerRecord {
            rank,
            node_id: "node0".into(),
            hostname: "h".into(),
            node_overridden: true,
            unix_name: format!("{UNIX_PREFIX}1.2"),
            tcp_addr: "127.0.0.1:4000".into(),
            nonce: 9,
            pieces: vec![count * 16],
            offset: 0,
            fabric: None,
        };
        TableRecord {
            version: VERSION,
            name: "feat".into(),
            id: 1,
            rows: 10,
            row_bytes: 16,
            dtype: "f32".into(),
            cols: 4,
            memory_type: "distributed".into(),
            location: "host".into(),
            counts: vec![6, 0, 4],
            epoch: 1,
            owners: vec![owner(0, 6), owner(1, 0), owner(2, 4)],
        }
    }

    #[test]
    fn a_good_record_passes_and_bad_ones_name_the_field() {
        let r = sample();
        let c = r.check("test").unwrap();
        assert_eq!((c.rows, c.cols, c.partition.owner(7)), (10, 4, 2));
        type Change = Box<dyn Fn(&mut TableRecord)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|r| r.rows = 11), "11 rows but counts adding up to 10"),
            (Box::new(|r| r.counts[0] = u64::MAX), "add up past"),
            (Box::new(|r| r.cols = 5), "5 f32 elements are not rows of 16 bytes"),
            (Box::new(|r| r.owners[2].pieces = vec![32, 31]), "do not fit its portion"),
            (Box::new(|r| r.owners[2].pieces = vec![u64::MAX, 2]), "do not fit its portion"),
            (Box::new(|r| r.owners[2].pieces = vec![1; 9]), "9 portion pieces"),
            (Box::new(|r| r.owners[2].offset = u64::MAX), "do not fit its portion"),
            (Box::new(|r| r.owners[0].tcp_addr = "0.0.0.0:1".into()), "TCP address"),
            (Box::new(|r| r.owners[0].unix_name = "other".into()), "socket name"),
            (Box::new(|r| r.counts.pop().map(drop).unwrap_or(())), "3 owners and 2 row counts"),
            (Box::new(|r| r.dtype = "f128".into()), "unknown element type"),
            (Box::new(|r| r.name = "../x".into()), "table name"),
            (Box::new(|r| r.version = 7), "version 7"),
        ];
        for (change, want) in cases {
            let mut r = sample();
            change(&mut r);
            let e = r.check("test").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        assert!(TableRecord::parse(&vec![b' '; RECORD_MAX + 1], "f").unwrap_err().to_string().contains("at most"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Issue 30, item 6: a record of no rows could declare rows of any
        /// width, and reads multiplied its columns by the output's element
        /// size unchecked (`cols × 8` past `usize::MAX` for a row of `i8`
        /// read as `i64`). Columns from a quarter of `isize::MAX` to
        /// `usize::MAX`: refused, naming the columns, never a panic.
        #[test]
        fn record_columns_past_a_converted_row_overflowed_reads(cols in prop_oneof![
            (isize::MAX as u64) / 8 + 1..=(isize::MAX as u64) / 8 + 64,
            u64::MAX - 64..=u64::MAX,
            (isize::MAX as u64) / 8 + 1..=u64::MAX,
        ]) {
            let mut r = sample();
            (r.rows, r.counts, r.dtype, r.cols, r.row_bytes) = (0, vec![0; 3], "i8".into(), cols, cols);
            for o in &mut r.owners {
                o.pieces = vec![0];
            }
            let e = r.check("test").map(|c| c.cols).expect_err("columns no read can convert");
            prop_assert!(e.to_string().contains(&cols.to_string()), "{}", e);
        }
    }

    #[test]
    fn names_are_checked() {
        for ok in ["a", "features", "x.y-z_1", &"a".repeat(64)] {
            check_name(ok).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "sp ace", &"a".repeat(65), "é"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = TableRecord::parse(&bytes, "fuzz");
        }

        #[test]
        fn mutated_records_never_panic(i in 0usize..10, v in any::<u64>()) {
            let mut r = sample();
            match i {
                0 => r.rows = v,
                1 => r.row_bytes = v,
                2 => r.cols = v,
                3 => r.counts[1] = v,
                4 => r.owners[0].pieces = vec![v, v],
                5 => r.owners[2].offset = v,
                6 => r.owners[1].rank = v as usize,
                7 => r.epoch = v,
                8 => r.counts[0] = v,
                _ => r.id = v,
            }
            let _ = r.check("fuzz");
        }
    }
}
