"""The Newton system's kept pattern and the linear solvers as objects: growth, shrinking, hints, and solver options."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
import warp as wp

from newtonipc_nb.terms import HessianBlocks
from newtonipc_nb.linear import (LINEAR_SOLVERS, MKL_CBWR_AUTO, SHRINK_AT, NewtonSystem, NotPositiveDefinite,
                                 PardisoSolver, PatternIncomplete, make_linear_solver)
from newtonipc_nb.solver import SolverIPC
from newtonipc_nb.scenes.reference import hinge_scene


def blocks(pairs, scale=1.0):
    p = np.asarray(pairs, np.int32)
    vals = np.array([(4.0 if i == j else 0.5) * scale * np.eye(3) for i, j in pairs])
    return HessianBlocks(wp.array(p[:, 0], dtype=wp.int32), wp.array(p[:, 1], dtype=wp.int32),
                         wp.array(vals, dtype=wp.mat33d))


def dense(ns):
    off, cols, vals = ns.H.offsets.numpy(), ns.H.columns.numpy()[:ns.nnz], ns.H.values.numpy()[:ns.nnz]
    A = np.zeros((ns.n, 3, ns.n, 3))
    for r in range(ns.n):
        for s in range(off[r], off[r + 1]): A[r, :, cols[s], :] = vals[s]
    return A.reshape(3 * ns.n, 3 * ns.n)


def test_pattern_grows_on_a_miss_and_shrinks_when_stale():
    n = 6
    ns = NewtonSystem(n, wp.zeros(n, dtype=wp.int32))
    chain = [(i, i) for i in range(n)] + [(i, i + 1) for i in range(n - 1)] + [(i + 1, i) for i in range(n - 1)]
    # the diagonal start grows to the chain
    assert ns.assemble(blocks(chain), len(chain)) and ns.nnz == len(chain)
    v = ns.version
    assert not ns.assemble(blocks(chain), len(chain)) and ns.version == v            # same blocks: kept, no re-analysis
    # a subset fits: kept, stale blocks zero
    assert not ns.assemble(blocks(chain[:n]), n)
    np.testing.assert_allclose(dense(ns), dense_of(chain[:n], n))
    few = chain[:n] + [(0, 2)]
    # grown to the union (17 ≤ SHRINK_AT × 16)
    assert len(chain) + 1 <= SHRINK_AT * len(chain)
    assert ns.assemble(blocks(few), len(few)) and ns.nnz == len(chain) + 1
    far = [(i, i) for i in range(n)] + [(i, j) for i in range(n) for j in range(n) if abs(i - j) >= 2]
    # the union (36) is > SHRINK_AT × 16: shrunk to these
    assert ns.assemble(blocks(far), len(far)) and ns.nnz == len(far)
    np.testing.assert_allclose(dense(ns), dense_of(far, n))


def dense_of(pairs, n):
    A = np.zeros((n, 3, n, 3))
    for i, j in pairs: A[i, :, j, :] += (4.0 if i == j else 0.5) * np.eye(3)
    return A.reshape(3 * n, 3 * n)


def test_pardiso_refuses_a_block_outside_the_pattern_until_it_grows():
    """A matrix with a block scattered outside its pattern is not factorised (`PatternIncomplete`); `settle` grows the
    pattern by exactly the missed blocks, and the same triplets scattered again are factorised and solved."""
    n = 6
    ns = NewtonSystem(n, wp.zeros(n, dtype=wp.int32))
    chain = [(i, i) for i in range(n)] + [(i, i + 1) for i in range(n - 1)] + [(i + 1, i) for i in range(n - 1)]
    ns.assemble(blocks(chain), len(chain))
    keys = ns._keys.copy()
    more = chain + [(0, 4), (4, 0)]
    b = blocks(more)
    ns.scatter(b, len(more))
    ns.finish(check=False)
    solver = PardisoSolver(threads=1)
    with pytest.raises(PatternIncomplete):
        solver.prepare(ns)
    assert solver.stats["factorisations"] == 0
    assert not ns.settle(ns.flags.numpy())
    np.testing.assert_array_equal(ns._keys, np.union1d(keys, [0 * n + 4, 4 * n + 0]))
    ns.scatter(b, len(more))
    ns.finish()
    solver.prepare(ns)
    z = wp.zeros(n, dtype=wp.vec3d)
    solver.solve(ns, z)
    A, rhs = dense(ns), ns.rhs.numpy().reshape(-1)
    np.testing.assert_allclose(A @ z.numpy().reshape(-1), rhs, atol=1e-12)


def test_stale_hints_never_misplace_a_block():
    """Triplets whose order changes between assemblies (as contacts come and go) still land in their own blocks."""
    n = 5
    pairs = [(i, i) for i in range(n)] + [(0, 3), (3, 0), (1, 2), (2, 1)]
    ns = NewtonSystem(n, wp.zeros(n, dtype=wp.int32))
    ns.assemble(blocks(pairs), len(pairs))
    rng = np.random.default_rng(0)
    for _ in range(5):
        order = [pairs[k] for k in rng.permutation(len(pairs))]
        ns.assemble(blocks(order), len(order))
        np.testing.assert_allclose(dense(ns), dense_of(pairs, n))


def test_linear_solver_options():
    model, s0 = hinge_scene("vt")
    solver = SolverIPC(model, linear_solver=PardisoSolver(threads=1))
    assert solver.linear.name == "pardiso" and solver.options["linear_solver"] == "pardiso"
    solver.step(s0, model.state(), None, None, 1 / 240)
    # one factorisation per iteration: a matrix whose pattern must grow is not factorised (PARDISO sees the missed
    # block count beside the values it copies), the pattern grows and the same blocks are scattered again
    st = solver.last_stats
    assert solver.linear.stats["analyses"] >= 1 and st.patterns >= 1
    assert solver.linear.stats["factorisations"] == st.newton_iterations
    with pytest.raises(ValueError, match="threads"): PardisoSolver(threads=0)
    with pytest.raises(TypeError, match="linear_solver"): make_linear_solver(3.5)
    assert make_linear_solver("cholesky").name == "cholespy" and make_linear_solver("auto",
                                                                                    device="cpu").name == "pardiso"
    assert set(LINEAR_SOLVERS) == {"pardiso", "cholespy", "dense", "pcg"}


@pytest.mark.parametrize("name", ["pardiso", "cholespy", "dense"])
def test_indefinite_systems_are_refused(name):
    """The factorising solvers refuse a matrix that is not positive definite (PCG may still converge on one: the
    Newton loop's descent check, ∇Φ·Δx < 0, is what guards it)."""
    ns = NewtonSystem(2, wp.zeros(2, dtype=wp.int32))
    p = [(0, 0), (1, 1), (0, 1), (1, 0)]
    vals = np.array([np.eye(3), np.eye(3), 2 * np.eye(3), 2 * np.eye(3)])          # [[1, 2], [2, 1]] ⊗ I: eigenvalue −1
    hb = HessianBlocks(wp.array(np.array(p)[:, 0].astype(np.int32), dtype=wp.int32),
                       wp.array(np.array(p)[:, 1].astype(np.int32), dtype=wp.int32), wp.array(vals, dtype=wp.mat33d))
    ns.assemble(hb, 4)
    ns.grad.assign(np.ones((2, 3)))
    ns.finish()
    solver = make_linear_solver(name)
    with pytest.raises(NotPositiveDefinite):
        solver.prepare(ns)
        solver.solve(ns, wp.zeros(2, dtype=wp.vec3d))


def test_pardiso_solves_from_its_factor_alone():
    """PARDISO runs with MKL's defaults for an SPD matrix but no iterative refinement (`pardiso_handle`): a solve
    performs no refinement step (MKL's default performs two on every solve) and still meets the factor's accuracy."""
    n = 40
    ns = NewtonSystem(n, wp.zeros(n, dtype=wp.int32))
    chain = [(i, i) for i in range(n)] + [(i, i + 1) for i in range(n - 1)] + [(i + 1, i) for i in range(n - 1)]
    b = blocks(chain, scale=1e6)
    ns.assemble(b, len(chain))
    ns.grad.assign(np.random.default_rng(0).normal(size=(n, 3)))
    ns.finish()
    solver = PardisoSolver()
    solver.prepare(ns)
    z = wp.zeros(n, dtype=wp.vec3d)
    solver.solve(ns, z)
    assert solver._ps.iparm[7] == 0 and solver._ps.iparm[6] == 0        # refinement steps: allowed, performed
    # MKL's reductions in a fixed order (conditional numerical reproducibility, AUTO) unless the environment chooses
    assert "MKL_CBWR" in os.environ or solver._ps.libmkl.MKL_CBWR_Get(ctypes.c_int(-1)) == MKL_CBWR_AUTO
    A, rhs = dense(ns), ns.rhs.numpy().reshape(-1)
    assert np.linalg.norm(A @ z.numpy().reshape(-1) - rhs) <= 1e-13 * np.linalg.norm(rhs)


def _mkl_names(env):
    "In a fresh interpreter with `env`: the MKL runtime `import_pypardiso` names, and the one a PARDISO handle loads."
    code = ("import os; from newtonipc_nb.linear import import_pypardiso, pardiso_handle; p = import_pypardiso(); "
            "print(os.environ['PYPARDISO_MKL_RT']); print(pardiso_handle(p).libmkl._name)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[-2:]


def test_pypardiso_is_told_where_mkl_is():
    """`import_pypardiso` names the MKL runtime that the mkl wheel put beside this Python, so pypardiso does not walk
    the whole installation for it (at import and again for each handle): the file named is the one PARDISO loads. A
    name the user set is kept."""
    env = {k: v for k, v in os.environ.items() if k != "PYPARDISO_MKL_RT"}
    named, loaded = _mkl_names(env)
    assert os.path.samefile(named, loaded) and os.path.commonpath([named, sys.prefix]) == sys.prefix
    users = os.path.join(os.path.dirname(named), ".", os.path.basename(named))      # the same file, spelled apart
    assert _mkl_names({**env, "PYPARDISO_MKL_RT": users}) == [users, users]
