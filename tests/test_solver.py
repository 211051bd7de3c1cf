"""SolverIPC end to end: rejected inputs, linear solvers that agree, energy descent, and a cloth drop without intersections."""
import math

import numpy as np
import pytest
import warp as wp

import newton
from newtonipc_nb.ccd import count_intersections

from newtonipc_nb.solver import SolverError, SolverIPC, hinge_scene, sheet_on_sphere


def copy_state(model, state):
    s = model.state()
    s.particle_q.assign(state.particle_q); s.particle_qd.assign(state.particle_qd)
    return s


def test_initial_overlap_is_rejected_and_output_untouched():
    model, s0 = hinge_scene("vt")
    q = s0.particle_q.numpy(); q[0, 2] = -1e-4                     # vertex a below the fixed triangle's plane: through it
    q[1:4, 2] += 0.0; s0.particle_q.assign(q)
    s1 = model.state()
    before = s1.particle_q.numpy().copy(), s1.particle_qd.numpy().copy()
    solver = SolverIPC(model)
    with pytest.raises(SolverError, match="invalid start"):
        solver.step(s0, s1, None, None, 1 / 240)
    np.testing.assert_array_equal(s1.particle_q.numpy(), before[0]); np.testing.assert_array_equal(s1.particle_qd.numpy(), before[1])


def test_edge_through_face_is_rejected():
    model, s0 = hinge_scene("ee")
    q = s0.particle_q.numpy(); q[:4, 2] -= q[2, 2] + 2e-3            # the shared edge c–d 2 mm below the ridge: the film cuts through it
    s0.particle_q.assign(q)
    s1 = model.state(); before = s1.particle_q.numpy().copy()
    with pytest.raises(SolverError, match="invalid start"):
        SolverIPC(model).step(s0, s1, None, None, 1 / 240)
    np.testing.assert_array_equal(s1.particle_q.numpy(), before)


def test_nan_input_is_rejected():
    model, s0 = hinge_scene("vt")
    q = s0.particle_q.numpy(); q[2, 1] = np.nan; s0.particle_q.assign(q)
    s1 = model.state(); before = s1.particle_q.numpy().copy()
    with pytest.raises(SolverError, match="particle_q of particle 2 is not finite"):
        SolverIPC(model).step(s0, s1, None, None, 1 / 240)
    np.testing.assert_array_equal(s1.particle_q.numpy(), before)


@pytest.mark.parametrize("kind", ["vt", "ee"])
def test_linear_solvers_give_the_same_step(kind):
    out = {}
    for method in ("pardiso", "cholespy", "dense", "pcg"):
        model, s0 = hinge_scene(kind)
        solver = SolverIPC(model, linear_solver=method, tolerance=1e-9)
        s1 = model.state()
        for _ in range(3):
            solver.step(s0, s1, None, None, 1 / 240); s0, s1 = s1, s0
        out[method] = s0.particle_q.numpy().astype(np.float64)
    for method in ("cholespy", "dense", "pcg"):
        np.testing.assert_allclose(out[method], out["pardiso"], rtol=0, atol=1e-9)


def test_energy_decreases_at_every_accepted_iteration():
    model, s0 = hinge_scene("vt")
    solver = SolverIPC(model); s1 = model.state()
    checked = 0
    for _ in range(12):
        solver.step(s0, s1, None, None, 1 / 240); s0, s1 = s1, s0
        st = solver.last_stats
        assert st.min_gap > 0
        e = np.asarray(st.energies)
        if st.subdivisions == 0 and len(e) > 1:
            assert np.all(np.diff(e) <= 1e-12 * np.abs(e).max()), e
            checked += 1
    assert checked >= 3


def run_cloth_drop(steps):
    model, faces = sheet_on_sphere(21, 0.1)
    solver = SolverIPC(model, drag=2.0)
    s0, s1 = model.state(), model.state()
    worst_gap, hits = math.inf, []
    for _ in range(steps):
        solver.step(s0, s1, None, None, 1 / 240); s0, s1 = s1, s0
        x = s0.particle_q.numpy().astype(np.float64)[: len(np.unique(faces))]
        hits.append(count_intersections(x, faces))
        worst_gap = min(worst_gap, solver.last_stats.min_gap)
    return x, hits, worst_gap


def test_cloth_drop_on_sphere_has_no_intersections():
    x, hits, gap = run_cloth_drop(48)
    assert sum(hits) == 0 and gap > 0
    assert x[:, 2].min() < 0.02            # the sheet has draped past the sphere's top


@pytest.mark.slow
def test_cloth_drop_settles_without_intersections():
    x, hits, gap = run_cloth_drop(240)
    assert sum(hits) == 0 and gap > 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["vt", "ee"])
def test_cuda_matches_cpu_on_small_scenes(kind):
    """SPEC.md §6: 6 steps of the small scenes (StVK) on CUDA and on the CPU agree within 2e-7 m."""
    if not wp.is_cuda_available():
        pytest.skip("no CUDA device")
    out = {}
    for device in ("cpu", "cuda:0"):
        model, s0 = hinge_scene(kind, device=device)
        solver = SolverIPC(model, membrane="stvk")
        s1 = model.state()
        for _ in range(6):
            solver.step(s0, s1, None, None, 1 / 240); s0, s1 = s1, s0
        out[device] = s0.particle_q.numpy().astype(np.float64)
    np.testing.assert_allclose(out["cuda:0"], out["cpu"], rtol=0, atol=2e-7)
