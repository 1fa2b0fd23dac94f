//! `append_unique`: the node list of a sampled block.

use std::collections::HashMap;

use wholemem::CommonError;

use crate::{Error, Result};

/// The unique nodes of a block and where each neighbour is among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unique {
    /// The targets, in their order, then every neighbour that is not a
    /// target, in order of first appearance.
    pub nodes: Vec<i64>,
    /// For each neighbour, its index in `nodes`.
    pub neighbor_index: Vec<usize>,
}

/// Appends to `targets` the neighbours not among them (each once, in order
/// of first appearance) and maps every neighbour to its index in the
/// result. The targets keep their positions, so a model's outputs for the
/// targets are the first rows of its inputs.
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] naming a target listed twice (the targets of
/// a block are distinct nodes).
pub fn append_unique(targets: &[i64], neighbors: &[i64]) -> Result<Unique> {
    let mut index: HashMap<i64, usize> = HashMap::with_capacity(targets.len() + neighbors.len() / 2);
    let mut nodes = Vec::with_capacity(targets.len() + neighbors.len() / 2);
    for (i, &t) in targets.iter().enumerate() {
        if let Some(first) = index.insert(t, i) {
            return Err(Error::Common(CommonError::InvalidArgument(format!("target {t} is listed twice, at positions {first} and {i}"))));
        }
        nodes.push(t);
    }
    let neighbor_index = neighbors
        .iter()
        .map(|&v| {
            *index.entry(v).or_insert_with(|| {
                nodes.push(v);
                nodes.len() - 1
            })
        })
        .collect();
    Ok(Unique { nodes, neighbor_index })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_first_then_new_neighbours_in_order() {
        let u = append_unique(&[7, 3, 9], &[3, 5, 7, 5, 1, 9]).unwrap();
        assert_eq!(u.nodes, vec![7, 3, 9, 5, 1]);
        assert_eq!(u.neighbor_index, vec![1, 3, 0, 3, 4, 2]);
        assert!(append_unique(&[1, 2, 1], &[]).unwrap_err().to_string().contains("target 1 is listed twice, at positions 0 and 2"));
        let e = append_unique(&[], &[4, 4]).unwrap();
        assert_eq!((e.nodes, e.neighbor_index), (vec![4], vec![0, 0]));
    }
}
