"""Contact primitives, candidate search and barrier (newtonipc_nb.barrier): cross-checks beyond the notebook.

Default runs are small; `slow` runs the full-size checks of the issue (≥ 100,000 configurations per
family against ipctk, more bag states and trajectories). `gpu` compares the CUDA search with the CPU one.
"""
import math

import numpy as np
import pytest
import warp as wp

from newtonipc_nb.verification.distance_refs import (EE_CASES, VT_CASES, exact_edge_edge_distance, ipctk_distances,
    sample_configurations)
from newtonipc_nb.distances import KIND_EE, KIND_SF, KIND_SS, KIND_VP, KIND_VT, edge_edge_distance, vertex_face_distance
from newtonipc_nb.barrier import BarrierTerm, ContactSet, barrier_values
from newtonipc_nb.candidates import CandidateSearch, contact_keys
from newtonipc_nb.scenes.test_scenes import (bag_film_model, barrier_test_scene, crumpled_bag, flattened_bag,
    folded_bag)
from newtonipc_nb.verification.candidate_refs import brute_force_contacts, swept_check
from newtonipc_nb.terms import HessianBlocks
from newtonipc_nb.inputs import IPCModel
from newtonipc_nb.scenes.bag_scene import bag_mesh, bag_scene_builder

ipctk = pytest.importorskip("ipctk")


@pytest.fixture(scope="module")
def film():
    return bag_film_model("cpu")


@pytest.fixture(scope="module")
def scene():
    builder, idx = bag_scene_builder()
    return IPCModel.from_newton(builder.finalize(device="cpu")), idx


def _wp(x, device="cpu"):
    return wp.array(np.asarray(x, dtype=np.float64), dtype=wp.vec3d, device=device)


# --- distances against ipctk ------------------------------------------------------------------

def _check_against_ipctk(kind, case, n, seed):
    """|d − sqrt(d²_ipctk)| < 1e-12 m; where ipctk is ill-conditioned (nearly parallel edges), the exact rational
    distance decides, and ours must match it to 1e-14 m while being closer than ipctk's."""
    x = sample_configurations(kind, case, n, seed)
    x_copy = x.copy()
    d, w = (vertex_face_distance if kind == KIND_VT else edge_edge_distance)(x)
    np.testing.assert_array_equal(x, x_copy)                       # inputs untouched
    assert np.abs(w.sum(1)).max() < 1e-15
    ref = ipctk_distances(kind, x)
    bad = np.flatnonzero(np.abs(d - ref) >= 1e-12)
    if kind == KIND_VT or case != "nearly parallel":
        assert len(
            bad
        ) == 0, f"{case}: {len(bad)} configurations differ from ipctk by ≥ 1e-12 m (max {np.abs(d - ref).max():.2e})"
    # exact arithmetic is slow: a sample of the disagreements
    for i in bad[:400]:
        ex = exact_edge_edge_distance(x[i])
        assert abs(d[i] - ex) < 1e-14 and abs(d[i] - ex) <= abs(ref[i] - ex), (i, d[i], ref[i], ex)
    return len(bad)


@pytest.mark.parametrize("case", VT_CASES)
def test_vertex_face_vs_ipctk(case):
    _check_against_ipctk(KIND_VT, case, 10_000, 100)


@pytest.mark.parametrize("case", EE_CASES)
def test_edge_edge_vs_ipctk(case):
    _check_against_ipctk(KIND_EE, case, 10_000, 200)


@pytest.mark.slow
@pytest.mark.parametrize("kind,case", [(KIND_VT, c) for c in VT_CASES] + [(KIND_EE, c) for c in EE_CASES])
def test_distances_vs_ipctk_100k(kind, case):
    _check_against_ipctk(kind, case, 100_000, 300)


def test_weights_reproduce_closest_points():
    """The weights are those of the closest points: no point of the primitives found by dense sampling is closer."""
    rng = np.random.default_rng(5)
    x = rng.random((200, 4, 3))
    d, w = vertex_face_distance(x)
    u, v = np.meshgrid(np.linspace(0, 1, 60), np.linspace(0, 1, 60))
    m = (u + v) <= 1
    u, v = u[m], v[m]
    for i in range(len(x)):
        q = x[i, 1] + u[:, None] * (x[i, 2] - x[i, 1]) + v[:, None] * (x[i, 3] - x[i, 1])
        assert d[i] <= np.linalg.norm(q - x[i, 0], axis=1).min() + 1e-15
        assert w[i, 0] == 1 and np.all(w[i, 1:] <= 0)              # a barycentric point of the face
    d, w = edge_edge_distance(x)
    s = np.linspace(0, 1, 200)
    for i in range(len(x)):
        pa = x[i, 0] + s[:, None] * (x[i, 1] - x[i, 0])
        pb = x[i, 2] + s[:, None] * (x[i, 3] - x[i, 2])
        assert d[i] <= np.linalg.norm(pa[:, None] - pb[None], axis=2).min() + 1e-15
        assert 0 <= w[i, 1] <= 1 and -1 <= w[i, 3] <= 0


def test_batch_input_errors():
    x = np.zeros((3, 4, 3))
    # converted, not refused
    np.testing.assert_array_equal(vertex_face_distance(x.astype(np.float32))[0], vertex_face_distance(x)[0])
    with pytest.raises(ValueError, match=r"x must have shape \(n, 4, 3\)"): edge_edge_distance(np.zeros((3, 3, 3)))
    with pytest.raises(ValueError, match="numeric array"): edge_edge_distance([["a"] * 3] * 4)
    x[1, 2, 0] = np.nan
    with pytest.raises(ValueError, match=r"vertex_face_distance: x\[1\] has a non-finite value"):
        vertex_face_distance(x)
    d, w = vertex_face_distance(np.zeros((0, 4, 3)))
    assert d.shape == (0,) and w.shape == (0, 4)


def test_degenerate_primitives_finite():
    """Zero-area triangles and zero-length edges fall through to the edge/endpoint branches: finite, exact results."""
    p = np.array([[[0, 0, 1.0], [0, 0, 0], [1, 0, 0], [2, 0, 0]],     # collinear triangle
                  [[0, 1.0, 0], [0.5, 0, 0], [0.5, 0, 0], [0.5, 0, 0]]])  # a point triangle
    d, w = vertex_face_distance(p)
    np.testing.assert_allclose(d, [1.0, np.hypot(0.5, 1.0)], rtol=0, atol=1e-15)
    e = np.array([[[0, 0, 0], [0, 0, 0], [1, 1, 0], [1, -1, 0.0]]])       # a zero-length edge
    d, w = edge_edge_distance(e)
    np.testing.assert_allclose(d, [1.0], atol=1e-15)
    assert np.all(np.isfinite(w))


# --- candidate search ---------------------------------------------------------------------------

def _misses(model, X, **kw):
    cs = CandidateSearch(model, **kw).update(_wp(X))
    bp, bk, _ = brute_force_contacts(model, X)
    active = contact_keys(bp, bk)
    return len(active - contact_keys(*cs.numpy()[:2])), len(active), cs.count


@pytest.mark.parametrize("state", ["flattened", "folded", "crumpled"])
def test_zero_misses_on_bag(film, state):
    V = film.rest_q.numpy()
    X = {"flattened": flattened_bag(V), "folded": folded_bag(V, bend=2e-4), "crumpled": crumpled_bag(V, seed=7)}[state]
    for skin in (0.0, 1.5e-3):
        missed, active, count = _misses(film, X, skin=skin)
        assert active > 500 and missed == 0, (state, skin, missed, active, count)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_zero_misses_on_crumpled_bags(film, seed):
    V = film.rest_q.numpy()
    for amp in (3e-3, 6e-3, 12e-3):
        missed, active, _ = _misses(film, crumpled_bag(V, seed=100 + seed, amplitude=amp), skin=0.0)
        assert active > 0 and missed == 0


def test_candidates_respect_exclusions(scene):
    model, idx = scene
    X = model.rest_q.numpy().copy()
    X[list(idx.film)] = folded_bag(X[list(idx.film)] - [0, 0, 0.002]) + [0, 0, 0.002]
    cs = CandidateSearch(model).update(_wp(X))
    pairs, kind, off = cs.numpy()
    fixed = model.fixed.numpy().astype(bool)
    assert not fixed[pairs].all(1).any()
    vt = pairs[kind == KIND_VT]
    assert not (vt[:, :1] == vt[:, 1:]).any()
    ee = pairs[kind == KIND_EE]
    assert not ((ee[:, [0]] == ee[:, 2:]) | (ee[:, [1]] == ee[:, 2:])).any()        # no shared vertex
    keys = [tuple(sorted((tuple(sorted(p[:2])), tuple(sorted(p[2:]))))) for p in ee.tolist()]
    assert len(keys) == len(set(keys))
    assert cs.counts()["sphere–sphere"] == 21
    np.testing.assert_array_equal(off[kind == KIND_VT], 3e-5)


def test_overflow_regrow_identical(film):
    X = folded_bag(film.rest_q.numpy())
    tiny = CandidateSearch(film, capacity=1)
    cs = tiny.update(_wp(X))
    assert tiny.stats["regrows"] == 1 and cs.capacity >= cs.count > 1
    ref = CandidateSearch(film, capacity=200_000).update(_wp(X))
    assert contact_keys(*cs.numpy()[:2]) == contact_keys(*ref.numpy()[:2])


def test_skin_reuse_is_sound(film):
    """Random moves that stay inside the skin boxes reuse the set, and the reused set still has every active pair."""
    rng = np.random.default_rng(9)
    X = folded_bag(film.rest_q.numpy())
    search = CandidateSearch(film, skin=1.5e-3)
    cs0 = search.update(_wp(X))
    have = contact_keys(*cs0.numpy()[:2])
    for _ in range(5):
        Y = X + rng.uniform(-1.49e-3, 1.49e-3, X.shape)
        assert search.update(_wp(X), _wp(Y)) is cs0
        for tau in (0.25, 0.5, 1.0):
            bp, bk, _ = brute_force_contacts(film, (1 - tau) * X + tau * Y)
            assert not (contact_keys(bp, bk) - have)
    assert search.stats["builds"] == 1 and search.stats["reuses"] == 5
    Y = X.copy()
    Y[100, 2] -= 1.51e-3
    assert not search.covers(_wp(Y)) and search.update(_wp(Y)) is cs0 and search.stats["builds"] == 2


def test_search_input_errors(film):
    s = CandidateSearch(film)
    X = film.rest_q.numpy()
    with pytest.raises(TypeError, match="dtype wp.vec3d"): s.update(wp.array(X, dtype=wp.vec3f))
    with pytest.raises(ValueError, match="one vec3d per particle"): s.update(_wp(X[:5]))
    Y = X.copy()
    Y[3, 1] = np.inf
    with pytest.raises(ValueError, match="particle 3"): s.update(_wp(Y))
    with pytest.raises(ValueError, match="dhat > 0"): CandidateSearch(film, dhat=0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_swept_17_instants(film, seed):
    rng = np.random.default_rng(seed)
    V = film.rest_q.numpy()
    X0 = crumpled_bag(V, seed=20 + seed, amplitude=3e-3)
    X1 = X0 + 4e-3 * rng.standard_normal(X0.shape)                  # a rough random motion, up to ~1 cm per vertex
    r = swept_check(film, X0, X1, skin=0.0)
    assert r["active_any_instant"] > 1000 and r["missed"] == 0, r


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_swept_17_instants_slow(film, scene, seed):
    rng = np.random.default_rng(50 + seed)
    V = film.rest_q.numpy()
    X0 = folded_bag(V) if seed % 2 else crumpled_bag(V, seed=seed)
    for scale in (1e-3, 5e-3, 2e-2):
        X1 = X0 + scale * rng.standard_normal(X0.shape)
        for skin in (0.0, 1.5e-3):
            r = swept_check(film, X0, X1, skin=skin)
            assert r["missed"] == 0, (scale, skin, r)
    # spheres falling through the film and onto each other
    model, idx = scene
    X0 = model.rest_q.numpy()
    X1 = X0.copy()
    s = np.asarray(idx.spheres)
    X1[s] = X0[s] * [1, 1, 0] + rng.uniform(-0.03, 0.03, (len(s), 3)) + [0, 0, 0.05]
    r = swept_check(model, X0, X1)
    assert r["missed"] == 0 and r["active_any_instant"] > 0, r


def test_sphere_kinds(scene):
    model, idx = scene
    X = model.rest_q.numpy().copy()
    s = np.asarray(idx.spheres)
    R = model.radius.numpy()[s]
    X[s[0]] = [0.0, 0.0, 0.002 + R[0] + 4e-4]
    X[s[1]] = X[s[0]] + [0.0, 0.0, R[0] + R[1] + 5e-4]             # stacked on sphere 0
    cs = CandidateSearch(model, skin=0.0).update(_wp(X))
    bp, bk, bg = brute_force_contacts(model, X)
    assert (bk == KIND_SF).sum() > 0 and (bk == KIND_SS).sum() == 1
    assert not (contact_keys(bp, bk) - contact_keys(*cs.numpy()[:2]))
    term = BarrierTerm(cs)
    gaps = term.gaps(_wp(X))
    kinds = cs.numpy()[1]
    np.testing.assert_allclose(gaps[kinds == KIND_SS].min(), 5e-4, atol=1e-9)
    np.testing.assert_allclose(gaps[kinds == KIND_SF].min(), 4e-4 - 1.5e-5, atol=1e-9)


@pytest.mark.gpu
def test_cuda_search_matches_cpu(film):
    X = crumpled_bag(film.rest_q.numpy(), seed=3)
    gpu_model = bag_film_model("cuda:0")
    cs_gpu = CandidateSearch(gpu_model).update(_wp(X, "cuda:0"))
    cs_cpu = CandidateSearch(film).update(_wp(X))
    assert contact_keys(*cs_gpu.numpy()[:2]) == contact_keys(*cs_cpu.numpy()[:2])
    Xb, cset = barrier_test_scene()
    pairs, kind, off = cset.numpy()
    tg = BarrierTerm(ContactSet.from_numpy(pairs, kind, off, device="cuda:0"))
    assert abs(tg.energy(_wp(Xb, "cuda:0")) - BarrierTerm(cset).energy(_wp(Xb))) < 1e-15


# --- barrier --------------------------------------------------------------------------------------

def test_barrier_scalar_derivatives():
    for dhat, k in ((1e-3, 1000.0), (1.2e-4, 50.0)):
        g = np.geomspace(1e-3 * dhat, 0.999 * dhat, 300)
        h = 1e-4 * g
        v, vp, vm = barrier_values(g, dhat, k), barrier_values(g + h, dhat, k), barrier_values(g - h, dhat, k)
        np.testing.assert_allclose((vp[:, 0] - vm[:, 0]) / (2 * h), v[:, 1], rtol=1e-6,
                                   atol=1e-9 * np.abs(v[:, 1]).max())
        np.testing.assert_allclose((vp[:, 1] - vm[:, 1]) / (2 * h), v[:, 2], rtol=1e-6,
                                   atol=1e-9 * np.abs(v[:, 2]).max())
        a = g - dhat
        np.testing.assert_allclose(v[:, 0], -k * a * a * np.log(g / dhat), rtol=1e-14)   # the unsquared-gap barrier
        assert np.all(v[:, 2] > 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_barrier_term_central_differences(seed):
    X, cset = barrier_test_scene(seed)
    term = BarrierTerm(cset, dhat=1e-3, kappa=1000.0, hessian="gauss-newton")
    x = _wp(X)
    g0 = term.gaps(x)
    assert np.all((g0 > 0) & (g0 < 1e-3))
    grad = wp.zeros(len(X), dtype=wp.vec3d, device="cpu")
    hb = HessianBlocks.allocate(term.num_blocks() + 5, device="cpu")
    term.accumulate(x, grad, hb, 5)
    assert (hb.rows.numpy()[:5] == -1).all()
    G = grad.numpy().ravel()
    H = np.zeros((G.size, G.size))
    for r, c, m in zip(hb.rows.numpy(), hb.cols.numpy(), hb.vals.numpy()):
        if r >= 0: H[3 * r:3 * r + 3, 3 * c:3 * c + 3] += m
    h = 1e-8
    fd = np.zeros(G.size)
    J = np.zeros((len(g0), G.size))
    for i in range(G.size):
        Xp, Xm = X.copy(), X.copy()
        Xp.flat[i] += h
        Xm.flat[i] -= h
        fd[i] = (term.energy(_wp(Xp)) - term.energy(_wp(Xm))) / (2 * h)
        J[:, i] = (term.gaps(_wp(Xp)) - term.gaps(_wp(Xm))) / (2 * h)
    np.testing.assert_allclose(G, fd, rtol=0, atol=1e-6 * np.abs(fd).max())
    d2 = barrier_values(g0)[:, 2]
    np.testing.assert_allclose(H, (J.T * d2) @ J, rtol=0, atol=1e-6 * np.abs(H).max())
    np.testing.assert_allclose(H, H.T, atol=1e-12 * np.abs(H).max())
    assert np.linalg.eigvalsh(H).min() > -1e-9 * np.abs(H).max()
    e = term.energy(x)
    np.testing.assert_allclose(e, barrier_values(g0)[:, 0].sum(), rtol=1e-14)


def _local_hessian(X, pairs, kinds, offsets, mode):
    "Gradient, assembled Hessian and gaps of a few candidates with BarrierTerm(hessian=mode)."
    term = BarrierTerm(ContactSet.from_numpy(pairs, kinds, offsets), dhat=1e-3, kappa=1000.0, hessian=mode)
    x = _wp(X)
    grad = wp.zeros(len(X), dtype=wp.vec3d, device="cpu")
    hb = HessianBlocks.allocate(term.num_blocks(), device="cpu")
    term.accumulate(x, grad, hb, 0)
    H = np.zeros((3 * len(X),) * 2)
    for r, c, m in zip(hb.rows.numpy(), hb.cols.numpy(), hb.vals.numpy()):
        if r >= 0:
            H[3 * r:3 * r + 3, 3 * c:3 * c + 3] += m
    return grad.numpy().ravel(), H, term.gaps(x)


def _hessian_cases():
    "One contact in each closest-point sub-case: face inside / edge / vertex, plane, edge–edge inside / end / ends."
    rng = np.random.default_rng(1)
    tri = np.array([[0, 0, 0], [0.01, 0, 0], [0, 0.01, 0.0]])
    points = (("inside", [0.003, 0.003, 4e-4]), ("edge", [0.005, -0.0002, 3e-4]), ("vertex", [-0.0002, -0.0002, 3e-4]))
    for name, p in points:
        X = np.concatenate([[p], tri]) + 1e-5 * rng.standard_normal((4, 3))
        yield f"vt {name}", X, KIND_VT
        yield f"vp {name}", X, KIND_VP
    A = np.array([[0, 0, 0], [0.01, 0.001, 0]])
    for name, B in (("inside", [[0.005, -0.004, 4e-4], [0.004, 0.005, 5e-4]]),
                    ("end-edge", [[0.0102, -0.004, 4e-4], [0.0105, 0.005, 5e-4]]),
                    ("end-end", [[0.0102, 0.0012, 3e-4], [0.015, 0.004, 5e-4]])):
        yield f"ee {name}", np.concatenate([A, B]) + 1e-6 * rng.standard_normal((4, 3)), KIND_EE


def _fd_hessian(X, args, h=1e-9):
    "Central differences of the exact barrier gradient of the candidates `args` at positions X: the Hessian's columns."
    G = _local_hessian(X, *args, "exact")[0]
    fd = np.zeros((G.size, G.size))
    for i in range(G.size):
        Xp, Xm = X.copy(), X.copy()
        Xp.flat[i] += h
        Xm.flat[i] -= h
        fd[:, i] = (_local_hessian(Xp, *args, "exact")[0] - _local_hessian(Xm, *args, "exact")[0]) / (2 * h)
    return fd


@pytest.mark.parametrize("case", list(_hessian_cases()), ids=lambda c: c[0])
def test_barrier_local_hessian_and_projection(case):
    "The exact local Hessian against central differences of the gradient; the projected one is its PSD part."
    _, X, kind = case
    args = ([[0, 1, 2, 3]], [kind], [3e-5])
    G, H, g = _local_hessian(X, *args, "exact")
    assert 0 < g[0] < 1e-3
    fd = _fd_hessian(X, args)
    np.testing.assert_allclose(H, fd, rtol=0, atol=1e-7 * np.abs(fd).max())
    w, V = np.linalg.eigh(H)
    assert w.min() < -1e-3 * w.max()                      # the distance curvature makes it indefinite here
    Gp, Hp, _ = _local_hessian(X, *args, "projected")
    np.testing.assert_array_equal(Gp, G)
    np.testing.assert_allclose(Hp, (V * np.maximum(w, 0)) @ V.T, rtol=0, atol=1e-12 * np.abs(H).max())
    assert np.linalg.eigvalsh(Hp).min() > -1e-12 * np.abs(Hp).max()


def test_barrier_projected_hessian_on_the_test_scene():
    "Every kind at once: the exact Hessian against central differences, the projected one PSD."
    X, cset = barrier_test_scene(0)
    args = cset.numpy()
    G, H, _ = _local_hessian(X, *args, "exact")
    fd = _fd_hessian(X, args)
    np.testing.assert_allclose(H, fd, rtol=0, atol=1e-7 * np.abs(fd).max())
    _, Hp, _ = _local_hessian(X, *args, "projected")
    assert np.linalg.eigvalsh(Hp).min() > -1e-12 * np.abs(Hp).max()
    with pytest.raises(ValueError, match="hessian must be one of 'projected', 'gauss-newton', 'exact'; got 'newton'"):
        BarrierTerm(cset, hessian="newton")


def test_barrier_term_admissibility_and_errors():
    X, cset = barrier_test_scene()
    term = BarrierTerm(cset)
    Y = X.copy()
    Y[0] = X[1:4].mean(0)  # vertex inside the face: g = −min_gap
    assert math.isinf(term.energy(_wp(Y)))
    Y = X.copy()
    Y[8] = X[9]  # sphere centres coincide: ‖r‖ = 0, never NaN
    assert math.isinf(term.energy(_wp(Y)))
    assert term.min_gap(_wp(Y)) < 0
    with pytest.raises(TypeError, match="ContactSet"): BarrierTerm(42)
    with pytest.raises(ValueError, match="do not fit"):
        term.accumulate(_wp(X), wp.zeros(len(X), dtype=wp.vec3d), HessianBlocks.allocate(10, device="cpu"), 0)
    with pytest.raises(TypeError, match="vec3d"): term.energy(wp.array(X, dtype=wp.vec3f))
    empty = BarrierTerm(ContactSet.allocate(4))
    assert empty.energy(_wp(X)) == 0.0 and empty.num_blocks() == 0 and empty.min_gap(_wp(X)) == math.inf


def test_barrier_term_follows_search(film):
    """A term built on a CandidateSearch always sees its current set (num_blocks tracks rebuilds)."""
    search = CandidateSearch(film)
    term = BarrierTerm(search)
    X = folded_bag(film.rest_q.numpy())
    search.update(_wp(film.rest_q.numpy()))
    n_rest = term.num_blocks()
    search.update(_wp(X))
    assert term.num_blocks() == 16 * search.contacts.count > n_rest
    assert 0 < term.min_gap(_wp(X)) < 1e-3 and np.isfinite(term.energy(_wp(X))) and term.energy(_wp(X)) > 0


def test_screened_active_and_near_sets_match_full_evaluation():
    """`prepare` and `near` skip candidates whose reference gap, less twice the motion since, cannot reach the
    threshold: on random moves of a folded bag (small, and beyond d̂, which retakes the reference) they match a full
    evaluation."""
    V, _ = bag_mesh()
    X = folded_bag(V)
    search = CandidateSearch(bag_film_model("cpu"), device="cpu")
    xw = _wp(X)
    search.update(xw, xw)
    term = BarrierTerm(search)
    term.min_gap(xw)
    rng = np.random.default_rng(0)
    pairs = search.contacts.pairs.numpy()[:search.contacts.count]
    for trial in range(60):
        Y = X + rng.normal(scale=[1e-5, 1e-4, 4e-4][trial % 3], size=X.shape)
        yw = _wp(Y)
        g = term.gaps(yw)
        term.prepare(yw)
        assert set(term._active.numpy()[:term.active_count()].tolist()) == set(
            np.flatnonzero((g > 0) & (g < 1e-3)).tolist())
        reach = [0.0, 1e-4, 1e-3][trial % 3]
        near = term.near(yw, reach)
        assert {tuple(p)
                for p in near.pairs.numpy()[:near.count].tolist()
                } == {tuple(pairs[c])
                      for c in np.flatnonzero(g < 1e-3 + reach)}


def _assembled(term, x, n):
    "Gradient and dense Hessian of one `accumulate` of `term` at x (n particles)."
    grad = wp.zeros(n, dtype=wp.vec3d, device="cpu")
    hb = HessianBlocks.allocate(term.num_blocks(), device="cpu")
    term.accumulate(x, grad, hb, 0)
    H = np.zeros((3 * n, 3 * n))
    for r, c, m in zip(hb.rows.numpy(), hb.cols.numpy(), hb.vals.numpy()):
        if r >= 0: H[3 * r:3 * r + 3, 3 * c:3 * c + 3] += m
    return grad.numpy().ravel(), H


def test_barrier_slots_follow_the_active_count():
    """With a near set far larger than the active set, `prepare` reserves slots for at most twice the last active count
    and 4,096 more, not for every near candidate; when the actives exceed that (a first call: no count yet), the count
    read says so, and the next `prepare` reserves twice that count and 4,096 more, not a slot per candidate. The
    assembly then equals the unrestricted one."""
    V, _ = bag_mesh()
    X = flattened_bag(V)                       # layers 37 µm apart and more: 9,087 of 31,166 candidates active
    search = CandidateSearch(bag_film_model("cpu"), device="cpu")
    xw = _wp(X)
    search.update(xw, xw)
    term = BarrierTerm(search)
    near = term.near(xw, 0.05)                 # a reach of 5 cm: every candidate is near
    n_cand = search.contacts.count
    assert near.count == n_cand
    term.restrict(near)
    term.prepare(xw)
    assert term.num_blocks() == 16 * 4096      # no active count read yet: 4,096 slots
    assert not term.settle_prepare(term.prepared_scalars.numpy())
    n_act = term.active_count()
    assert 4096 < n_act and 2 * n_act + 4096 < n_cand
    term.prepare(xw)                           # the caller assembles again
    assert term.num_blocks() == 16 * (2 * n_act + 4096)
    assert term.settle_prepare(term.prepared_scalars.numpy())
    assert term.num_blocks() == 16 * n_act     # once read, exactly the actives
    grad, H = _assembled(term, xw, len(X))
    full = BarrierTerm(search)
    full.prepare(xw)
    assert full.num_blocks() == 16 * n_cand    # unrestricted before its count is read: every candidate
    grad_full, H_full = _assembled(full, xw, len(X))
    np.testing.assert_allclose(grad, grad_full, rtol=1e-12, atol=1e-12 * np.abs(grad_full).max())
    np.testing.assert_allclose(H, H_full, rtol=1e-12, atol=1e-12 * np.abs(H_full).max())
    term.prepare(xw)                           # a settled count caps the next reservation even under a larger set
    assert term.num_blocks() == 16 * min(n_cand, 2 * n_act + 4096)
