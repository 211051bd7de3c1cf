"""SolverIPC in a Newton scene: collision shapes as obstacles, prescribed motion, graph capture, user terms."""
import numpy as np
import pytest
import warp as wp

import newton
from newtonipc_nb.inputs import BAG_FILM, ModelError, add_mesh, grid_faces, set_hinge_stiffness
from newtonipc_nb.scenes.incline import equilibrium_gap
from newtonipc_nb.solver import SolverIPC
from newtonipc_nb.solver_interface import SolverError

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
    flags = model.shape_flags.numpy()
    flags[1] &= ~int(newton.ShapeFlags.COLLIDE_PARTICLES)
    model.shape_flags.assign(flags)
    assert SolverIPC(model).obstacles.shapes == [0]     # with particle collision off it is not an obstacle


def test_kinematic_particle_is_swept_to_where_the_caller_put_it():
    b = sheet_builder(height=0.02)
    model = b.finalize(device="cpu")
    m = model.particle_mass.numpy()
    m[0] = 0.0
    model.particle_mass.assign(m)  # a kinematic corner
    solver = SolverIPC(model)
    s0, s1 = model.state(), model.state()
    solver.step(s0, s1, None, None, DT)
    s0, s1 = s1, s0
    for k in range(3):
        q = s0.particle_q.numpy()
        q[0, 0] += 0.002
        s0.particle_q.assign(q)  # the caller moves it
        target = q[0].copy()
        solver.step(s0, s1, None, None, DT)
        s0, s1 = s1, s0
        assert np.array_equal(s0.particle_q.numpy()[0], target)
        np.testing.assert_allclose(s0.particle_qd.numpy()[0], [0.002 / DT, 0, 0], rtol=1e-4)
    assert s0.particle_q.numpy()[1:, 0].mean() > 0                                  # the sheet follows its corner


def squeezed_sheet():
    "A sheet on the ground with a kinematic box just above it."
    b = sheet_builder(height=0.0006)
    b.add_ground_plane()
    body = b.add_body(xform=wp.transform(wp.vec3(0.0, 0.0, 0.006), wp.quat_identity()))
    b.add_shape_box(body, hx=0.01, hy=0.01, hz=0.005)
    return b.finalize(device="cpu")


def test_unreachable_shape_move_names_the_shape_and_writes_nothing():
    model = squeezed_sheet()
    solver = SolverIPC(model)
    s0, s1 = model.state(), model.state()
    solver.step(s0, s1, None, None, DT)
    s0, s1 = s1, s0
    # through the sheet, into the ground
    q = s0.body_q.numpy()
    q[0, 2] -= 0.01
    s0.body_q.assign(q)
    s1.particle_q.assign(np.full((model.particle_count, 3), 7.0, np.float32))
    with pytest.raises(SolverError, match=r"prescribed move of shape 1 \(box, body 0\)"):
        solver.step(s0, s1, None, None, DT)
    assert (s1.particle_q.numpy() == 7.0).all()


def test_moving_box_carries_the_sheet_by_friction():
    load = BAG_FILM.areal_density * 0.01 ** 2 * 9.81           # the weight an interior vertex carries
    def run(friction):
        b = sheet_builder(height=0.01 + 3e-5 + equilibrium_gap(load))   # at rest on the box top
        body = b.add_body(xform=wp.transform(wp.vec3(0.0, 0.0, 0.0), wp.quat_identity()))
        b.add_shape_box(body, hx=0.05, hy=0.05, hz=0.01, cfg=newton.ModelBuilder.ShapeConfig(mu=1.0))
        model = b.finalize(device="cpu")
        solver = SolverIPC(model, friction=friction)
        s0, s1 = model.state(), model.state()
        for k in range(14):
            # settled: now the box slides along x
            if k >= 4:
                q = s0.body_q.numpy()
                q[0, 0] += 0.0001
                s0.body_q.assign(q)
            solver.step(s0, s1, None, None, DT)
            s0, s1 = s1, s0
        return s0.particle_q.numpy()[:, 0].mean(), s0.body_q.numpy()[0, 0]
    x_stick, box = run(0.8)
    x_free, _ = run(0.0)
    assert abs(x_stick - box) < 0.1 * box, (x_stick, box)         # μ = √(0.8 · 1.0): the sheet rides along
    assert abs(x_free) < 0.05 * box, x_free                       # no friction: the box slides under it


def test_sphere_particle_rests_on_a_capsule():
    b = newton.ModelBuilder(gravity=(0.0, 0.0, -9.81))
    b.add_particle(wp.vec3(0.0, 0.0, 0.0175), wp.vec3(0.0, 0.0, 0.0), mass=0.001, radius=0.005)
    b.add_shape_capsule(
        -1, xform=wp.transform(wp.vec3(0.0, 0.0, 0.0), wp.quat_from_axis_angle(wp.vec3(0.0, 1.0, 0.0), np.pi / 2)),
        radius=0.01, half_height=0.05)
    model = b.finalize(device="cpu")
    solver = SolverIPC(model)
    s0, s1 = model.state(), model.state()
    for _ in range(30):
        solver.step(s0, s1, None, None, DT)
        s0, s1 = s1, s0
    z = float(s0.particle_q.numpy()[0, 2])
    assert 0.015 + 1.5e-5 < z < 0.015 + 1.5e-5 + 1e-3, z          # above R_s + R_c + min_gap/2, within d̂ of it


def test_particle_behind_a_plane_is_refused():
    b = sheet_builder(height=-0.001)
    b.add_ground_plane()
    model = b.finalize(device="cpu")
    solver = SolverIPC(model)
    s0, s1 = model.state(), model.state()
    with pytest.raises(SolverError, match=r"particle \d+ is .* behind shape 0 \(plane"):
        solver.step(s0, s1, None, None, DT)


def test_turning_infinite_plane_is_refused():
    b = sheet_builder(height=0.01)
    body = b.add_body(xform=wp.transform(wp.vec3(0.0, 0.0, 0.0), wp.quat_identity()))
    b.add_shape_plane(body=body, width=0.0, length=0.0)
    model = b.finalize(device="cpu")
    solver = SolverIPC(model)
    s0, s1 = model.state(), model.state()
    solver.step(s0, s1, None, None, DT)
    s0, s1 = s1, s0
    q = s0.body_q.numpy()
    q[0, 3:] = [0.0, np.sin(0.01), 0.0, np.cos(0.01)]
    s0.body_q.assign(q)
    with pytest.raises(SolverError, match="shape 0 .*infinite plane.* turns during the step"):
        solver.step(s0, s1, None, None, DT)


def capsule_under_sheet(gap):
    "The 5 × 5 sheet at z = 0.01 with a capsule along x whose top is `gap` below the sheet's centre vertex (12)."
    b = sheet_builder(height=0.01)
    r = 0.005
    along_x = wp.quat_from_axis_angle(wp.vec3(0.0, 1.0, 0.0), np.pi / 2)
    b.add_shape_capsule(-1, xform=wp.transform(wp.vec3(0.0, 0.0, 0.01 - gap - r), along_x), radius=r, half_height=0.005)
    return b.finalize(device="cpu")


def test_capsule_cold_start_inside_the_barrier_band_steps():
    model = capsule_under_sheet(0.5e-3)                          # 0.5 mm: inside d̂ = 1 mm, outside min_gap
    solver = SolverIPC(model)
    s0, s1 = model.state(), model.state()
    for _ in range(3):
        solver.step(s0, s1, None, None, DT)
        s0, s1 = s1, s0
        x = s0.particle_q.numpy()[12]
        assert np.hypot(x[1], x[2] - (0.01 - 0.5e-3 - 0.005)) - 0.005 > 1.5e-5, x     # outside capsule + min_gap/2


def test_capsule_cold_start_inside_the_capsule_names_particle_and_shape():
    model = capsule_under_sheet(-2e-3)                           # vertex 12 is 2 mm deep in the capsule
    solver = SolverIPC(model)
    s0, s1 = model.state(), model.state()
    s1.particle_q.assign(np.full((model.particle_count, 3), 7.0, np.float32))
    inside = r"invalid start: particle 12 is 2\.0\d*e-03 m inside shape 0 \(capsule, body -1\)"
    with pytest.raises(SolverError, match=inside):
        solver.step(s0, s1, None, None, DT)
    assert (s1.particle_q.numpy() == 7.0).all()                  # the failed step wrote nothing


def test_cold_start_inside_a_sphere_shape_names_particle_and_shape():
    b = sheet_builder(height=0.01)
    b.add_shape_sphere(-1, xform=wp.transform(wp.vec3(0.0, 0.0, 0.006), wp.quat_identity()), radius=0.005)
    model = b.finalize(device="cpu")
    s0, s1 = model.state(), model.state()
    with pytest.raises(SolverError, match=r"invalid start: particle 12 is 1\.0\d*e-03 m inside shape 0 \(sphere"):
        SolverIPC(model).step(s0, s1, None, None, DT)
