"""Graphs built collectively from edge lists, and neighbour sampling into
numpy arrays (wm_graph), checked against adjacency lists made in numpy.
Runs at 1..4 ranks (mpi4py communicator)."""

import numpy as np
import pytest

import wholemem

TYPES = ["continuous", "chunked", "distributed", "hierarchy"]


@pytest.fixture(scope="module")
def comm():
    from conftest import WORLD

    if WORLD is None:
        pytest.skip("needs mpi4py (pip install mpi4py)")
    return wholemem.Comm.from_mpi4py(WORLD)


def edges_of(rank, nodes):
    """Rank `rank`'s share of the edges (ranks 0..3): node n, for n mod 4
    = rank, links to (3n + 5k + 1) mod nodes for k <= n mod 4, with
    weights depending on both ends."""
    src, dst = [], []
    for n in range(nodes):
        if n % 4 != rank % 4:
            continue
        for k in range(n % 4 + 1):
            src.append(n)
            dst.append((n * 3 + k * 5 + 1) % nodes)
    src, dst = np.array(src, np.int64), np.array(dst, np.int64)
    return src, dst, (1.0 + (src % 3) + (dst % 2)).astype(np.float32)


def adjacency(size, nodes):
    adj = {n: [] for n in range(nodes)}
    # Ranks past 3 pass no edges.
    for r in range(min(size, 4)):
        s, d, _ = edges_of(r, nodes)
        for a, b in zip(s, d):
            adj[a].append(b)
    return {n: sorted(v) for n, v in adj.items()}


@pytest.mark.parametrize("ty", TYPES)
def test_every_neighbour_and_a_fanout(comm, ty):
    nodes = 23
    src, dst, w = edges_of(comm.rank, nodes)
    if comm.rank >= 4:  # more than 4 ranks: the extra ones pass no edges
        src, dst, w = src[:0], dst[:0], w[:0]
    g = wholemem.Graph(comm, nodes, src, dst, weights=w, type=ty, dedup=True)
    adj = adjacency(comm.size, nodes)
    assert g.nodes == nodes and g.weighted
    assert g.edges == sum(len(set(v)) for v in adj.values())
    centers = np.array([(comm.rank * 5 + i) % nodes for i in range(7)] + [3, 3], np.int64)
    offsets, neighbors = g.sample(centers, None)
    assert offsets.dtype == np.int64 and neighbors.dtype == np.int64 and len(offsets) == len(centers) + 1
    for i, c in enumerate(centers):
        assert list(neighbors[offsets[i]:offsets[i + 1]]) == sorted(set(adj[c]))
    offsets, neighbors, eids = g.sample(centers, 2, seed=11, weighted=True, edge_ids=True)
    again = g.sample(centers, 2, seed=11, weighted=True)
    assert np.array_equal(again[1], neighbors)
    for i, c in enumerate(centers):
        got = list(neighbors[offsets[i]:offsets[i + 1]])
        assert len(got) == min(2, len(set(adj[c]))) and len(set(got)) == len(got) and set(got) <= set(adj[c])
    assert len(eids) == len(neighbors) and (eids >= 0).all() and (eids < g.edges).all()
    # A center listed twice gets the same sample twice.
    a, b = len(centers) - 2, len(centers) - 1
    assert list(neighbors[offsets[a]:offsets[a + 1]]) == list(neighbors[offsets[b]:offsets[b + 1]])
    with pytest.raises(IndexError):
        g.sample([nodes], 2)
    assert len(g.sample(np.zeros(0, np.int64), 2)[1]) == 0  # still usable; no centers is fine
    g.free()
    g.free()
    with pytest.raises(ValueError, match="freed"):
        g.sample([0], 1)


def test_unweighted_graph_refuses_a_weighted_sample(comm):
    src = np.array([comm.rank], np.int64)
    g = wholemem.Graph(comm, comm.size, src, (src + 1) % comm.size, undirected=True, dedup=True, id_type="int32")
    assert not g.weighted
    # Every rank fails (ValueError where the request was checked first; the
    # others name that rank), and the graph stays usable.
    with pytest.raises(wholemem.WholememError, match="weight"):
        g.sample([0], 1, weighted=True)
    offsets, neighbors = g.sample(np.array([0], np.int32), None)
    expect = sorted({1 % comm.size, (comm.size - 1) % comm.size})
    assert list(neighbors) == expect and list(offsets) == [0, len(expect)]
    g.free()
