//! The support matrix for machines we do not have, from JSON fixtures. Each
//! expected table is what someone who knows the hardware would say.

use std::path::PathBuf;

use wm_topology::TopologyRecord;
use wm_topology::domains::{RankPlace, bind_gpu, matrix};

fn load(name: &str) -> TopologyRecord {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name);
    TopologyRecord::load(&p).unwrap()
}

/// `ranks_per_node` ranks on each record, bound to GPUs by local rank.
fn places<'a>(nodes: &'a [TopologyRecord], ranks_per_node: usize) -> Vec<RankPlace<'a>> {
    let mut out = Vec::new();
    for rec in nodes {
        for l in 0..ranks_per_node {
            out.push(RankPlace { rank: out.len(), node: &rec.node_id, record: Some(rec), gpu: bind_gpu(l, rec, None) });
        }
    }
    out
}

/// `expected[type][location]`: `""` for supported, else a part of the reason.
fn check(ranks: &[RankPlace<'_>], expected: [[&str; 2]; 4]) {
    let got = matrix(ranks, Ok(()));
    for (t, row) in expected.iter().enumerate() {
        for (l, want) in row.iter().enumerate() {
            let what = format!("{} {}", wm_topology::domains::TYPES[t], wm_topology::domains::LOCATIONS[l]);
            match (&got[t][l], *want) {
                (Ok(()), "") => {}
                (Err(reason), w) if !w.is_empty() => assert!(reason.contains(w), "{what}: {reason:?} does not say {w:?}"),
                (g, w) => panic!(
                    "{what}: got {g:?}, expected {}",
                    if w.is_empty() { "supported".to_owned() } else { format!("a reason with {w:?}") }
                ),
            }
        }
    }
}

#[test]
fn nvswitch_node_with_8_gpus_supports_everything() {
    let node = [load("nvswitch-8gpu.json")];
    check(&places(&node, 8), [["", ""], ["", ""], ["", ""], ["", ""]]);
    // Every GPU is listed with its nearest NIC, and every pair with NVLink.
    assert!(node[0].gpus.iter().all(|g| g.nearest_nic.is_some()));
    assert!(node[0].p2p.iter().enumerate().all(|(i, row)| row.iter().enumerate().all(|(j, l)| i == j || (l.nvlink && l.mappable()))));
}

#[test]
fn two_socket_pcie_node_maps_device_memory_only_within_a_socket() {
    let node = [load("pcie-2socket-4gpu.json")];
    let no_p2p = "rank 0 (GPU 0) cannot reach rank 2 (GPU 2): no P2P, path crosses the CPU interconnect";
    check(&places(&node, 4), [["", no_p2p], ["", no_p2p], ["", ""], ["", ""]]);
    // Two ranks on the GPUs of one socket: P2P through the PCIe switches.
    check(&places(&node, 2), [["", ""], ["", ""], ["", ""], ["", ""]]);
}

#[test]
fn cpu_only_node_has_host_memory_and_says_why_not_device() {
    let node = [load("cpu-only.json")];
    let no_gpu = "rank 0 has no GPU: no NVIDIA driver found";
    check(&places(&node, 2), [["", no_gpu], ["", no_gpu], ["", no_gpu], ["", no_gpu]]);
}

#[test]
fn two_nodes_of_4_gpus_map_nothing_across_nodes() {
    let nodes = [load("two-nodes-4gpu-a.json"), load("two-nodes-4gpu-b.json")];
    let apart = "ranks 0 and 4 are on different nodes (node-a and node-b)";
    check(&places(&nodes, 4), [[apart, apart], [apart, apart], ["", ""], ["", ""]]);
    // Unequal nodes cannot form hierarchy communicators.
    let mut uneven = places(&nodes, 4);
    uneven.pop();
    check(
        &uneven,
        [[apart, apart], [apart, apart], ["", ""], ["node node-a has 4 ranks and node node-b has 3", "node node-a has 4 ranks"]],
    );
}

#[test]
fn nodes_posed_on_one_host_are_named_by_their_ids() {
    // One machine posing as two nodes (WM_NODE_ID): the host names are the
    // same, so only the ids tell the nodes apart.
    let mut a = load("two-nodes-4gpu-a.json");
    let mut b = a.clone();
    a.node_id = "node0".into();
    b.node_id = "node1".into();
    let nodes = [a, b];
    let apart = "ranks 0 and 4 are on different nodes (node0 and node1)";
    check(&places(&nodes, 4), [[apart, apart], [apart, apart], ["", ""], ["", ""]]);
    let mut uneven = places(&nodes, 4);
    uneven.pop();
    let m = matrix(&uneven, Ok(()));
    assert!(m[3][0].as_ref().unwrap_err().starts_with("node node0 has 4 ranks and node node1 has 3"), "{:?}", m[3][0]);
    // Without records, the ids too.
    let bare: Vec<RankPlace<'_>> =
        ["node0", "node0", "node1"].iter().enumerate().map(|(rank, &node)| RankPlace { rank, node, record: None, gpu: None }).collect();
    assert_eq!(matrix(&bare, Ok(()))[0][0], Err("ranks 0 and 2 are on different nodes (node0 and node1)".into()));
}

#[test]
fn without_cuda_every_device_answer_says_so() {
    let node = [load("nvswitch-8gpu.json")];
    let got = matrix(&places(&node, 8), Err("this build of wholemem has no CUDA support".into()));
    for row in &got {
        assert_eq!(row[0], Ok(()));
        assert_eq!(row[1], Err("this build of wholemem has no CUDA support".into()));
    }
}

#[test]
fn several_ranks_may_share_one_gpu() {
    let node = [load("pcie-2socket-4gpu.json")];
    // Eight ranks on four GPUs: ranks 0 and 4 share GPU 0, but 0 and 2 still lack P2P.
    let ps = places(&node, 8);
    assert_eq!(ps[4].gpu, Some(0));
    let m = matrix(&ps, Ok(()));
    assert!(m[0][1].as_ref().unwrap_err().contains("cannot reach rank 2 (GPU 2)"));
}
