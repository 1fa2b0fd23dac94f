//! The CUDA C source: the templates of `kernels.cu` plus one generated
//! `extern "C"` entry point per kernel, and the names those entry points
//! have (the contract with the launch code).

use std::fmt::Write as _;

use super::IdType;
use crate::DType;

/// Element types and conversions (first in the translation unit).
pub(crate) const CONVERT: &str = include_str!("convert.cuh");
/// The hash table of repeated ids (second).
pub(crate) const REPEATS: &str = include_str!("repeats.cuh");
/// The kernel templates.
const TEMPLATES: &str = include_str!("kernels.cu");

/// Widths, in bytes, of the plain copy kernels (same element type on both
/// sides), widest first.
pub(crate) const COPY_WIDTHS: [u32; 5] = [16, 8, 4, 2, 1];

/// Which way rows move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Direction {
    /// Table rows into a dense buffer.
    Gather,
    /// A dense buffer into table rows.
    Scatter,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Gather => "gather",
            Direction::Scatter => "scatter",
        }
    }
}

/// One kernel of the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Entry {
    /// Element-wise copy converting `from` (read side) into `to` (written side).
    Convert { dir: Direction, id: IdType, from: DType, to: DType },
    /// Same type on both sides: `width`-byte units.
    Copy { dir: Direction, id: IdType, width: u32 },
    /// Owner of every id and counts per owner.
    BucketCount { id: IdType },
    /// Ids grouped by owner, with their positions.
    BucketPlace { id: IdType },
    /// The exclusive prefix sum of the bucket counts.
    Scan,
    /// The first position of an id out of range, into a status word.
    CheckIds { id: IdType },
    /// Every id's highest position, into the hash table.
    RepeatMark { id: IdType },
    /// The keep mask: 1 at each id's highest position.
    RepeatKeep { id: IdType },
}

impl Entry {
    /// The `extern "C"` name.
    pub(crate) fn name(&self) -> String {
        match *self {
            Entry::Convert { dir, id, from, to } => format!("wm_{}_{}_{}_{}", dir.name(), id.name(), from.name(), to.name()),
            Entry::Copy { dir, id, width } => format!("wm_{}_copy{width}_{}", dir.name(), id.name()),
            Entry::BucketCount { id } => format!("wm_bucket_count_{}", id.name()),
            Entry::BucketPlace { id } => format!("wm_bucket_place_{}", id.name()),
            Entry::Scan => "wm_exclusive_scan".to_owned(),
            Entry::CheckIds { id } => format!("wm_check_ids_{}", id.name()),
            Entry::RepeatMark { id } => format!("wm_repeat_mark_{}", id.name()),
            Entry::RepeatKeep { id } => format!("wm_repeat_keep_{}", id.name()),
        }
    }

    /// The entry point's definition.
    fn definition(&self) -> String {
        let (params, body) = match *self {
            Entry::Convert { dir, id, from, to } => {
                ("WmRowParams", format!("wm_{}_convert<{}, {}, {}>(p);", dir.name(), c_id(id), c_type(from), c_type(to)))
            }
            Entry::Copy { dir, id, width } => ("WmRowParams", format!("wm_{}_copy<{}, {}>(p);", dir.name(), c_id(id), c_unit(width))),
            Entry::BucketCount { id } => ("WmBucketParams", format!("wm_bucket_count<{}>(p);", c_id(id))),
            Entry::BucketPlace { id } => ("WmBucketParams", format!("wm_bucket_place<{}>(p);", c_id(id))),
            Entry::Scan => ("WmScanParams", "wm_exclusive_scan_body(p);".to_owned()),
            Entry::CheckIds { id } => ("WmCheckParams", format!("wm_check_ids<{}>(p);", c_id(id))),
            Entry::RepeatMark { id } => ("WmRepeatParams", format!("wm_repeat_mark<{}>(p);", c_id(id))),
            Entry::RepeatKeep { id } => ("WmRepeatParams", format!("wm_repeat_keep<{}>(p);", c_id(id))),
        };
        format!("extern \"C\" __global__ void __launch_bounds__(WM_BLOCK) {}(const {params} p) {{ {body} }}\n", self.name())
    }
}

/// The element types that convert into each other: floats among floats,
/// integers among integers (the rule of [`DType::check_conversion`]).
pub(crate) fn allowed_pairs() -> impl Iterator<Item = (DType, DType)> {
    DType::ALL.into_iter().flat_map(|a| DType::ALL.into_iter().filter(move |&b| a.check_conversion(b).is_ok()).map(move |b| (a, b)))
}

/// Every kernel of the module, in a fixed order.
pub(crate) fn entries() -> Vec<Entry> {
    let mut v = Vec::new();
    for id in [IdType::I32, IdType::I64] {
        for dir in [Direction::Gather, Direction::Scatter] {
            v.extend(allowed_pairs().map(|(from, to)| Entry::Convert { dir, id, from, to }));
            v.extend(COPY_WIDTHS.map(|width| Entry::Copy { dir, id, width }));
        }
        v.push(Entry::BucketCount { id });
        v.push(Entry::BucketPlace { id });
        v.push(Entry::CheckIds { id });
        v.push(Entry::RepeatMark { id });
        v.push(Entry::RepeatKeep { id });
    }
    v.push(Entry::Scan);
    v
}

/// The whole translation unit handed to NVRTC.
pub(crate) fn source() -> String {
    let mut s = String::with_capacity(CONVERT.len() + REPEATS.len() + TEMPLATES.len() + 32 * 1024);
    s.push_str(CONVERT);
    s.push_str(REPEATS);
    s.push_str(TEMPLATES);
    for e in entries() {
        s.push_str(&e.definition());
    }
    // A marker the tests look for, and that ends the text with a newline.
    let _ = writeln!(s, "// {} entry points", entries().len());
    s
}

pub(crate) fn c_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "wm_f16",
        DType::Bf16 => "wm_bf16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I8 => "wm_i8",
        DType::I16 => "wm_i16",
        DType::I32 => "wm_i32",
        DType::I64 => "wm_i64",
    }
}

fn c_id(id: IdType) -> &'static str {
    match id {
        IdType::I32 => "wm_i32",
        IdType::I64 => "wm_i64",
    }
}

fn c_unit(width: u32) -> &'static str {
    match width {
        16 => "wm_v16",
        8 => "wm_v8",
        4 => "wm_u32",
        2 => "wm_u16",
        1 => "wm_u8",
        _ => unreachable!("copy widths are COPY_WIDTHS"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_pair_and_id_type_has_one_entry_point() {
        let all = entries();
        let names: HashSet<String> = all.iter().map(Entry::name).collect();
        assert_eq!(names.len(), all.len(), "duplicate kernel names");
        // 16 float pairs + 16 integer pairs, both directions, both id types;
        // 5 copy widths, both directions, both id types; per id type 2
        // bucket kernels, the id check and the 2 repeat kernels; one scan.
        assert_eq!(all.len(), 2 * 2 * 32 + 2 * 2 * 5 + 2 * 5 + 1);
        let src = source();
        for id in ["i32", "i64"] {
            for dir in ["gather", "scatter"] {
                for a in DType::ALL {
                    for b in DType::ALL {
                        let name = format!("wm_{dir}_{id}_{a}_{b}");
                        let want = a.is_float() == b.is_float();
                        assert_eq!(names.contains(&name), want, "{name}");
                        assert_eq!(src.contains(&format!(" {name}(")), want, "{name} in the source");
                    }
                }
                for w in COPY_WIDTHS {
                    assert!(src.contains(&format!(" wm_{dir}_copy{w}_{id}(")));
                }
            }
            assert!(src.contains(&format!(" wm_bucket_count_{id}(")) && src.contains(&format!(" wm_bucket_place_{id}(")));
            for k in ["check_ids", "repeat_mark", "repeat_keep"] {
                assert!(src.contains(&format!(" wm_{k}_{id}(")), "wm_{k}_{id}");
            }
        }
        assert!(src.contains(" wm_exclusive_scan("));
        assert!(src.ends_with(&format!("// {} entry points\n", all.len())));
    }

    #[test]
    fn the_source_includes_no_headers() {
        let src = source();
        assert!(!src.lines().any(|l| l.trim_start().starts_with("#include")), "NVRTC compiles without system headers");
        assert!(src.contains("wm_bf16, float>(p);"), "templates are instantiated with the storage types");
        assert!(src.contains(&format!("#define WM_BLOCK {}\n", super::super::BLOCK_THREADS)), "one block size on both sides");
    }
}
