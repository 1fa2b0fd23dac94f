//! Discovering which rows each file holds, before any data is read.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::npy::Header;
use super::{FileKind, RowFormat, ShardSet, Source};
use crate::CommonError;
use crate::DType;
use crate::error::ShardProblem;
use crate::{Error, Result};

/// One file of a [`Layout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardFile {
    /// Where it is.
    pub path: PathBuf,
    /// Rows it holds.
    pub rows: u64,
    /// Byte offset of its first row (0 for raw files).
    pub data_offset: u64,
}

/// What a set of shard files holds: the files in order, the rows of each
/// and their cumulative offsets, the element type and the row shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    files: Vec<ShardFile>,
    /// `offsets[i]` is the first global row of file `i`; one more entry
    /// holds the total.
    offsets: Vec<u64>,
    elem: DType,
    row_shape: Vec<u64>,
}

/// A piece of a read: rows `file_rows` of file `file` go to the
/// destination's rows starting at `dest_row` (relative to the range asked
/// for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Index into [`Layout::files`].
    pub file: usize,
    /// Rows within the file.
    pub file_rows: Range<u64>,
    /// Where they go, in rows from the start of the range asked for.
    pub dest_row: u64,
}

impl Layout {
    /// The files, in row order.
    pub fn files(&self) -> &[ShardFile] {
        &self.files
    }

    /// Rows in all files together.
    pub fn rows(&self) -> u64 {
        *self.offsets.last().expect("offsets has files + 1 entries")
    }

    /// The first global row of each file, then the total.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// The element type of every file.
    pub fn element_type(&self) -> DType {
        self.elem
    }

    /// The shape of one row (the dimensions after the first).
    pub fn row_shape(&self) -> &[u64] {
        &self.row_shape
    }

    /// Bytes per row (`u64::MAX` for a row shape whose size does not fit:
    /// files of no rows may declare any shape, and no table matches it).
    pub fn row_bytes(&self) -> u64 {
        self.row_shape.iter().try_fold(self.elem.size() as u64, |a, &d| a.checked_mul(d)).unwrap_or(u64::MAX)
    }

    /// The pieces of files that hold global rows `rows`, in order: a binary
    /// search for the first file, then every file up to the end of the
    /// range (files without rows are skipped).
    pub fn pieces(&self, rows: Range<u64>) -> Vec<Piece> {
        let mut out = Vec::new();
        if rows.is_empty() {
            return out;
        }
        let n = self.files.len();
        let mut f = self.offsets[..n].partition_point(|&o| o <= rows.start).saturating_sub(1);
        while f < n && self.offsets[f] < rows.end {
            let (lo, hi) = (rows.start.max(self.offsets[f]), rows.end.min(self.offsets[f + 1]));
            if lo < hi {
                out.push(Piece { file: f, file_rows: lo - self.offsets[f]..hi - self.offsets[f], dest_row: lo - rows.start });
            }
            f += 1;
        }
        out
    }

    /// A text that two ranks produce alike exactly when they see the same
    /// layout: one line per file, by file name (not the full path: nodes may
    /// mount a shared file system at different places), then the totals.
    pub(crate) fn canonical(&self) -> String {
        let mut s = String::new();
        for f in &self.files {
            let name = f.path.file_name().map_or_else(|| f.path.display().to_string(), |n| n.to_string_lossy().into_owned());
            s.push_str(&format!("{name}: {} rows from byte {}\n", f.rows, f.data_offset));
        }
        s.push_str(&format!("{} files, element type {}, row shape {:?}\n", self.files.len(), self.elem, self.row_shape));
        s
    }

    /// Checks the layout against the table it is loaded into.
    pub(crate) fn check_table(&self, row: &RowFormat, table_rows: usize, place: &Path) -> Result<()> {
        let first = self.files.first().map_or(place, |f| f.path.as_path());
        if self.elem != row.elem {
            return Err(Error::shards(first, ShardProblem::ElementType { file: self.elem.name(), table: row.elem.name() }));
        }
        if self.row_shape != row.shape {
            return Err(Error::shards(first, ShardProblem::RowShape { file: self.row_shape.clone(), table: row.shape.clone() }));
        }
        if self.rows() != table_rows as u64 {
            return Err(Error::shards(place, ShardProblem::RowCount { files: self.rows(), table: table_rows as u64 }));
        }
        Ok(())
    }
}

/// The first line where two canonical layouts differ, as
/// `(reference's line, other's line)`.
pub(crate) fn first_difference<'a>(reference: &'a str, other: &'a str) -> (&'a str, &'a str) {
    let (a, b): (Vec<&str>, Vec<&str>) = (reference.lines().collect(), other.lines().collect());
    for i in 0..a.len().max(b.len()) {
        match (a.get(i), b.get(i)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => return (x.copied().unwrap_or("(no more files)"), y.copied().unwrap_or("(no more files)")),
        }
    }
    ("", "")
}

/// Parses `shard_<digits>.npy`.
fn shard_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("shard_")?.strip_suffix(".npy")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `name` is a shard file's name, `shard_<digits>.npy`.
pub(crate) fn is_shard_name(name: &str) -> bool {
    shard_number(name).is_some()
}

/// The canonical name of shard `n`.
pub(crate) fn shard_name(n: u64) -> String {
    format!("shard_{n:04}.npy")
}

/// The `shard_NNNN.npy` files of `dir`, in numbering order, checked to run
/// from 0 without gaps or duplicates.
pub(crate) fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Error::shards(dir, ShardProblem::MissingDirectory)),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Err(Error::shards(dir, ShardProblem::NotADirectory)),
        Err(e) => return Err(Error::os(format!("listing {}", dir.display()), e)),
    };
    let mut found: Vec<(u64, String)> = Vec::new();
    for e in entries {
        let e = e.map_err(|e| Error::os(format!("listing {}", dir.display()), e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(n) = shard_number(&name) {
            found.push((n, name));
        }
    }
    if found.is_empty() {
        return Err(Error::shards(dir, ShardProblem::NoShards));
    }
    found.sort();
    for (i, w) in found.windows(2).enumerate() {
        if w[0].0 == w[1].0 {
            let problem = ShardProblem::DuplicateShard { number: w[0].0, first: w[0].1.clone(), second: w[1].1.clone() };
            return Err(Error::shards(dir.join(&found[i + 1].1), problem));
        }
    }
    for (expect, (n, name)) in found.iter().enumerate() {
        if *n != expect as u64 {
            let problem = ShardProblem::MissingShard { missing: shard_name(expect as u64), next: Some(name.clone()) };
            return Err(Error::shards(dir, problem));
        }
    }
    Ok(found.into_iter().map(|(_, name)| dir.join(name)).collect())
}

/// Opens `path` for reading.
pub(crate) fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| Error::os(format!("opening {}", path.display()), e))
}

fn file_size(file: &File, path: &Path) -> Result<u64> {
    Ok(file.metadata().map_err(|e| Error::os(format!("reading the size of {}", path.display()), e))?.len())
}

/// Reads every file's header (or size, for raw files) and builds the layout.
/// Fails on the first file that is unusable or differs from the first.
pub(crate) fn discover(set: &ShardSet, row: &RowFormat) -> Result<Layout> {
    let paths = match &set.source {
        Source::Dir(dir) => shard_paths(dir)?,
        Source::Files(list) => list.clone(),
    };
    let mut files = Vec::with_capacity(paths.len());
    let mut first: Option<(DType, Vec<u64>, String)> = None;
    for path in paths {
        let file = open(&path)?;
        let size = file_size(&file, &path)?;
        let (rows, data_offset, elem, row_shape) = match set.kind {
            FileKind::Raw => {
                let Some(rb) = row.shape.iter().try_fold(row.elem.size() as u64, |a, &d| a.checked_mul(d)) else {
                    return Err(Error::shards(path, ShardProblem::ShapeOverflow { shape: row.shape.clone(), elem: row.elem.name() }));
                };
                if size % rb != 0 {
                    return Err(Error::shards(path, ShardProblem::RawSize { bytes: size, row_bytes: rb }));
                }
                (size / rb, 0, row.elem, row.shape.clone())
            }
            FileKind::Npy => {
                let p = Header::read(&file).map_err(|p| Error::shards(&path, p))?;
                let elem = p.header.element_type().map_err(|p| Error::shards(&path, p))?;
                if p.header.fortran_order {
                    return Err(Error::shards(path, ShardProblem::FortranOrder));
                }
                let Some((&rows, rest)) = p.header.shape.split_first() else {
                    return Err(Error::shards(path, ShardProblem::NoRowAxis));
                };
                let expected = rest
                    .iter()
                    .chain([&rows, &(elem.size() as u64)])
                    .try_fold(1u64, |a, &d| a.checked_mul(d))
                    .and_then(|d| d.checked_add(p.data_offset));
                let Some(expected) = expected else {
                    let problem = ShardProblem::ShapeOverflow { shape: p.header.shape.clone(), elem: elem.name() };
                    return Err(Error::shards(path, problem));
                };
                if expected != size {
                    return Err(Error::shards(path, ShardProblem::FileSize { expected, offset: p.data_offset, actual: size }));
                }
                (rows, p.data_offset, elem, rest.to_vec())
            }
        };
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        match &first {
            None => first = Some((elem, row_shape.clone(), name)),
            Some((e, s, first_name)) => {
                let differs = |field, this: String, that: String| {
                    Error::shards(&path, ShardProblem::FilesDiffer { field, this, that, first: first_name.clone() })
                };
                if *e != elem {
                    return Err(differs("element type", elem.name().to_owned(), e.name().to_owned()));
                }
                if *s != row_shape {
                    return Err(differs("row shape", format!("{row_shape:?}"), format!("{s:?}")));
                }
            }
        }
        files.push(ShardFile { path, rows, data_offset });
    }
    let Some((elem, row_shape, _)) = first else {
        return Err(Error::Common(CommonError::InvalidArgument("an empty list of shard files".into())));
    };
    let mut offsets = Vec::with_capacity(files.len() + 1);
    let mut acc = 0u64;
    offsets.push(0);
    for f in &files {
        acc = acc
            .checked_add(f.rows)
            .ok_or_else(|| Error::Common(CommonError::InvalidArgument("the files hold more than 2^64 rows".into())))?;
        offsets.push(acc);
    }
    Ok(Layout { files, offsets, elem, row_shape })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(rows: &[u64]) -> Layout {
        let files =
            rows.iter().enumerate().map(|(i, &r)| ShardFile { path: shard_name(i as u64).into(), rows: r, data_offset: 128 }).collect();
        let mut offsets = vec![0];
        for r in rows {
            offsets.push(offsets.last().unwrap() + r);
        }
        Layout { files, offsets, elem: DType::F32, row_shape: vec![3] }
    }

    /// Every row of `range` is covered once, in order, by the right file.
    fn check_cover(l: &Layout, range: Range<u64>) {
        let mut next = range.start;
        for p in l.pieces(range.clone()) {
            assert!(!p.file_rows.is_empty());
            assert_eq!(l.offsets[p.file] + p.file_rows.start, next, "{range:?}: {p:?}");
            assert_eq!(p.dest_row, next - range.start);
            assert!(p.file_rows.end <= l.files[p.file].rows);
            next += p.file_rows.end - p.file_rows.start;
        }
        assert_eq!(next, range.end.max(range.start));
    }

    #[test]
    fn pieces_cover_any_range_once() {
        for rows in [vec![10, 10, 10], vec![0, 7, 0, 0, 1, 22, 0], vec![30], vec![1; 30], vec![5, 0, 0, 25, 0]] {
            let l = layout(&rows);
            let total = l.rows();
            assert_eq!(total, rows.iter().sum::<u64>());
            for lo in 0..=total {
                for hi in lo..=total {
                    check_cover(&l, lo..hi);
                }
            }
        }
        let l = layout(&[4, 0, 6]);
        let p = l.pieces(2..8);
        assert_eq!(p, vec![Piece { file: 0, file_rows: 2..4, dest_row: 0 }, Piece { file: 2, file_rows: 0..4, dest_row: 2 }]);
    }

    #[test]
    fn shard_names_parse_strictly() {
        assert_eq!(shard_number("shard_0000.npy"), Some(0));
        assert_eq!(shard_number("shard_12345.npy"), Some(12345));
        assert_eq!(shard_number("shard_7.npy"), Some(7));
        for bad in ["shard_.npy", "shard_00a1.npy", "shard_0001.npy.tmp", "Shard_0001.npy", "shard_-1.npy", "shard_0001.bin"] {
            assert_eq!(shard_number(bad), None, "{bad}");
        }
        assert_eq!(shard_name(3), "shard_0003.npy");
        assert_eq!(shard_name(12345), "shard_12345.npy");
    }

    /// A fresh directory under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("wholemem-layout-test.{}.{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn npy(path: &Path, descr: &str, shape: &[u64], data_bytes: usize) {
        let mut b = Header::new(descr, shape).to_bytes();
        b.resize(b.len() + data_bytes, 7);
        std::fs::write(path, b).unwrap();
    }

    #[test]
    fn discovery_reads_headers_and_sizes() {
        let d = scratch("discover");
        for (i, rows) in [4u64, 0, 9].into_iter().enumerate() {
            npy(&d.join(shard_name(i as u64)), "<i2", &[rows, 3], rows as usize * 6);
        }
        std::fs::write(d.join("shard_0001.npy.tmp"), b"ignored").unwrap();
        let row = RowFormat::vector(DType::I16, 3);
        let l = ShardSet::npy_dir(&d).discover(&row).unwrap();
        assert_eq!((l.offsets(), l.element_type(), l.row_shape(), l.row_bytes()), (&[0, 4, 4, 13][..], DType::I16, &[3][..], 6));
        assert!(l.files().iter().all(|f| f.data_offset == 128));
        l.check_table(&row, 13, &d).unwrap();
        let e = l.check_table(&row, 14, &d).unwrap_err();
        assert!(matches!(&e, Error::Shards { problem: ShardProblem::RowCount { files: 13, table: 14 }, .. }), "{e}");

        std::fs::remove_file(d.join(shard_name(1))).unwrap();
        let e = ShardSet::npy_dir(&d).discover(&row).unwrap_err();
        assert!(e.to_string().ends_with("shard_0001.npy is missing (the next file is shard_0002.npy)"), "{e}");

        let raw = d.join("rows.bin");
        std::fs::write(&raw, vec![0u8; 6 * 5 + 1]).unwrap();
        let e = ShardSet::raw_files([&raw]).discover(&row).unwrap_err();
        assert!(matches!(&e, Error::Shards { problem: ShardProblem::RawSize { bytes: 31, row_bytes: 6 }, .. }), "{e}");
        std::fs::write(&raw, vec![0u8; 6 * 5]).unwrap();
        assert_eq!(ShardSet::raw_files([&raw, &raw]).discover(&row).unwrap().offsets(), &[0, 5, 10]);
        let wide = RowFormat { elem: DType::I16, shape: vec![1 << 62, 3] };
        let e = ShardSet::raw_files([&raw]).discover(&wide).unwrap_err();
        assert!(e.to_string().ends_with("shape [4611686018427387904, 3] of i16 elements is more than 2^64 bytes"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Issue 30, item 6: an NPY header whose shape's size is past 2^64
        /// bytes was reported as a file size of `u64::MAX` (a stand-in,
        /// not the header's values). Dimensions near 2^32, 2^63 and 2^64:
        /// an error naming the shape, never a panic.
        #[test]
        fn npy_shape_past_2_pow_64_bytes_named_by_a_stand_in(
            shape in proptest::collection::vec(
                proptest::prop_oneof![1u64..=16, (1u64 << 32) - 2..=(1u64 << 32) + 2, (1u64 << 63) - 2..=(1u64 << 63) + 2, u64::MAX - 2..=u64::MAX],
                2..5,
            ),
        ) {
            let bytes = shape.iter().try_fold(8u64, |a, &d| a.checked_mul(d)).and_then(|b| b.checked_add(128));
            proptest::prop_assume!(bytes.is_none());
            let d = scratch(&format!("shape-{:x}", shape.iter().fold(0u64, |h, &x| h.rotate_left(7) ^ x)));
            let path = d.join(shard_name(0));
            npy(&path, "<f8", &shape, 64);
            let e = ShardSet::npy_files([&path]).discover(&RowFormat::vector(DType::F64, 1)).unwrap_err();
            std::fs::remove_dir_all(&d).unwrap();
            proptest::prop_assert!(e.to_string().contains(&format!("{shape:?}")), "{}", e);
        }
    }

    #[test]
    fn differences_name_the_first_differing_line() {
        assert_eq!(first_difference("a\nb\nc\n", "a\nx\nc\n"), ("b", "x"));
        assert_eq!(first_difference("a\n", "a\nb\n"), ("(no more files)", "b"));
    }
}
