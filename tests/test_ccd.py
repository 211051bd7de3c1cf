"""CCD, step bounds, FP32 recheck and intersection counting (newtonipc_nb.ccd) against analytic cases, dense sampling,
the Wang et al. 2021 sample queries with ground truth, and ipc-toolkit (AdditiveCCD, has_intersections,
compute_collision_free_stepsize)."""
from pathlib import Path

import numpy as np
import pytest
import warp as wp

from newtonipc_nb import ccd
from newtonipc_nb.intersections import count_intersections, intersecting_pairs, tri_tri_intersect_exact
from newtonipc_nb.scenes.test_scenes import (bag_step_states, crumpled_sheet, flat_crumpled_sheet, folded_sheet,
                                             grid_sheet, random_soup, through_face_scene)
from newtonipc_nb.verification.ccd_refs import CCD_QUERY_KINDS, ccd_query_report, ipctk_step_bound, load_ccd_queries
from newtonipc_nb.verification.intersection_refs import (box_overlap_pairs, ipctk_has_intersections,
                                                         pair_intersects_reference, reference_intersecting_pairs)
from newtonipc_nb.distances import KIND_EE, KIND_SF, KIND_SS, KIND_VT, edge_edge_distance, vertex_face_distance
from newtonipc_nb.candidates import CandidateSearch
from newtonipc_nb.barrier import ContactSet
from newtonipc_nb.scenes.test_scenes import bag_film_model
from newtonipc_nb.scenes.bag_scene import bag_mesh

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ROOT / "nbs" / "data" / "ccd-sample-queries"
ipctk = pytest.importorskip("ipctk")
ipctk.set_logger_level(ipctk.LoggerLevel.error)


def _vf(height=1e-3, drop=2e-3, n=1):
    x0 = np.array([[0.0, 0.0, height], [-0.01, -0.01, 0.0], [0.01, -0.01, 0.0], [0.0, 0.01, 0.0]])
    x1 = x0.copy()
    x1[0, 2] -= drop
    return np.repeat(x0[None], n, 0), np.repeat(x1[None], n, 0)


def _random_moves(n, rng, scale=1e-2):
    x0 = rng.uniform(-scale, scale, (n, 4, 3))
    dx = rng.uniform(-scale, scale, (n, 4, 3))
    dx[:, :1] -= 0.5 * (x0[:, :1] - x0[:, 1:].mean(1, keepdims=True))
    return x0, x0 + dx


def _min_distance_along(dist_fn, x0, x1, t, samples=201):
    "Smallest distance over samples of [0, t] per pair."
    return np.min([dist_fn(x0 + s * t[:, None, None] * (x1 - x0))[0] for s in np.linspace(0, 1, samples)], axis=0)


# ---------------------------------------------------------------- batch API

def test_batch_validation_and_no_mutation():
    x0, x1 = _vf()
    keep0, keep1 = x0.copy(), x1.copy()
    ccd.vertex_face_toi(x0, x1, 1e-5)
    np.testing.assert_array_equal(x0, keep0)
    np.testing.assert_array_equal(x1, keep1)
    with pytest.raises(ValueError, match=r"shape \(n, 4, 3\)"): ccd.vertex_face_toi(x0[:, :3], x1[:, :3])
    with pytest.raises(ValueError, match="x0 has shape"): ccd.edge_edge_toi(x0, x1[:0])
    bad = x1.copy()
    bad[0, 2, 1] = np.nan
    with pytest.raises(ValueError, match=r"x1\[0\] has a non-finite"): ccd.edge_edge_toi(x0, bad)
    with pytest.raises(ValueError, match="min_gap"): ccd.vertex_face_toi(x0, x1, -1.0)
    with pytest.raises(ValueError, match="eta"): ccd.vertex_face_toi(x0, x1, eta=1.0)
    assert ccd.vertex_face_toi(np.zeros((0, 4, 3)), np.zeros((0, 4, 3))).shape == (0,)


def test_vertex_face_analytic():
    # exact contact (distance = min_gap) at (h - min_gap) / drop; ACCD must stop before it, within a few sub-steps
    x0, x1 = _vf(1e-3, 2e-3)
    for mg in (0.0, 3e-5, 5e-4):
        t = ccd.vertex_face_toi(x0, x1, mg)[0]
        exact = (1e-3 - mg) / 2e-3
        assert 0.85 * exact < t < exact
    # sideways and receding motions keep the full step exactly
    side = x0.copy()
    side[0, 0, 0] += 5e-3
    up = x0.copy()
    up[0, 0, 2] += 5e-3
    np.testing.assert_array_equal(ccd.vertex_face_toi(np.concatenate([x0, x0]), np.concatenate([side, up])), [1.0, 1.0])
    # a rigid translation of the whole pair (l_p = 0 after centring) keeps the full step
    np.testing.assert_array_equal(ccd.vertex_face_toi(x0, x0 + [0.3, -0.2, 0.1]), [1.0])
    # starting within min_gap: 0
    assert ccd.vertex_face_toi(x0, x1, 1.1e-3)[0] == 0.0


def test_edge_edge_analytic():
    x0 = np.array([[[-0.01, 0.0, 1e-3], [0.01, 0.0, 1e-3], [0.0, -0.01, 0.0], [0.0, 0.01, 0.0]]])
    x1 = x0.copy()
    x1[0, :2, 2] -= 4e-3
    t = ccd.edge_edge_toi(x0, x1, 1e-4)[0]
    assert 0.85 * 0.225 < t < 0.225
    par = x0.copy()
    par[0, :2, 0] += 0.05  # slide along itself, far past the other edge's end
    t_par = ccd.edge_edge_toi(x0, par)[0]
    assert t_par == 1.0


@pytest.mark.parametrize("kind", ["vf", "ee"])
def test_accd_conservative_on_random_motions(kind):
    rng = np.random.default_rng(11 if kind == "vf" else 12)
    dist, fn = (vertex_face_distance, ccd.vertex_face_toi) if kind == "vf" else (edge_edge_distance, ccd.edge_edge_toi)
    x0, x1 = _random_moves(1500, rng)
    mg = 2e-4
    keep = dist(x0)[0] > mg
    x0, x1 = x0[keep], x1[keep]
    t, it = fn(x0, x1, mg, iterations=True)
    assert np.all((t >= 0) & (t <= 1)) and np.all(it >= 1)
    assert np.all(_min_distance_along(dist, x0, x1, t) > mg)
    # nearly all pairs that reach min_gap in the step are stopped before it and not far before (densely sampled contact
    # time)
    s = np.linspace(0, 1, 1001)
    d = np.stack([dist(x0 + a * (x1 - x0))[0] for a in s])
    hit = (d <= mg).any(0)
    first = s[np.argmax(d <= mg, axis=0)]
    assert hit.sum() > 100
    assert np.all(t[hit] < first[hit])
    assert np.median(t[hit] / first[hit]) > 0.85


@pytest.mark.parametrize("kind", ["vf", "ee"])
def test_accd_matches_ipctk_additive_ccd(kind):
    rng = np.random.default_rng(21 if kind == "vf" else 22)
    x0, x1 = _random_moves(400, rng)
    mg = 1e-4
    dist = vertex_face_distance if kind == "vf" else edge_edge_distance
    keep = dist(x0)[0] > 2 * mg
    x0, x1 = x0[keep], x1[keep]
    ours = (ccd.vertex_face_toi if kind == "vf" else ccd.edge_edge_toi)(x0, x1, mg)
    c = ipctk.AdditiveCCD(ccd.ACCD_MAX_ITER, ccd.ACCD_ETA)
    f = c.point_triangle_ccd if kind == "vf" else c.edge_edge_ccd
    ref = np.array([(lambda r: r[1] if r[0] else 1.0)(f(*a, *b, mg, 1.0)) for a, b in zip(x0, x1)])
    both = (ours < 1) & (ref < 1)
    np.testing.assert_allclose(ours[both], ref[both], rtol=1e-6, atol=1e-9)
    # the one designed difference: when the next proven-safe sub-step already passes t = 1 we return 1, while ipctk
    # first measures the distance beyond the step's end and may stop there; so ours is 1 and theirs close to 1
    diff = (ours < 1) != (ref < 1)
    assert np.all(ours[diff] == 1.0) and np.all(ref[diff] > 0.9) and diff.mean() < 0.05
    assert both.sum() > 50


def test_iteration_cap_returns_safe_time():
    # a vertex sliding 2 mm across a face at 1 µm: needs ~2,200 sub-steps; capped at 50 it returns the safe time so far
    x0, x1 = _vf(1e-6, 0.0)
    x1[0, 0, 0] += 2e-3
    t_full, it_full = ccd.vertex_face_toi(x0, x1, iterations=True)
    t_cap, it_cap = ccd.vertex_face_toi(x0, x1, max_iter=50, iterations=True)
    assert t_full[0] == 1.0 and it_full[0] > 1000
    assert it_cap[0] == 50 and 0 < t_cap[0] < 1
    assert _min_distance_along(vertex_face_distance, x0, x1, t_cap)[0] > 0


# ---------------------------------------------------------------- solver-facing step bound

def test_through_face_scene_seed_alpha():
    x, dx, cs = through_face_scene()
    a_n = ccd.step_bound(cs, x, dx, method="normal")
    a_a = ccd.step_bound(cs, x, dx)
    assert abs(a_n - 0.44775) < 1e-12
    assert 0 < a_a < 0.5
    with pytest.raises(ValueError, match="method"): ccd.step_bound(cs, x, dx, method="exact")


def test_step_bound_sphere_kinds():
    # SS: centres 0.1 m apart, radii 0.02 + 0.03, closing 0.1 m → touching at α = 0.5
    x = np.array([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0]])
    dx = np.array([[0.05, 0.0, 0.0], [-0.05, 0.0, 0.0]])
    cs = ContactSet.from_numpy([[0, 1, 1, 1]], [KIND_SS], [0.05], device="cpu")
    assert 0.4 < ccd.step_bound(cs, x, dx) < 0.5
    assert abs(ccd.step_bound(cs, x, dx, method="normal") - 0.45) < 1e-12
    # SF: a sphere of R = 0.02 centred 0.05 above a face, falling 0.06: contact when the centre is R + min_gap/2 above
    mg = 3e-5
    c = 0.02 + mg / 2
    x = np.array([[0.0, 0.0, 0.05], [-0.1, -0.1, 0.0], [0.1, -0.1, 0.0], [0.0, 0.1, 0.0]])
    dx = np.zeros_like(x)
    dx[0, 2] = -0.06
    cs = ContactSet.from_numpy([[0, 1, 2, 3]], [KIND_SF], [c], device="cpu")
    exact = (0.05 - c) / 0.06
    assert 0.85 * exact < ccd.step_bound(cs, x, dx) < exact
    # an empty set and a set moving apart keep the full step
    assert ccd.step_bound(ContactSet.allocate(4, device="cpu"), x, dx) == 1.0
    assert ccd.step_bound(cs, x, -dx) == 1.0 and ccd.step_bound(cs, x, -dx, method="normal") == 1.0


def test_step_bound_accepts_warp_arrays_and_validates():
    x, dx, cs = through_face_scene()
    a = ccd.step_bound(cs, wp.array(x, dtype=wp.vec3d, device="cpu"), wp.array(dx, dtype=wp.vec3d, device="cpu"))
    assert a == ccd.step_bound(cs, x, dx)
    with pytest.raises(ValueError, match="dx must hold one vec3d per particle"): ccd.step_bound(cs, x, dx[:3])
    bad = ContactSet.from_numpy([[0, 1, 2, 9]], [KIND_VT], [0.0], device="cpu")
    with pytest.raises(ValueError, match="outside 0..3"): ccd.step_bound(bad, x, dx)


@pytest.mark.parametrize("method", ccd.STEP_METHODS)
def test_step_bounds_safe_on_random_candidate_sets(method):
    rng = np.random.default_rng(5)
    x0, x1 = _random_moves(600, rng)
    n = len(x0)
    kinds = np.where(np.arange(n) % 2 == 0, KIND_VT, KIND_EE)
    sep = 1e-4
    d0 = np.where(kinds == KIND_VT, vertex_face_distance(x0)[0], edge_edge_distance(x0)[0])
    keep = d0 > sep
    x0, x1, kinds = x0[keep], x1[keep], kinds[keep]
    n = len(x0)
    cs = ContactSet.from_numpy(np.arange(4 * n).reshape(n, 4), kinds, np.full(n, sep), device="cpu")
    b = np.minimum(ccd.candidate_step_bounds(cs, x0.reshape(-1, 3), (x1 - x0).reshape(-1, 3), method=method), 1.0)
    if method == "normal": b = np.where(b <= 1.0, 0.9 * b, 1.0)
    vt, ee = kinds == KIND_VT, kinds == KIND_EE
    assert np.all(_min_distance_along(vertex_face_distance, x0[vt], x1[vt], b[vt]) > sep)
    assert np.all(_min_distance_along(edge_edge_distance, x0[ee], x1[ee], b[ee]) > sep)
    assert np.mean(b < 1) > 0.1                                          # the test moves do collide


# ---------------------------------------------------------------- FP32 recheck

def test_fp32_gap_check():
    z0 = 0.2
    x = np.array([[0.001, 0.001, z0 + 1e-8], [-0.01, -0.01, z0], [0.01, -0.01, z0], [0.0, 0.01, z0]])
    cs = ContactSet.from_numpy([[0, 1, 2, 3], [0, 1, 2, 3]], [KIND_VT, KIND_VT], [0.0, -1e-6], device="cpu")
    ok, g, lost = ccd.fp32_gap_check(cs, x)
    # 10 nm lost at 0.2 m; the −1 µm offset pair keeps 1 µm
    assert not ok and lost == 1 and g < 1e-15
    x[:, 2] -= z0
    ok, g, lost = ccd.fp32_gap_check(cs, x)
    assert ok and lost == 0 and abs(g - 1e-8) < 1e-12
    assert ccd.fp32_gap_check(ContactSet.allocate(2, device="cpu"), x) == (True, float("inf"), 0)
    g64 = ccd.fp32_gaps(cs, x)
    np.testing.assert_allclose(g64, [1e-8, 1e-8 + 1e-6], atol=1e-12)


# ---------------------------------------------------------------- sample queries (Wang et al. 2021)

def test_sample_queries_subset_no_false_negatives():
    batches = load_ccd_queries(QUERIES, limit_per_file=40)
    assert {b.kind for b in batches} == set(CCD_QUERY_KINDS) and len({b.scene for b in batches}) >= 10
    assert all(b.exact_in_fp64 for b in batches)
    rep = ccd_query_report(batches, with_ipctk=False)
    assert rep.ours_FN.sum() == 0 and rep.normal_FN.sum() == 0
    assert rep.collisions.sum() > 50


@pytest.mark.slow
def test_sample_queries_full_no_false_negatives_beside_ipctk():
    rep = ccd_query_report(load_ccd_queries(QUERIES), with_ipctk=True)
    assert rep.queries.sum() > 7000
    assert rep.ours_FN.sum() == 0 and rep.normal_FN.sum() == 0
    # same algorithm, same η: the false-positive rates agree with ipctk's within a percent point per group
    assert np.all(np.abs(rep.ours_FP_rate - rep.ipctk_FP_rate) < 0.01)


# ---------------------------------------------------------------- triangle–triangle and count_intersections

def test_count_intersections_rest_bag_and_validation():
    V, F = bag_mesh()
    st = {}
    assert len(intersecting_pairs(V, F, stats=st)) == 0 and st["undecided"] == 0
    with pytest.raises(ValueError, match="outside"): count_intersections(V, F + 1000)
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"): count_intersections(V[:, :2], F)
    # pushing one hem vertex through the opposite wall creates intersections, exactly the exact reference's
    X = V.copy()
    i = 470
    X[i] = -X[i] * [1.2, 1.2, 1.0]
    pairs = intersecting_pairs(X, F)
    assert len(pairs) > 0 and _pairs(pairs) == _pairs(reference_intersecting_pairs(X, F))
    assert all(tri_tri_intersect_exact(X[F[a]], X[F[b]]) for a, b in pairs)


# ---------------------------------------------------------------- adjacent triangles, against the exact reference

def _pairs(a):
    return sorted(map(tuple, np.asarray(a).reshape(-1, 2).tolist()))


def _both(V, F):
    "(ours, reference) verdicts of a mesh as sorted pair lists."
    return _pairs(intersecting_pairs(V, F)), _pairs(reference_intersecting_pairs(V, F))


# s = 0, P = (0, 1, 2) in z = 0; the rest are the other corners of the hand cases
HAND_V = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0],
                   [0.4, 0.3, 1], [0.3, 0.4, -1],              # 3, 4: an edge through P's interior
                   [-1, 0, 1], [0, -1, 1],                     # 5, 6: a corner touching P at s only
                   [1, 1, 0], [-1, 2, 0], [0, 2, 0], [-1, 1, 0], [-1, -1, 0],   # 7–11: coplanar corners
                   [0.5, 0.5, 0], [0.5, -0.5, 0], [0.5, 0.5, 0.5], [0.25, 0.0, 0.0]])   # 12–15


def _tilted(V):
    "The same points on the plane z = x (exact), shifted by 0.25 (exact): FP64 orientation signs are no longer certain."
    W = V.copy() + 0.25
    W[:, 2] = W[:, 0] + V[:, 2]
    return W


def _check_hand(cases):
    for V in (HAND_V, _tilted(HAND_V)):
        for name, (a, b, want) in cases.items():
            F = np.array([a, b], np.int32)
            assert pair_intersects_reference(V, a, b) == want, name
            assert count_intersections(V, F) == int(want), name
            assert count_intersections(V, F[::-1]) == int(want), name                # either order
            assert count_intersections(V, np.roll(F, 1, axis=1)) == int(want), name  # any rotation of the corners


def test_shared_vertex_crossing_one_ring():
    # crumpled sheet 144: the edge (56, 57) of face (56, 57, 49) passes through face (40, 48, 49); the two share vertex
    # 49
    V, F = crumpled_sheet(np.random.default_rng(144))
    assert sorted(set(F[70]) & set(F[85])) == [49] and {56, 57} <= set(F[85]) and sorted(F[70]) == [40, 48, 49]
    ours, ref = _both(V, F)
    assert ours == ref == [(70, 85)]
    assert count_intersections(V, F) == 1 and ipctk_has_intersections(V, F)
    _check_hand({"opposite edge through the neighbour": ([0, 1, 2], [0, 3, 4], True),
                 "touching at the shared vertex only": ([0, 1, 2], [0, 5, 6], False)})


def test_shared_edge_coplanar_fold_over():
    _check_hand({"coplanar fold-over": ([0, 1, 2], [0, 1, 12], True),
                 "fold-over onto the shared edge's inside half": ([0, 1, 2], [0, 15, 12], True),
                 "coplanar, unfolded (touching along the edge)": ([0, 1, 2], [1, 0, 13], False),
                 "bent about the edge": ([0, 1, 2], [0, 1, 14], False)})


def test_shared_vertex_coplanar_overlap():
    _check_hand({"coplanar corners overlapping": ([0, 1, 2], [0, 7, 8], True),
                 "coplanar corners along a common edge line": ([0, 1, 2], [0, 9, 10], True),
                 "coplanar corners apart": ([0, 1, 2], [0, 10, 11], False),
                 "coplanar corners touching at s": ([0, 1, 2], [0, 5, 11], False)})


def test_adjacent_pairs_that_only_touch_do_not_count():
    V, F = grid_sheet(8)
    R = np.linalg.qr(np.random.default_rng(0).standard_normal((3, 3)))[0]
    # a graph over xy: never through itself
    spiky = V.copy()
    spiky[:, 2] = 0.3 * np.random.default_rng(1).standard_normal(len(V))
    for X in (V, _tilted(V), V @ R.T, 0.2 + V @ R.T, spiky, spiky @ R.T):
        assert _both(X, F) == ([], [])
    Vb, Fb = bag_mesh()
    assert len(box_overlap_pairs(Vb, Fb)) > 4000 and reference_intersecting_pairs(Vb, Fb).size == 0
    # zero-area faces and repeated faces: nothing beyond what is shared
    V = HAND_V
    assert count_intersections(V, np.array([[0, 1, 2], [0, 1, 2], [0, 0, 3], [3, 4, 4]], np.int32)) == 0


def test_count_intersections_matches_exact_reference_1000():
    rng = np.random.default_rng(11)
    kinds = {"crumpled": np.zeros(3, int), "flat": np.zeros(3, int)}
    bad = []
    for i in range(1000):
        V, F = crumpled_sheet(rng) if i % 2 == 0 else flat_crumpled_sheet(rng, tilted=i % 4 == 3)
        ours, ref = _both(V, F)
        if ours != ref: bad.append((i, sorted(set(ref) - set(ours)), sorted(set(ours) - set(ref))))
        shared = np.array([len(set(F[a]) & set(F[b])) for a, b in ref], int)
        kinds["crumpled" if i % 2 == 0 else "flat"] += np.bincount(shared, minlength=3)[:3] > 0
    assert not bad, bad[:5]                                  # no miss, no false alarm
    print("meshes with a crossing pair that shares 0 / 1 / 2 vertices:", kinds)
    assert np.all(kinds["crumpled"][:2] >= 50) and np.all(kinds["flat"] >= 50)


def _agreement(n_meshes, seed):
    rng = np.random.default_rng(seed)
    ours, ref = [], []
    for i in range(n_meshes):
        V, F = random_soup(rng) if i % 2 else folded_sheet(rng)
        ours.append(count_intersections(V, F) > 0)
        ref.append(ipctk_has_intersections(V, F))
    return np.array(ours), np.array(ref)


def test_count_intersections_agrees_with_ipctk():
    ours, ref = _agreement(150, seed=1)
    np.testing.assert_array_equal(ours, ref)
    assert 0.2 < ref.mean() < 0.8


@pytest.mark.slow
def test_count_intersections_agrees_with_ipctk_1000():
    ours, ref = _agreement(1000, seed=2)
    np.testing.assert_array_equal(ours, ref)
    assert 0.2 < ref.mean() < 0.8


# ---------------------------------------------------------------- the bag

def test_bag_step_bound_beside_ipctk():
    model = bag_film_model()
    x, dx, F = bag_step_states(seed=0)
    search = CandidateSearch(model, dhat=1e-3, min_gap=3e-5)
    cs = search.update(wp.array(x, dtype=wp.vec3d), wp.array(x + dx, dtype=wp.vec3d))
    a = ccd.step_bound(cs, x, dx)
    a_ref = ipctk_step_bound(x, dx, F, 3e-5)
    assert 0 < a < 1 and abs(a / a_ref - 1) < 1e-3
    assert ccd.fp32_gap_check(cs, x + a * dx)[0]
    assert sum(count_intersections(x + s * a * dx, F) for s in np.linspace(0, 1, 5)) == 0
    assert count_intersections(x + dx, F) > 0                     # the full step would pass layers through each other
