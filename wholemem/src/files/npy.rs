//! The NPY format, read and written here rather than through a dependency.
//!
//! A file is the magic `\x93NUMPY`, a major and minor version byte, the
//! header length (2 bytes little-endian in version 1.0, 4 bytes in 2.0 and
//! 3.0), then the header: a Python dict literal with the keys `descr` (the
//! element type, e.g. `'<f4'`), `fortran_order` and `shape`, padded with
//! spaces and ending in a newline so that the data starts at a multiple of 64
//! bytes (16 in files of older numpy releases; readers accept any offset).
//! The data follows, row-major when `fortran_order` is `False`.
//!
//! Only little-endian element types are accepted, and only the ones a table
//! holds: `<f2`, `<f4`, `<f8`, `|i1`, `<i2`, `<i4`, `<i8`. numpy has no
//! bfloat16, so bf16 tables use raw files (see `docs/loading.md`).

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::DType;
use crate::error::ShardProblem;

/// The first six bytes of every NPY file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Data offsets of written files are multiples of this.
pub const ALIGN: usize = 64;

/// The header of an NPY file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The element type as numpy writes it, e.g. `<f4`.
    pub descr: String,
    /// Whether the data is column-major.
    pub fortran_order: bool,
    /// Size of each dimension.
    pub shape: Vec<u64>,
}

/// A parsed header and where its data starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The header.
    pub header: Header,
    /// Byte offset of the first data byte.
    pub data_offset: u64,
    /// The format version, (major, minor).
    pub version: (u8, u8),
}

fn not_npy(reason: impl Into<String>) -> ShardProblem {
    ShardProblem::NotNpy { reason: reason.into() }
}

impl Header {
    /// A header for row-major data of `descr` and `shape`.
    pub fn new(descr: &str, shape: &[u64]) -> Self {
        Self { descr: descr.to_owned(), fortran_order: false, shape: shape.to_vec() }
    }

    /// Parses the header at the start of `bytes`, which must hold at least
    /// the whole header (it may hold more).
    ///
    /// # Errors
    /// [`ShardProblem::NotNpy`] saying what is wrong: the magic, the
    /// version, a header cut short, a dict that does not parse, a missing or
    /// unexpected key.
    pub fn parse(bytes: &[u8]) -> Result<Parsed, ShardProblem> {
        let (version, len_bytes, prefix) = prefix(bytes)?;
        let hlen = header_len(&bytes[8..prefix], len_bytes);
        let end = prefix.checked_add(hlen).ok_or_else(|| not_npy("the header length overflows"))?;
        let text = bytes.get(prefix..end).ok_or_else(|| {
            not_npy(format!("the header promises {hlen} bytes after offset {prefix}, only {} are there", bytes.len() - prefix))
        })?;
        let text = if version.0 >= 3 {
            std::str::from_utf8(text).map_err(|e| not_npy(format!("the version 3 header is not UTF-8: {e}")))?.to_owned()
        } else {
            // Versions 1 and 2 are latin-1.
            text.iter().map(|&b| char::from(b)).collect()
        };
        let header = parse_dict(&text)?;
        Ok(Parsed { header, data_offset: end as u64, version })
    }

    /// Reads and parses the header of an open file.
    ///
    /// # Errors
    /// As [`parse`](Self::parse); an I/O error is reported as a
    /// [`ShardProblem::NotNpy`] naming it.
    pub fn read(file: &File) -> Result<Parsed, ShardProblem> {
        let mut start = [0u8; 12];
        let n = read_up_to(file, &mut start, 0).map_err(|e| not_npy(format!("cannot read the header: {e}")))?;
        let (_, len_bytes, prefix) = prefix(&start[..n])?;
        let hlen = header_len(&start[8..prefix], len_bytes);
        if hlen > 1 << 26 {
            return Err(not_npy(format!("a header of {hlen} bytes is not plausible")));
        }
        let mut all = vec![0u8; prefix + hlen];
        let n = read_up_to(file, &mut all, 0).map_err(|e| not_npy(format!("cannot read the header: {e}")))?;
        all.truncate(n);
        Self::parse(&all)
    }

    /// The file's first bytes: magic, version, length, the dict padded with
    /// spaces and a newline to a multiple of [`ALIGN`] bytes. Version 1.0
    /// unless the header needs more than 65535 bytes (then 2.0).
    pub fn to_bytes(&self) -> Vec<u8> {
        let shape = match self.shape.as_slice() {
            [] => "()".to_owned(),
            [n] => format!("({n},)"),
            s => format!("({})", s.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
        };
        let fortran = if self.fortran_order { "True" } else { "False" };
        let dict = format!("{{'descr': '{}', 'fortran_order': {fortran}, 'shape': {shape}, }}", self.descr);
        let build = |prefix: usize| {
            let hlen = (prefix + dict.len() + 1).next_multiple_of(ALIGN) - prefix;
            let mut h = dict.clone().into_bytes();
            h.resize(hlen - 1, b' ');
            h.push(b'\n');
            h
        };
        let mut out = MAGIC.to_vec();
        let h = build(10);
        if let Ok(len) = u16::try_from(h.len()) {
            out.extend_from_slice(&[1, 0]);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&h);
        } else {
            let h = build(12);
            out.extend_from_slice(&[2, 0]);
            out.extend_from_slice(&u32::try_from(h.len()).expect("a header under 4 GiB").to_le_bytes());
            out.extend_from_slice(&h);
        }
        out
    }

    /// The element type `descr` names.
    ///
    /// # Errors
    /// [`ShardProblem::BigEndian`] for a big-endian type;
    /// [`ShardProblem::UnsupportedDescr`] for one no table holds.
    pub fn element_type(&self) -> Result<DType, ShardProblem> {
        element_type(&self.descr)
    }
}

/// The element type a `descr` string names: little-endian (`<`, or `|` for
/// one-byte types) f2, f4, f8, i1, i2, i4, i8.
///
/// # Errors
/// As [`Header::element_type`].
pub fn element_type(descr: &str) -> Result<DType, ShardProblem> {
    let unsupported = || ShardProblem::UnsupportedDescr { descr: descr.to_owned() };
    let (order, code) = match descr.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (c, &descr[1..]),
        _ => return Err(unsupported()),
    };
    let ty = match code {
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        _ => return Err(unsupported()),
    };
    match order {
        '<' => Ok(ty),
        '|' | '>' if ty.size() == 1 => Ok(ty),
        '>' => Err(ShardProblem::BigEndian { descr: descr.to_owned() }),
        _ => Err(unsupported()),
    }
}

/// Checks magic and version; returns the version, the width of the length
/// field and the offset of the dict.
fn prefix(bytes: &[u8]) -> Result<((u8, u8), usize, usize), ShardProblem> {
    if bytes.len() < 6 || &bytes[..6] != MAGIC {
        let got = &bytes[..bytes.len().min(6)];
        return Err(not_npy(format!("it does not start with the NPY magic \\x93NUMPY (it starts with {got:02x?})")));
    }
    if bytes.len() < 8 {
        return Err(not_npy("the file ends inside the version field"));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let len_bytes = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => return Err(not_npy(format!("NPY version {major}.{minor} is not one of 1.0, 2.0, 3.0"))),
    };
    if bytes.len() < 8 + len_bytes {
        return Err(not_npy("the file ends inside the header length field"));
    }
    Ok(((major, minor), len_bytes, 8 + len_bytes))
}

fn header_len(field: &[u8], len_bytes: usize) -> usize {
    let mut b = [0u8; 4];
    b[..len_bytes].copy_from_slice(&field[..len_bytes]);
    u32::from_le_bytes(b) as usize
}

/// Reads up to `buf.len()` bytes at `offset`, fewer only at the end of the
/// file.
fn read_up_to(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A value of the header dict.
#[derive(Debug, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<u64>),
}

/// A cursor over the header text.
struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), ShardProblem> {
        match self.peek() {
            Some(got) if got == c => {
                self.i += 1;
                Ok(())
            }
            got => Err(self.unexpected(got, &format!("'{}'", char::from(c)))),
        }
    }

    fn unexpected(&self, got: Option<u8>, want: &str) -> ShardProblem {
        let at = got.map_or("the end".to_owned(), |c| format!("'{}' at position {}", char::from(c), self.i));
        not_npy(format!("the header dict has {at} where {want} was expected"))
    }

    fn string(&mut self) -> Result<String, ShardProblem> {
        let q = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            got => return Err(self.unexpected(got, "a quoted string")),
        };
        let start = self.i + 1;
        let len = self.s[start..].iter().position(|&c| c == q).ok_or_else(|| not_npy("a string in the header is not closed"))?;
        self.i = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }

    fn value(&mut self) -> Result<Value, ShardProblem> {
        match self.peek() {
            Some(b'\'' | b'"') => self.string().map(Value::Str),
            Some(b'(') => {
                self.i += 1;
                let mut dims = Vec::new();
                loop {
                    match self.peek() {
                        Some(b')') => {
                            self.i += 1;
                            return Ok(Value::Tuple(dims));
                        }
                        Some(c) if c.is_ascii_digit() => {
                            let start = self.i;
                            while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                                self.i += 1;
                            }
                            let digits = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII digits");
                            dims.push(digits.parse().map_err(|_| not_npy(format!("the dimension {digits} does not fit 64 bits")))?);
                            // Python 2 wrote long integers with an L.
                            if self.s.get(self.i) == Some(&b'L') {
                                self.i += 1;
                            }
                            match self.peek() {
                                Some(b',') => self.i += 1,
                                Some(b')') => {}
                                got => return Err(self.unexpected(got, "',' or ')' in the shape")),
                            }
                        }
                        got => return Err(self.unexpected(got, "a dimension or ')'")),
                    }
                }
            }
            Some(b'[') => Err(not_npy("a list descr (a structured dtype) is not a table of one element type")),
            _ => {
                let rest = &self.s[self.i..];
                for (word, v) in [(&b"True"[..], true), (&b"False"[..], false)] {
                    if rest.starts_with(word) {
                        self.i += word.len();
                        return Ok(Value::Bool(v));
                    }
                }
                Err(self.unexpected(rest.first().copied(), "a string, True, False or a tuple"))
            }
        }
    }
}

fn parse_dict(text: &str) -> Result<Header, ShardProblem> {
    let mut c = Cursor { s: text.as_bytes(), i: 0 };
    c.expect(b'{')?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        if c.peek() == Some(b'}') {
            c.i += 1;
            break;
        }
        let key = c.string()?;
        if !["descr", "fortran_order", "shape"].contains(&key.as_str()) {
            return Err(not_npy(format!("the header has the unexpected key '{key}'")));
        }
        c.expect(b':')?;
        let value = c.value()?;
        let slot_taken = match (key.as_str(), value) {
            ("descr", Value::Str(s)) => descr.replace(s).is_some(),
            ("fortran_order", Value::Bool(b)) => fortran.replace(b).is_some(),
            ("shape", Value::Tuple(t)) => shape.replace(t).is_some(),
            (_, v) => return Err(not_npy(format!("'{key}' has the wrong kind of value: {v:?}"))),
        };
        if slot_taken {
            return Err(not_npy(format!("the header gives '{key}' twice")));
        }
        match c.peek() {
            Some(b',') => c.i += 1,
            Some(b'}') => {}
            got => return Err(c.unexpected(got, "',' or '}'")),
        }
    }
    if let Some(got) = c.peek() {
        return Err(c.unexpected(Some(got), "the end of the header"));
    }
    let missing = |k: &str| not_npy(format!("the header lacks '{k}'"));
    Ok(Header {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `numpy.save` writes for `np.zeros((3, 4), np.float32)`, built
    /// here from the format description (numpy is not installed here): the
    /// 10-byte prefix with header length 118 (`'v'`), the dict, 58 spaces
    /// and a newline, 128 bytes in all.
    fn numpy_f32_3x4() -> Vec<u8> {
        let mut v = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }".to_vec();
        v.extend(std::iter::repeat_n(b' ', 58));
        v.push(b'\n');
        v
    }

    #[test]
    fn reads_and_writes_what_numpy_writes() {
        let bytes = numpy_f32_3x4();
        assert_eq!(bytes.len(), 128);
        let p = Header::parse(&bytes).unwrap();
        assert_eq!(p.header, Header::new("<f4", &[3, 4]));
        assert_eq!((p.data_offset, p.version), (128, (1, 0)));
        assert_eq!(Header::new("<f4", &[3, 4]).to_bytes(), bytes);
        assert_eq!(p.header.element_type().unwrap(), DType::F32);
    }

    #[test]
    fn written_headers_are_aligned_and_round_trip() {
        for (descr, shape) in [("<f2", vec![0u64, 7]), ("|i1", vec![5]), ("<i8", vec![]), ("<f8", vec![1 << 40, 3, 2])] {
            let h = Header::new(descr, &shape);
            let b = h.to_bytes();
            assert_eq!(b.len() % ALIGN, 0, "{descr} {shape:?}");
            assert_eq!(*b.last().unwrap(), b'\n');
            let p = Header::parse(&b).unwrap();
            assert_eq!((p.header, p.data_offset), (h, b.len() as u64));
        }
        // A header too long for version 1.0 is written as 2.0.
        let h = Header::new("<i4", &vec![1; 30_000]);
        let b = h.to_bytes();
        assert_eq!(&b[6..8], &[2, 0]);
        assert_eq!(b.len() % ALIGN, 0);
        assert_eq!(Header::parse(&b).unwrap().header, h);
    }

    fn with_dict(major: u8, dict: &str) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&[major, 0]);
        if major == 1 {
            v.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        } else {
            v.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        }
        v.extend_from_slice(dict.as_bytes());
        v
    }

    #[test]
    fn accepts_versions_2_and_3_and_older_spellings() {
        let dict = "{'descr': '<i2', 'fortran_order': False, 'shape': (9,), }\n";
        let p = Header::parse(&with_dict(2, dict)).unwrap();
        assert_eq!((p.header.shape, p.data_offset, p.version), (vec![9], 12 + dict.len() as u64, (2, 0)));
        let p = Header::parse(&with_dict(3, "{\"shape\": (2L, 3L), \"descr\": \"|i1\", \"fortran_order\": False}")).unwrap();
        assert_eq!(p.header, Header::new("|i1", &[2, 3]));
        // No trailing comma, odd whitespace, a 16-byte aligned (old numpy) header.
        let p = Header::parse(&with_dict(1, "{ 'descr':'<f8' ,'fortran_order':True,'shape':( 4 , 5 ) }    \n")).unwrap();
        assert!(p.header.fortran_order);
        assert_eq!(p.header.shape, vec![4, 5]);
    }

    fn problem(bytes: &[u8]) -> String {
        Header::parse(bytes).unwrap_err().to_string()
    }

    #[test]
    fn malformed_headers_say_what_is_wrong() {
        assert!(problem(b"PK\x03\x04 a zip file").contains("does not start with the NPY magic"));
        assert!(problem(b"\x93NUMPY\x04\x00\x10\x00").contains("version 4.0"));
        assert!(problem(b"\x93NUMPY\x01").contains("version field"));
        let mut cut = numpy_f32_3x4();
        cut.truncate(60);
        assert!(problem(&cut).contains("promises 118 bytes"));
        assert!(problem(&with_dict(1, "{'descr': '<f4', 'fortran_order': False}")).contains("lacks 'shape'"));
        assert!(problem(&with_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}")).contains("unexpected key 'x'"));
        assert!(problem(&with_dict(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}")).contains("'descr' twice"));
        assert!(problem(&with_dict(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}")).contains("structured dtype"));
        assert!(problem(&with_dict(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}")).contains("where a string, True, False"));
        assert!(problem(&with_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1)}")).contains("'-' at position"));
        assert!(problem(&with_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x")).contains("the end of the header"));
        assert!(problem(&with_dict(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}")).contains("where ',' or '}' was expected"));
    }

    mod arbitrary_input {
        use proptest::prelude::*;

        use super::super::*;
        use super::with_dict;

        /// Header text made of the pieces a dict is made of, so that the
        /// parser gets deep into it, not only to the magic.
        fn dictish() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just("{".to_owned()),
                Just("}".to_owned()),
                Just("'descr'".to_owned()),
                Just("'shape'".to_owned()),
                Just("'fortran_order'".to_owned()),
                Just(":".to_owned()),
                Just(",".to_owned()),
                Just("(".to_owned()),
                Just(")".to_owned()),
                Just("'<f4'".to_owned()),
                Just("True".to_owned()),
                Just("False".to_owned()),
                Just("L".to_owned()),
                Just("\"".to_owned()),
                Just("[".to_owned()),
                "[0-9]{1,25}",
                "[ \n\t]{0,3}",
                any::<char>().prop_map(String::from),
            ];
            prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// Any bytes at all: an error or a header, never a panic.
            #[test]
            fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
                let _ = Header::parse(&bytes);
            }

            /// A valid prefix with any length field and any bytes after it.
            #[test]
            fn any_header_after_the_magic_never_panics(
                version in prop_oneof![Just((1u8, 0u8)), Just((2, 0)), Just((3, 0)), any::<(u8, u8)>()],
                len in any::<u32>(),
                body in prop::collection::vec(any::<u8>(), 0..200),
            ) {
                let mut b = MAGIC.to_vec();
                b.extend_from_slice(&[version.0, version.1]);
                b.extend_from_slice(&len.to_le_bytes());
                b.extend_from_slice(&body);
                let _ = Header::parse(&b);
            }

            /// Dict-like text in a well-formed frame: parsed or refused,
            /// and what parses (with a plain descr, which is all the writer
            /// is for) writes back to the same header.
            #[test]
            fn dictish_headers_never_panic(text in dictish(), major in 1u8..=3) {
                if let Ok(p) = Header::parse(&with_dict(major, &text)) {
                    let _ = p.header.element_type();
                    if p.header.descr.bytes().all(|b| b.is_ascii_graphic() && b != b'\'' && b != b'"') {
                        let again = Header::parse(&p.header.to_bytes());
                        prop_assert_eq!(again.map(|q| q.header), Ok(p.header.clone()));
                    }
                }
            }

            /// Any descr string: a type or an error.
            #[test]
            fn any_descr_never_panics(d in ".{0,6}") {
                let _ = element_type(&d);
            }
        }
    }

    #[test]
    fn element_types_are_little_endian_table_types() {
        let ok = [
            ("<f2", DType::F16),
            ("<f4", DType::F32),
            ("<f8", DType::F64),
            ("|i1", DType::I8),
            ("<i1", DType::I8),
            ("<i2", DType::I16),
            ("<i4", DType::I32),
            ("<i8", DType::I64),
        ];
        for (d, t) in ok {
            assert_eq!(element_type(d).unwrap(), t, "{d}");
            if t != DType::I8 || d == "|i1" {
                assert_eq!(t.npy_descr(), Some(d));
            }
        }
        let e = element_type(">f4").unwrap_err();
        assert!(matches!(e, ShardProblem::BigEndian { .. }) && e.to_string().contains("'>f4'"), "{e}");
        for d in ["<u4", "|b1", "<c8", "=f4", "f4", "<V2", ""] {
            let e = element_type(d).unwrap_err();
            assert!(matches!(e, ShardProblem::UnsupportedDescr { .. }) && e.to_string().contains(&format!("'{d}'")), "{d}: {e}");
        }
        assert_eq!(DType::Bf16.npy_descr(), None);
    }
}
