"""IPCModel.from_newton: the bag scene is read right, and every kind of bad model is refused by name."""
import math

from pathlib import Path

import numpy as np
import pytest
import warp as wp

from newtonipc_nb.inputs import BAG_FILM, IPCModel, ModelError, add_mesh, mesh_report
from newtonipc_nb.scenes.bag_scene import (SPHERE_RADII, bag_grid, bag_mesh, bag_scene_builder, check_resolution,
                                           film_resolution, ring_and_column, ring_sizes, ring_vertices)


@pytest.fixture(scope="module")
def scene():
    builder, idx = bag_scene_builder()
    return builder.finalize(device="cpu"), idx


def fresh():
    return bag_scene_builder()[0].finalize(device="cpu")


def snapshot(model):
    return {
        k: getattr(model, k).numpy().copy()
        for k in ("particle_q", "particle_mass", "particle_radius", "particle_flags", "tri_indices", "tri_poses",
                  "edge_indices")
    }


def test_bag_mesh_topology():
    v, f = bag_mesh()
    assert v.shape == (481, 3) and v.dtype == np.float64 and f.shape == (928, 3) and f.dtype == np.int32
    assert ring_vertices(1)[0] == 1 and ring_vertices(15)[-1] == 480 and ring_vertices(11).tolist() == list(
        range(321, 353))
    columns = sum(np.linalg.norm(v[ring_vertices(k + 1)] - v[ring_vertices(k)], axis=1) for k in range(11, 15))
    np.testing.assert_allclose(columns, 0.030, rtol=0, atol=1e-15)
    rep = mesh_report(v, f)
    assert rep["nonmanifold_edges"] == 0 and rep["duplicated_directed_edges"] == 0 and rep["boundary_edges"] == 32
    assert rep["min_area"] > 0
    # the hem is the boundary loop
    e = np.sort(np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]]), axis=1)
    u, c = np.unique(e, axis=0, return_counts=True)
    assert set(u[c == 1].ravel()) == set(ring_vertices(15).tolist())


# bag_mesh() as package 0.1 built it (commit 74d1936)
MESH_0_1 = Path(__file__).resolve().parent / "data" / "bag_mesh_0.1.npz"


def _mesh_before_resolutions():
    "The bag mesh as it was built before `resolution` existed, stored from that code."
    m = np.load(MESH_0_1)
    return m["vertices"], m["faces"]

def test_resolution_1_is_the_mesh_of_before():
    v, f = bag_mesh(1)
    v0, f0 = _mesh_before_resolutions()
    assert v.dtype == v0.dtype and f.dtype == f0.dtype
    assert np.array_equal(v, v0) and np.array_equal(f, f0), "bit for bit"
    assert np.array_equal(bag_mesh()[0], v)


@pytest.mark.parametrize("k, n_vertices, n_faces", [(1, 481, 928), (2, 1761, 3456), (4, 6977, 13824)])
def test_bag_mesh_at_every_resolution(k, n_vertices, n_faces):
    v, f = bag_mesh(k)
    rings, columns, neck, hem = bag_grid(k)
    assert (rings, columns, neck, hem) == (15 * k, 32 * k, 11 * k, 15 * k)
    assert v.shape == (n_vertices, 3) and f.shape == (n_faces, 3) and film_resolution(n_vertices) == k
    assert np.all(v[0] == 0.0), "vertex 0 is the centre"
    sizes = ring_sizes(k)                            # ring r holds the next sizes[r − 1] vertices after ring r − 1
    assert sizes[3 * k - 1:].tolist() == [columns] * (rings - 3 * k + 1) and sizes.sum() + 1 == n_vertices
    for r in (1, 2, neck, rings):
        assert ring_vertices(r, k).tolist() == list(range(1 + sizes[:r - 1].sum(), 1 + sizes[:r].sum()))
        ring, col = ring_and_column(ring_vertices(r, k), k)
        assert (ring == r).all() and col.tolist() == list(range(sizes[r - 1]))
    rep = mesh_report(v, f)
    assert rep["nonmanifold_edges"] == 0 and rep["duplicated_directed_edges"] == 0, "manifold, consistently oriented"
    assert rep["boundary_edges"] == columns and rep["euler_characteristic"] == 1 and rep["min_area"] > 0
    e = np.sort(np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]]), axis=1)
    u, c = np.unique(e, axis=0, return_counts=True)
    assert set(u[c == 1].ravel()) == set(ring_vertices(hem, k).tolist()), "the hem, the last ring, is the boundary"
    n, c = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]]), v[f].mean(1)
    bottom = (v[f][:, :, 2] == 0).all(1)
    assert np.all(n[bottom, 2] < 0) and np.all(
        np.einsum("ij,ij->i", n[~bottom, :2], c[~bottom, :2]) > 0), "normals point outward"
    # the neck ring is 30 mm of rest length from the hem along every column
    along = sum(np.linalg.norm(v[ring_vertices(r + 1, k)] - v[ring_vertices(r, k)], axis=1) for r in range(neck, hem))
    np.testing.assert_allclose(along, 0.030, rtol=0, atol=1e-15)
    # the same shape: every k-th ring and column is the resolution-1 vertex
    v1 = bag_mesh(1)[0]
    for r in range(3 if k > 1 else 1, 16):           # the bottom disc's inner rings hold fewer vertices at k ≥ 2
        assert np.array_equal(v[ring_vertices(k * r, k)][::k], v1[ring_vertices(r)])
    # the bottom disc at k ≥ 2: near-uniform edges, no centre fan of slivers (see ring_sizes)
    disc = (v[e][:, :, 2] == 0).all(1)
    length = np.linalg.norm(v[e[:, 1]] - v[e[:, 0]], axis=1)
    if k > 1: assert length[disc].max() / length[disc].min() < 2.5 and length[disc].min() > 0.010 / k
    np.testing.assert_allclose(rep["total_area"], mesh_report(*bag_mesh(1))["total_area"], rtol=3e-3)


@pytest.mark.parametrize("bad", [0, 3, 8, -1, 2.0, "2", True, None])
def test_bad_resolution_is_named(bad):
    with pytest.raises(ValueError, match=f"resolution must be one of 1, 2, 4, got {bad!r}"):
        check_resolution(bad)
    with pytest.raises(ValueError, match="resolution"):
        bag_mesh(bad)
    with pytest.raises(ValueError, match="1000 vertices is no bag mesh"):
        film_resolution(1000)
    with pytest.raises(ValueError, match="ring index must be in 1..30 at resolution 2, got 31"):
        ring_vertices(31, 2)


def test_bag_scene_at_resolution_2_keeps_mass_and_area():
    b1, i1 = bag_scene_builder()
    b2, i2 = bag_scene_builder(resolution=2)
    assert len(i2.film) == 1761 and len(i2.spheres) == 7 and i2.film.start == 0
    m1, m2 = (np.asarray(b.particle_mass)[np.asarray(i.film)].sum() for b, i in ((b1, i1), (b2, i2)))
    np.testing.assert_allclose(m2, m1, rtol=3e-3)


def test_bag_scene_counts_and_masses(scene):
    model, idx = scene
    before = snapshot(model)
    ipc = IPCModel.from_newton(model)
    m = ipc.mass.numpy()
    film = np.asarray(idx.film)
    assert len(ipc.film_particles) == 481 and ipc.film_particles.tolist() == film.tolist()
    area = mesh_report(*bag_mesh())["total_area"]
    assert math.isclose(m[film].sum(), BAG_FILM.areal_density * area, rel_tol=1e-6)
    np.testing.assert_allclose(m[ipc.sphere.numpy()], [250 * 4 / 3 * math.pi * r**3 for r in SPHERE_RADII], rtol=1e-6)
    assert ipc.sphere.numpy().tolist() == list(idx.spheres)
    fixed = ipc.fixed.numpy().astype(bool)
    assert fixed[list(idx.bin)].all() and fixed[list(idx.floor)].all() and not fixed[film].any()
    np.testing.assert_allclose(ipc.radius.numpy()[ipc.sphere.numpy()], SPHERE_RADII, rtol=1e-6)
    assert np.all(ipc.radius.numpy()[np.r_[film, list(idx.bin), list(idx.floor)]] == 0)
    assert ipc.tri.dtype == wp.int32 and ipc.hinge.dtype == wp.int32 and ipc.tri_area.dtype == wp.float64
    assert ipc.elastic_tri.shape[0] == 928
    # every rest area is the geometric one, in FP64
    x = ipc.rest_q.numpy()
    t = ipc.tri.numpy()
    geo = 0.5 * np.linalg.norm(np.cross(x[t[:, 1]] - x[t[:, 0]], x[t[:, 2]] - x[t[:, 0]]), axis=1)
    np.testing.assert_allclose(ipc.tri_area.numpy(), geo, rtol=1e-5)
    after = snapshot(model)
    for k in before: np.testing.assert_array_equal(before[k], after[k], err_msg=f"from_newton modified model.{k}")


def test_hinges_and_stiffness(scene):
    model, idx = scene
    ipc = IPCModel.from_newton(model)
    h = ipc.hinge.numpy()
    assert (h >= 0).all()
    # interior edges of the bag: all edges (3·928 + 32)/2 minus the 32 hem edges
    assert len(h) == (3 * 928 + 32) // 2 - 32
    x = ipc.rest_q.numpy()
    length = np.linalg.norm(x[h[:, 3]] - x[h[:, 2]], axis=1)
    area = sum(0.5 * np.linalg.norm(np.cross(x[h[:, 3]] - x[h[:, 2]], x[h[:, i]] - x[h[:, 2]]), axis=1) for i in (0, 1))
    np.testing.assert_allclose(ipc.hinge_k.numpy(), 6 * BAG_FILM.D * length**2 / area, rtol=1e-5)
    # |θ0| equals the angle between the two face normals, computed here independently with arccos
    n = lambda p, q, r: np.cross(x[q] - x[p], x[r] - x[p]) / np.linalg.norm(np.cross(x[q] - x[p], x[r] - x[p]), axis=1,
                                                                            keepdims=True)
    n1, n2 = n(h[:, 0], h[:, 2], h[:, 3]), n(h[:, 1], h[:, 3], h[:, 2])
    np.testing.assert_allclose(np.abs(ipc.hinge_rest_angle.numpy()), np.arccos(np.clip(np.sum(n1 * n2, 1), -1, 1)),
                               atol=1e-6)
    # the bottom disc is flat and the bottom corner ring is folded by more than 80°
    z = x[:, 2] - x[list(idx.film), 2].min()
    flat = np.all(z[h] < 1e-9, axis=1)
    assert flat.sum() > 0 and np.abs(ipc.hinge_rest_angle.numpy()[flat]).max() < 1e-6
    corner = (z[h[:, 2]] < 1e-9) & (z[h[:, 3]] < 1e-9) & (np.maximum(z[h[:, 0]], z[h[:, 1]]) > 1e-3)
    assert corner.sum() == 32 and np.abs(ipc.hinge_rest_angle.numpy()[corner]).min() > np.radians(80)


def _set(model, name, fn):
    a = getattr(model, name).numpy().copy()
    a = fn(a)
    getattr(model, name).assign(a)
    return model


@pytest.mark.parametrize("case, edit, message", [
    ("nan position", lambda m: _set(m, "particle_q", lambda a:
                                    (a.__setitem__(7, np.nan), a)[1]), "particle 7 has a non-finite "
     "position"),
    ("inf position", lambda m: _set(m, "particle_q", lambda a: (a.__setitem__(
        (12, 1), np.inf), a)[1]), "particle 12 has a non-finite "
     "position"),
    ("nan mass", lambda m: _set(m, "particle_mass", lambda a:
                                (a.__setitem__(3, np.nan), a)[1]), "particle 3 has a non-finite "
     "mass"),
    ("negative mass", lambda m: _set(m, "particle_mass", lambda a:
                                     (a.__setitem__(5, -1.0), a)[1]), "particle 5 has a negative mass"),
    ("negative radius", lambda m: _set(m, "particle_radius", lambda a:
                                       (a.__setitem__(-1, -0.01), a)[1]), "has an invalid radius"),
    ("degenerate triangle", lambda m: _set(m, "tri_poses", lambda a: (a.__setitem__(10, np.inf), a)[1]), "triangle 10"),
])
def test_rejects_bad_model(case, edit, message):
    model = edit(fresh())
    before = snapshot(model)
    with pytest.raises(ModelError, match=message):
        IPCModel.from_newton(model)
    after = snapshot(model)
    for k in before: np.testing.assert_array_equal(before[k], after[k], err_msg=f"{case}: from_newton modified "
                                                                                f"model.{k}")


def test_rejects_degenerate_rest_triangle():
    import newton
    b = newton.ModelBuilder()
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [2, 0, 0]], dtype=float)   # vertices 0, 1, 3 are collinear
    add_mesh(b, v, np.array([[0, 1, 2], [1, 3, 2]], dtype=np.int32), density=0.1, mu=1.0, lam=1.0)
    model = b.finalize(device="cpu")
    IPCModel.from_newton(model)                                                # valid as built
    model.tri_indices.assign(np.array([[0, 1, 2], [0, 1, 3]], dtype=np.int32))  # Newton drops such faces at build time
    with pytest.raises(ModelError, match=r"triangle 1 \[0, 1, 3\] is degenerate at rest"):
        IPCModel.from_newton(model)


def test_rejects_wrong_shapes_and_dtypes():
    m = fresh()
    m.particle_mass = wp.zeros(m.particle_count - 1, dtype=wp.float32, device="cpu")
    with pytest.raises(ModelError, match=r"particle_mass has shape"):
        IPCModel.from_newton(m)
    m = fresh()
    m.particle_q = wp.array(m.particle_q.numpy().astype(np.float64), dtype=wp.vec3d, device="cpu")
    with pytest.raises(ModelError, match=r"particle_q has dtype float64, expected float32"):
        IPCModel.from_newton(m)
    m = fresh()
    m.tri_indices = wp.array(m.tri_indices.numpy().astype(np.int64), dtype=wp.int64, device="cpu")
    with pytest.raises(ModelError, match=r"tri_indices has dtype int64, expected int32"):
        IPCModel.from_newton(m)


def test_rejects_triangle_on_sphere_particle():
    builder, idx = bag_scene_builder()
    model = builder.finalize(device="cpu")
    with pytest.raises(ModelError, match=r"triangle \d+ .* references sphere particle 0"):
        IPCModel.from_newton(model, sphere_particles=[0, *idx.spheres])
    with pytest.raises(ModelError, match=r"outside"):
        IPCModel.from_newton(model, sphere_particles=[10_000])


def test_rejects_sphere_without_radius():
    m = fresh()
    r = m.particle_radius.numpy()
    r[-1] = 0.0
    m.particle_radius.assign(r)
    with pytest.raises(ModelError, match=r"sphere particle \d+ has radius 0"):
        IPCModel.from_newton(m)
