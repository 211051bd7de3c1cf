"""SolverIPC in a Newton scene: collision shapes as obstacles, prescribed motion, graph capture, user terms."""
import numpy as np
import pytest
import warp as wp

import newton
from newtonipc_nb.inputs import BAG_FILM, ModelError, add_mesh, grid_faces, set_hinge_stiffness
from newtonipc_nb.intersections import count_intersections
from newtonipc_nb.solver import SolverError, SolverIPC

DT = 1 / 240


def sheet_builder(n=5, size=0.04, height=0.01):
    "A bag-film sheet of n × n vertices, `size` wide, `height` above the origin, in a fresh builder."
    u = np.linspace(-size / 2, size / 2, n)
    U, W = np.meshgrid(u, u, indexing="ij")
    b = newton.ModelBuilder(gravity=(0.0, 0.0, -9.81))
    first = len(b.edge_indices)
    add_mesh(b, np.stack([U.ravel(), W.ravel(), np.full(n * n, height)], 1), grid_faces(n),
             density=BAG_FILM.areal_density, mu=BAG_FILM.mu, lam=BAG_FILM.lam)
    set_hinge_stiffness(b, first, BAG_FILM.D)
    return b


def test_step_under_graph_capture_is_refused_untouched():
    b = sheet_builder()
    b.add_ground_plane()
    model = b.finalize(device="cpu")
    solver = SolverIPC(model)
    s0, s1 = model.state(), model.state()
    s1.particle_q.assign(np.full((model.particle_count, 3), 7.0, np.float32))
    with pytest.raises(SolverError, match="cannot run inside a graph capture"):
        with wp.ScopedCapture(device="cpu"):
            solver.step(s0, s1, None, None, DT)
    assert (s1.particle_q.numpy() == 7.0).all() and solver.last_stats is None
    solver.step(s0, s1, None, None, DT)           # uncaptured, the same call runs
    assert solver.last_stats.substeps == 1


def test_unsupported_shape_is_refused_by_type_and_index():
    b = sheet_builder()
    b.add_ground_plane()
    b.add_shape_cone(-1, radius=0.01, half_height=0.01)
    model = b.finalize(device="cpu")
    with pytest.raises(ModelError, match="shape 1 is a CONE"):
        SolverIPC(model)
    flags = model.shape_flags.numpy(); flags[1] &= ~int(newton.ShapeFlags.COLLIDE_PARTICLES)
    model.shape_flags.assign(flags)
    assert SolverIPC(model).obstacles.shapes == [0]     # with particle collision off it is not an obstacle
