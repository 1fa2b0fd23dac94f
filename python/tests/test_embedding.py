"""Embedding tables and their sparse optimizers (wm_embedding): updates
checked against numpy's arithmetic on every rank's gradients. Runs at 1..4
ranks (mpi4py communicator)."""

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


def batch_of(rank, rows, dim):
    """Rank `rank`'s ids (with a repeat; rank 1 sends none) and gradients,
    depending on rank, position and column."""
    if rank == 1:
        return np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
    ids = np.array([rank % rows, (3 * rank + 1) % rows, 0, rank % rows], np.int64)
    i = np.arange(len(ids))[:, None]
    c = np.arange(dim)[None, :]
    grads = ((rank + 1) * 0.5 + i * 0.25 - c * 0.125).astype(np.float32)
    return ids, grads


def summed(size, rows, dim):
    g = np.zeros((rows, dim), np.float64)
    touched = np.zeros(rows, bool)
    for r in range(size):
        ids, grads = batch_of(r, rows, dim)
        np.add.at(g, ids, grads.astype(np.float64))
        touched[ids] = True
    return g, touched


@pytest.mark.parametrize("ty", TYPES)
def test_sgd_step_sums_every_ranks_gradients(comm, ty):
    rows, dim, lr = 6 * comm.size + 3, 5, 0.1
    e = wholemem.Embedding(comm, rows, dim, type=ty, optimizer="sgd")
    assert e.shape == (rows, dim) and e.optimizer == "sgd" and e.state_names == []
    e.init("normal", seed=7, mean=0.0, std=0.5)
    w0 = e.gather(np.arange(rows))
    assert np.std(w0) > 0.1  # really initialised
    ids, grads = batch_of(comm.rank, rows, dim)
    e.apply_gradients(ids, grads, lr)
    g, _ = summed(comm.size, rows, dim)
    np.testing.assert_allclose(e.gather(np.arange(rows)), (w0 - lr * g).astype(np.float32), rtol=1e-6, atol=1e-6)
    e.free()
    e.free()  # idempotent
    with pytest.raises(ValueError, match="freed"):
        e.gather([0])


def test_adam_first_step_and_its_state(comm):
    rows, dim, lr, b1, b2, eps = 4 * comm.size + 2, 3, 0.01, 0.8, 0.9, 1e-6
    e = wholemem.Embedding(comm, rows, dim, optimizer="adam", beta1=b1, beta2=b2, epsilon=eps)
    assert set(e.state_names) >= {"m", "v"}
    e.init("constant", value=1.0)
    ids, grads = batch_of(comm.rank, rows, dim)
    e.apply_gradients(ids, grads, lr)
    g, touched = summed(comm.size, rows, dim)
    # After one step m = (1-β1)g, v = (1-β2)g², and bias correction leaves g/|g|.
    step = np.where(touched[:, None], lr * g / (np.abs(g) + eps), 0.0)
    np.testing.assert_allclose(e.gather(np.arange(rows)), (1.0 - step).astype(np.float32), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e.gather_state("m", np.arange(rows)), (1 - b1) * g, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e.gather_state("v", np.arange(rows)), (1 - b2) * g * g, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="state"):
        e.gather_state("nope", [0])
    e.reset_state()
    assert not e.gather_state("m", np.arange(rows)).any()
    e.free()


def test_float16_rows_gather_as_float32(comm):
    rows, dim = 3 * comm.size + 1, 4
    e = wholemem.Embedding(comm, rows, dim, dtype="float16", optimizer="adagrad")
    e.init("uniform", seed=3, low=-1.0, high=1.0)
    w = e.gather(np.arange(rows))
    assert w.dtype == np.float32 and np.abs(w).max() <= 1.0 and len(np.unique(w)) > rows
    assert np.array_equal(w, w.astype(np.float16).astype(np.float32))  # float16 values
    e.free()


def test_bad_arguments_on_one_rank_leave_every_rank_usable(comm):
    rows, dim = 2 * comm.size + 1, 2
    e = wholemem.Embedding(comm, rows, dim, optimizer="sgd")
    e.init("constant", value=2.0)
    if comm.rank == comm.size - 1:
        with pytest.raises(ValueError, match="grads"):
            e.apply_gradients([0], np.zeros((1, dim), np.float64), 0.1)
        with pytest.raises(ValueError, match="shape"):
            e.gather([0], out=np.zeros((2, dim), np.float32))
    else:
        e.apply_gradients(np.zeros(0, np.int64), np.zeros((0, dim), np.float32), 0.1)
        assert np.array_equal(e.gather([0]), np.full((1, dim), 2.0, np.float32))
    with pytest.raises(IndexError):
        e.apply_gradients([rows], np.zeros((1, dim), np.float32), 0.1)
    with pytest.raises(ValueError, match="alpha"):
        wholemem.Embedding(comm, rows, dim, optimizer="adam", alpha=0.5)
    with pytest.raises(ValueError, match="float32 or float16"):
        wholemem.Embedding(comm, rows, dim, dtype="int32")
    assert np.array_equal(e.gather(np.arange(rows)), np.full((rows, dim), 2.0, np.float32))
    e.free()
