"""Membrane, bending, support and tie terms (newtonipc_nb.elastic): central differences, torch
autograd references, rest state and rigid motions, PSD projections, collapsed triangles,
the hinge sign convention, the EnergyTerm slot contract and input validation."""
import math
import zlib

import numpy as np
import pytest
import torch
import warp as wp

from newtonipc_nb.elastic import (HingeTerm, MembraneTerm, hinge_angle, hinge_derivatives, membrane_derivatives,
    membrane_energy, triangle_rest_shape)
from newtonipc_nb.supports import SupportTerm, TieTerm
from newtonipc_nb.scenes.test_scenes import random_triangles
from newtonipc_nb.terms import term_derivatives
from newtonipc_nb.verification.elastic_refs import torch_agreement, torch_hinge_energy, torch_membrane_energy
from newtonipc_nb.inputs import BAG_FILM, IPCModel, dihedral_angle
from newtonipc_nb.terms import HessianBlocks
from newtonipc_nb.scenes.bag_scene import bag_scene_builder

MU, LAM = BAG_FILM.mu, BAG_FILM.lam
MODELS = ("stvk", "neohookean")


@pytest.fixture(scope="module")
def bag():
    b, _ = bag_scene_builder()
    return IPCModel.from_newton(b.finalize(device="cpu"))


def _rotation(axis, angle):
    k = np.asarray(axis, float) / np.linalg.norm(axis)
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + math.sin(angle) * K + (1 - math.cos(angle)) * K @ K


def _deformed(case, n, seed):
    """Rest triangles and a deformed copy: in-plane stretch, compression, shear, or random."""
    rng = np.random.default_rng(seed)
    X0 = rng.normal(size=(n, 3, 3)) * 0.01
    if case == "random":
        return X0, X0 + rng.normal(size=X0.shape) * 3e-3
    out = np.empty_like(X0)
    for i in range(n):
        u = X0[i, 1] - X0[i, 0]
        u /= np.linalg.norm(u)
        nr = np.cross(u, X0[i, 2] - X0[i, 0])
        nr /= np.linalg.norm(nr)
        R = np.stack([u, np.cross(nr, u), nr], 1)
        if case == "stretched": m = np.diag([*rng.uniform(1.05, 1.5, 2), 1.0])
        elif case == "compressed": m = np.diag([*rng.uniform(0.55, 0.95, 2), 1.0])
        else:
            m = np.eye(3)
            m[0, 1] = rng.uniform(0.1, 0.6)
        c = X0[i].mean(0)
        out[i] = c + (X0[i] - c) @ (R @ m @ R.T).T @ _rotation(rng.normal(size=3), rng.uniform(0, 3)).T
    return X0, out


def _fd_membrane(X, B, A, model, h=1e-7):
    """Fourth-order central differences (steps ±h, ±2h) of the energy (the gradient) and of the exact gradient (the
    Hessian), per triangle: second-order ones err by ~(h / height)² on a random sliver, 1e-6 at a height of 0.1 mm."""
    n = X.shape[0]
    flat = X.reshape(n, 9)
    gfd, Hfd = np.zeros((n, 9)), np.zeros((n, 9, 9))
    for i in range(9):
        e, g = {}, {}
        for k in (-2, -1, 1, 2):
            xk = flat.copy()
            xk[:, i] += k * h
            e[k], g[k], _ = membrane_derivatives(xk.reshape(n, 3, 3), B, A, MU, LAM, model, hessian="exact")
        gfd[:, i] = (8 * (e[1] - e[-1]) - (e[2] - e[-2])) / (12 * h)
        Hfd[:, :, i] = (8 * (g[1] - g[-1]) - (g[2] - g[-2])).reshape(n, 9) / (12 * h)
    return gfd, Hfd


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", ["random", "stretched", "compressed", "sheared"])
def test_membrane_central_differences(model, case):
    X0, X = _deformed(case, 12, seed=zlib.crc32(f"{model} {case}".encode()))   # the same triangles every run
    B, A = triangle_rest_shape(X0)
    e, g, H = membrane_derivatives(X, B, A, MU, LAM, model, hessian="exact")
    gfd, Hfd = _fd_membrane(X, B, A, model)
    g = g.reshape(-1, 9)
    grad_err = np.linalg.norm(gfd - g, axis=1) / np.linalg.norm(g, axis=1)
    hess_err = np.linalg.norm(Hfd - H, axis=(1, 2)) / np.linalg.norm(H, axis=(1, 2))
    assert grad_err.max() < 1e-8, grad_err.max()      # fourth-order differences: ≤ 7e-10 over 1,000 seeds
    assert hess_err.max() < 1e-8, hess_err.max()
    assert np.all(e > 0)


def _fd_hinge(X, th0, k, h=1e-7):
    n = X.shape[0]
    flat = X.reshape(n, 12)
    gfd = np.zeros((n, 12))
    Hfd = np.zeros((n, 12, 12))
    for i in range(12):
        xp, xm = flat.copy(), flat.copy()
        xp[:, i] += h
        xm[:, i] -= h
        ep, _, gp, _ = hinge_derivatives(xp.reshape(n, 4, 3), th0, k)
        em, _, gm, _ = hinge_derivatives(xm.reshape(n, 4, 3), th0, k)
        gfd[:, i] = (ep - em) / (2 * h)
        Hfd[:, :, i] = (gp - gm).reshape(n, 12) / (2 * h)
    return gfd, Hfd


@pytest.mark.parametrize("case", ["random", "stretched", "compressed", "sheared"])
def test_hinge_central_differences(case):
    """Gradient vs FD; FD of the gradient vs the exact Hessian from torch; GN exact at θ = θ0."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(10, 4, 3)) * 0.01
    if case != "random":   # deform the whole hinge like the membranes: it must stay a valid, differentiable hinge
        m = {
            "stretched": np.diag([1.4, 1.2, 0.9]),
            "compressed": np.diag([0.6, 0.8, 1.1]),
            "sheared": np.array([[1, 0.5, 0], [0, 1, 0.2], [0, 0, 1]])
        }[case]
        X = X @ m.T
    th0 = rng.uniform(-np.pi, np.pi, 10)
    k = rng.uniform(1e-6, 1e-4, 10)
    e, th, g, H = hinge_derivatives(X, th0, k)
    gfd, Hfd = _fd_hinge(X, th0, k)
    g = g.reshape(10, 12)
    assert (np.linalg.norm(gfd - g, axis=1) / np.linalg.norm(g, axis=1)).max() < 1e-6
    # the exact Hessian by torch autograd (independent of our ∇θ), vs FD of our gradient
    for i in range(10):
        Ht = torch.autograd.functional.hessian(
            lambda x: torch_hinge_energy(x.reshape(1, 4, 3), torch.tensor([th0[i]]), torch.tensor([k[i]])).sum(),
            torch.tensor(X[i].reshape(-1), dtype=torch.float64)).numpy()
        assert np.linalg.norm(Hfd[i] - Ht) / np.linalg.norm(Ht) < 1e-6
    # Gauss–Newton: kθ ∇θ∇θᵀ, PSD, and the exact Hessian at the rest angle
    _, _, gr, Hr = hinge_derivatives(X, th, k)
    assert np.abs(gr).max() == 0.0
    _, Hfd_r = _fd_hinge(X, th, k)
    assert (np.linalg.norm(Hfd_r - Hr, axis=(1, 2)) / np.linalg.norm(Hr, axis=(1, 2))).max() < 1e-6
    grad_theta = g / (k * np.arctan2(np.sin(th - th0), np.cos(th - th0)))[:, None]
    np.testing.assert_allclose(H, k[:, None, None] * np.einsum("ni,nj->nij", grad_theta, grad_theta), rtol=1e-9,
                               atol=1e-12 * np.abs(H).max())


@pytest.mark.parametrize("case", ["stretched", "compressed", "random"])
def test_tie_and_support_central_differences(case):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 3)) * 0.02
    pairs = np.array([[0, 1], [2, 3], [1, 4], [5, 7], [6, 0]])
    d0 = np.linalg.norm(x[pairs[:, 0]] - x[pairs[:, 1]], axis=1)
    rest = {"stretched": d0 / 1.3, "compressed": d0 / 0.7, "random": d0 * rng.uniform(0.5, 1.5, 5)}[case]
    exact = TieTerm(device="cpu", project=False)
    exact.set(pairs, rest)
    sup = SupportTerm(device="cpu")
    sup.set([0, 3, 3, 7], rng.normal(size=(4, 3)) * 0.02, rng.uniform(1, 50, 4))
    h = 1e-7
    for term in (exact, sup):
        e, g, H = term_derivatives(term, x)
        gfd = np.zeros(24)
        Hfd = np.zeros((24, 24))
        for i in range(24):
            xp, xm = x.reshape(-1).copy(), x.reshape(-1).copy()
            xp[i] += h
            xm[i] -= h
            ep, gp, _ = term_derivatives(term, xp.reshape(8, 3))
            em, gm, _ = term_derivatives(term, xm.reshape(8, 3))
            gfd[i] = (ep - em) / (2 * h)
            Hfd[:, i] = (gp - gm).reshape(-1) / (2 * h)
        assert np.linalg.norm(gfd - g.reshape(-1)) / np.linalg.norm(g) < 1e-6
        assert np.linalg.norm(Hfd - H) / np.linalg.norm(H) < 1e-6


def test_torch_agreement():
    t = torch_agreement(2000, seed=11)
    assert (t.energy_rel_diff < 1e-10).all(), t
    assert (t.gradient_rel_diff < 1e-10).all(), t


@pytest.mark.parametrize("model", MODELS)
def test_torch_membrane_large_strains(model):
    """Also far from rest: up to ±80 % strain."""
    X0, X = random_triangles(1000, seed=5, strain=0.8)
    B, A = triangle_rest_shape(X0)
    F = np.einsum("nai,naj->nij", X, B)
    keep = np.linalg.det(F.transpose(0, 2, 1) @ F) > 1e-4
    X, B, A = X[keep], B[keep], A[keep]
    e, g, _ = membrane_derivatives(X, B, A, MU, LAM, model)
    Xt = torch.tensor(X, requires_grad=True)
    et = torch_membrane_energy(Xt, torch.tensor(B), torch.tensor(A), MU, LAM, model)
    gt, = torch.autograd.grad(et.sum(), Xt)
    et, gt = et.detach().numpy(), gt.numpy()
    assert np.max(np.abs(e - et) / et) < 1e-10
    assert np.max(
        np.linalg.norm((g - gt).reshape(len(X), -1), axis=1) / np.linalg.norm(gt.reshape(len(X), -1), axis=1)) < 1e-10


@pytest.mark.parametrize("model", MODELS)
def test_projected_hessian_is_psd(model):
    """Thousands of random triangles, strains up to ±80 % (NH: areal stretch beyond e^{μ/λ} included)."""
    X0, X = random_triangles(3000, seed=9, strain=0.8)
    B, A = triangle_rest_shape(X0)
    e, _, Hp = membrane_derivatives(X, B, A, MU, LAM, model)
    _, _, H = membrane_derivatives(X, B, A, MU, LAM, model, hessian="exact")
    ok = np.isfinite(e)
    w = np.linalg.eigvalsh(Hp[ok])
    scale = np.abs(w).max(1)
    assert (w.min(1) / scale).min() > -1e-12
    w_exact = np.linalg.eigvalsh(H[ok])
    assert (w_exact.min(1) / np.abs(w_exact).max(1)).min() < -1e-2      # the projection had work to do
    # where S and M are PSD the projection changes nothing (exact Newton in tension)
    F = np.einsum("nai,naj->nij", X, B)
    C = F.transpose(0, 2, 1) @ F
    if model == "stvk":
        E = 0.5 * (C - np.eye(2))
        S = 2 * MU * E + LAM * np.trace(E, axis1=1, axis2=2)[:, None, None] * np.eye(2)
        tension = np.linalg.eigvalsh(S).min(1) > 0
    else:
        logJ = 0.5 * np.log(np.linalg.det(C))
        S = MU * np.eye(2) + (LAM * logJ - MU)[:, None, None] * np.linalg.inv(C)
        tension = (np.linalg.eigvalsh(S).min(1) > 0) & (logJ < MU / LAM)
    assert tension.sum() > 10
    # S PSD but log J > μ/λ: the material part M is indefinite and is projected (Hp ≠ H), Hp PSD
    if model == "neohookean":
        big = ok & (np.linalg.eigvalsh(S).min(1) > 0) & (logJ > MU / LAM)
        changed = np.linalg.norm(Hp[big] - H[big], axis=(1, 2)) / np.linalg.norm(H[big], axis=(1, 2))
        assert big.sum() > 50 and (changed > 1e-5).all() and np.median(changed) > 1e-2
        wpb = np.linalg.eigvalsh(Hp[big])
        assert (wpb.min(1) / np.abs(wpb).max(1)).min() > -1e-12
    np.testing.assert_allclose(Hp[tension], H[tension], rtol=0, atol=1e-9 * np.abs(H[tension]).max())


def _second_pk(X, B, model):
    "Second Piola–Kirchhoff stresses S (n, 2, 2) and log J of triangles X with rest data B (numpy, independent)."
    F = np.einsum("nai,naj->nij", X, B)
    C = F.transpose(0, 2, 1) @ F
    if model == "stvk":
        E = 0.5 * (C - np.eye(2))
        return 2 * MU * E + LAM * np.trace(E, axis1=1, axis2=2)[:, None, None] * np.eye(2), None
    logJ = 0.5 * np.log(np.linalg.det(C))
    return MU * np.eye(2) + (LAM * logJ - MU)[:, None, None] * np.linalg.inv(C), logJ


@pytest.mark.parametrize("model", MODELS)
def test_absolute_hessian(model):
    """The absolute form over thousands of random triangles: PSD; where the material tangent is positive (StVK always,
    Neo-Hookean below log J = μ/λ) it differs from the exact Hessian by exactly A0 (B (|S| − S) Bᵀ) ⊗ I3, |S| from
    numpy's eigen-decomposition; so it equals the exact Hessian in tension and not in compression."""
    X0, X = random_triangles(3000, seed=9, strain=0.8)
    B, A = triangle_rest_shape(X0)
    e, _, Ha = membrane_derivatives(X, B, A, MU, LAM, model, hessian="absolute")
    _, _, H = membrane_derivatives(X, B, A, MU, LAM, model, hessian="exact")
    ok = np.isfinite(e)
    w = np.linalg.eigvalsh(Ha[ok])
    assert (w.min(1) / np.abs(w).max(1)).min() > -1e-12
    S, logJ = _second_pk(X, B, model)
    sig, Q = np.linalg.eigh(S)
    D = np.einsum("nij,nj,nkj->nik", Q, np.abs(sig), Q) - S                   # |S| − S
    dH = A[:, None, None] * np.einsum("nai,nij,nbj->nab", B, D, B)           # (n, 3, 3) over vertex pairs
    expected = H + np.einsum("nab,ij->naibj", dH, np.eye(3)).reshape(-1, 9, 9)
    sel = ok if model == "stvk" else ok & (logJ < MU / LAM)
    assert sel.sum() > 1000
    np.testing.assert_allclose(Ha[sel], expected[sel], rtol=0, atol=1e-9 * np.abs(H[sel]).max())
    compressed = sel & (sig[:, 0] < -1e-3 * np.abs(sig).max(1))
    assert compressed.sum() > 100 and (np.abs(Ha[compressed] - H[compressed]).max(axis=(1, 2)) > 0).all()


@pytest.mark.parametrize("model", MODELS)
def test_rest_and_rigid_invariance(model):
    X0, X = random_triangles(200, seed=2)
    B, A = triangle_rest_shape(X0)
    e0, g0, H0 = membrane_derivatives(X0, B, A, MU, LAM, model)
    assert np.abs(e0).max() < 1e-15 and np.abs(g0).max() < 1e-10
    assert (np.linalg.eigvalsh(H0).min(1) / np.abs(np.linalg.eigvalsh(H0)).max(1)).min() > -1e-12
    R = _rotation([0.2, -1.0, 0.7], 2.3)
    e = membrane_energy(X, B, A, MU, LAM, model)
    np.testing.assert_allclose(membrane_energy(X @ R.T + [0.4, 0.1, -2.0], B, A, MU, LAM, model), e, rtol=1e-10)
    # a rotated rest triangle is still at rest (B from the unrotated one)
    assert np.abs(membrane_energy(X0 @ R.T, B, A, MU, LAM, model)).max() < 1e-15
    rng = np.random.default_rng(1)
    Xh = rng.normal(size=(100, 4, 3))
    th = hinge_angle(Xh)
    e, _, g, _ = hinge_derivatives(Xh, th, 1.0)
    assert np.abs(e).max() == 0 and np.abs(g).max() == 0
    np.testing.assert_allclose(hinge_angle(Xh @ R.T - 3.0), th, atol=1e-12)


def test_model_terms_on_bag(bag):
    """Term energies equal the batch functions on the bag's own rest data; rest state ≈ 0 up to FP32 rounding."""
    tri, B, A = bag.tri.numpy(), bag.tri_B.numpy(), bag.tri_area.numpy()
    rng = np.random.default_rng(4)
    x = bag.rest_q.numpy() + rng.normal(size=(bag.particle_count, 3)) * 3e-4 * (bag.fixed.numpy() == 0)[:, None]
    xw = wp.array(x, dtype=wp.vec3d, device="cpu")
    el = bag.elastic_tri.numpy()
    for model in MODELS:
        t = MembraneTerm(bag, model)
        ref = membrane_energy(x[tri[el]], B[el], A[el], bag.tri_mu.numpy()[el], bag.tri_lam.numpy()[el], model)
        np.testing.assert_allclose(t.element_energies(xw), ref, rtol=1e-13)
        # our own rest shape of the same rest triangles gives the same energies (frame-independent B)
        B2, A2 = triangle_rest_shape(bag.rest_q.numpy()[tri[el]])
        # Newton keeps tri_poses in FP32
        np.testing.assert_allclose(membrane_energy(x[tri[el]], B2, A2, MU, LAM, model), ref, rtol=1e-4)
    h = HingeTerm(bag)
    hg = bag.hinge.numpy()
    np.testing.assert_allclose(h.angles(xw), dihedral_angle(x[hg]), atol=1e-12)
    np.testing.assert_allclose(h.angles(bag.rest_q), bag.hinge_rest_angle.numpy(), atol=1e-12)
    assert h.energy(bag.rest_q) < 1e-25


def test_hinge_sign_matches_seed():
    """b lifted towards the normals by atan(1/4): −14.036° (the reference implementation's start); pushed away:
    +14.036°."""
    L, phi = 0.02, math.atan(0.25)
    flat = np.array([[-L, 0, 0], [L, 0, 0], [0, -L, 0], [0, L, 0]], float)
    up, down = flat.copy(), flat.copy()
    up[1] = [L * math.cos(phi), 0, L * math.sin(phi)]
    down[1] = [L * math.cos(phi), 0, -L * math.sin(phi)]
    deg = np.degrees(hinge_angle(np.stack([flat, up, down])))
    np.testing.assert_allclose(deg, [0.0, -14.036243467926479, 14.036243467926479], atol=1e-10)
    np.testing.assert_allclose(hinge_angle(np.stack([flat, up, down])), dihedral_angle(np.stack([flat, up, down])),
                               atol=1e-14)
    # both wings lifted by half the fold (a valley, edge lowest): same angle
    v = flat.copy()
    v[0] = [-L * math.cos(phi / 2), 0, L * math.sin(phi / 2)]
    v[1] = [L * math.cos(phi / 2), 0, L * math.sin(phi / 2)]
    np.testing.assert_allclose(np.degrees(hinge_angle(v[None])), [-14.036243467926479], atol=1e-10)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 4, 3))
    np.testing.assert_allclose(hinge_angle(X), dihedral_angle(X), atol=1e-11)


def test_collapsed_and_non_finite():
    X0, X = random_triangles(4, seed=1)
    B, A = triangle_rest_shape(X0)
    line = np.array([[0, 0, 0], [0.01, 0.005, 0], [0.02, 0.01, 0]], float)   # collinear: det C = 0 exactly
    Xc = np.stack([line, np.zeros((3, 3)), X[2], X[3]])
    e, g, H = membrane_derivatives(Xc, B, A, MU, LAM, "neohookean")
    assert np.isinf(e[:2]).all() and np.isfinite(e[2:]).all()
    assert np.isfinite(g).all() and np.isfinite(H).all() and np.abs(g[:2]).max() == 0 and np.abs(H[:2]).max() == 0
    e, g, H = membrane_derivatives(Xc, B, A, MU, LAM, "stvk")
    assert np.isfinite(e).all() and np.isfinite(g).all() and np.isfinite(H).all()
    np.testing.assert_allclose(e[1], A[1] * (MU + LAM) / 2, rtol=1e-12)
    # approaching collapse, the Neo-Hookean energy grows without bound and stays finite
    s = np.array([1e-1, 1e-3, 1e-6, 1e-9])
    Xs = np.stack([X0[0] * [1, 1, 1]] * 4)
    c = Xs.mean(1, keepdims=True)
    u = Xs[0, 1] - Xs[0, 0]
    u /= np.linalg.norm(u)
    P = np.eye(3) - np.outer(u, u)
    Xs = c + np.einsum("nij,nkj->nki", np.eye(3)[None] - (1 - s)[:, None, None] * P[None], Xs - c)
    e = membrane_energy(Xs, B[[0] * 4], A[[0] * 4], MU, LAM, "neohookean")
    assert np.all(np.isfinite(e)) and np.all(np.diff(e) > 0)
    # a term on a model: a collapsed triangle makes energy() +inf; accumulate writes no NaN and marks the slots unused
    b, _ = bag_scene_builder()
    ipc = IPCModel.from_newton(b.finalize(device="cpu"))
    x = ipc.rest_q.numpy().copy()
    t0 = ipc.tri.numpy()[ipc.elastic_tri.numpy()[5]]
    x[t0[2]] = 0.5 * (x[t0[0]] + x[t0[1]])
    xw = wp.array(x, dtype=wp.vec3d, device="cpu")
    for model, finite in (("neohookean", False), ("stvk", True)):
        term = MembraneTerm(ipc, model)
        assert np.isfinite(term.energy(xw)) == finite
        g = wp.zeros(ipc.particle_count, dtype=wp.vec3d, device="cpu")
        hb = HessianBlocks.allocate(term.num_blocks(), device="cpu")
        term.accumulate(xw, g, hb, 0)
        assert np.isfinite(g.numpy()).all() and np.isfinite(hb.vals.numpy()).all()
        assert (hb.rows.numpy()[45:54] == -1).all() != finite
    x[0] = np.nan
    assert MembraneTerm(ipc, "stvk").energy(wp.array(x, dtype=wp.vec3d, device="cpu")) == math.inf
    assert HingeTerm(ipc).energy(wp.array(x, dtype=wp.vec3d, device="cpu")) == math.inf
    sup = SupportTerm(device="cpu")
    sup.set([0], [[0, 0, 0]], 0.0)  # 0 · NaN must not leak a NaN
    assert sup.energy(wp.array(x, dtype=wp.vec3d, device="cpu")) == math.inf


def test_slot_contract_and_offsets(bag):
    """Each term writes exactly [offset, offset + num_blocks()); other slots untouched; blocks PSD when summed."""
    rng = np.random.default_rng(8)
    x = bag.rest_q.numpy() + rng.normal(size=(bag.particle_count, 3)) * 5e-4 * (bag.fixed.numpy() == 0)[:, None]
    xw = wp.array(x, dtype=wp.vec3d, device="cpu")
    sup = SupportTerm(device="cpu")
    sup.set([3, 8, 400], rng.normal(size=(3, 3)) * 0.01, 7.0)
    tie = TieTerm(device="cpu")
    tie.set([[321, 337], [330, 346]], [0.001, 0.002])
    terms = [MembraneTerm(bag, "neohookean"), MembraneTerm(bag, "stvk"), HingeTerm(bag), sup, tie]
    for t in terms:
        nb = t.num_blocks()
        off = 5
        hb = HessianBlocks.allocate(nb + 10, device="cpu")
        sentinel = np.full(nb + 10, 12345, np.int32)
        hb.rows.assign(sentinel)
        hb.cols.assign(sentinel)
        g = wp.zeros(bag.particle_count, dtype=wp.vec3d, device="cpu")
        t.accumulate(xw, g, hb, off)
        r = hb.rows.numpy()
        assert (r[:off] == 12345).all() and (r[off + nb:] == 12345).all()
        assert ((r[off:off + nb] >= 0) & (r[off:off + nb] < bag.particle_count)).all()
        with pytest.raises(ValueError, match="do not fit"):
            t.accumulate(xw, g, hb, 11)
    # the assembled support + tie Hessian is PSD
    for t in (sup, tie):
        _, _, H = term_derivatives(t, x)
        assert np.linalg.eigvalsh(H).min() > -1e-9 * np.abs(H).max()


def test_supports_and_tie_change_between_steps():
    x = wp.array(np.zeros((10, 3)), dtype=wp.vec3d, device="cpu")
    sup = SupportTerm(device="cpu")
    assert sup.num_blocks() == 0 and sup.energy(x) == 0.0
    sup.set(np.array([1, 2]), np.array([[1.0, 0, 0], [0, 2.0, 0]]), np.array([2.0, 3.0]))
    assert sup.num_blocks() == 2 and sup.energy(x) == pytest.approx(0.5 * 2 + 0.5 * 3 * 4)
    sup.set([5], [[0, 0, 1.0]], 4.0)                                # replaced, not appended
    assert sup.num_blocks() == 1 and sup.energy(x) == pytest.approx(2.0)
    sup.clear()
    assert sup.num_blocks() == 0 and sup.energy(x) == 0.0
    tie = TieTerm(device="cpu")
    xs = np.zeros((10, 3))
    xs[3] = [0.1, 0, 0]
    xw = wp.array(xs, dtype=wp.vec3d, device="cpu")
    for L in (0.08, 0.05, 0.02):                                      # shrinking rest length
        tie.set([[0, 3]], [L])
        assert tie.num_blocks() == 4 and tie.energy(xw) == pytest.approx(0.5 * 250 * (0.1 - L) ** 2)
    tie.set([[0, 3]], [0.02], stiffness=100.0)
    assert tie.energy(xw) == pytest.approx(0.5 * 100 * 0.08 ** 2)
    # coincident pair: zero gradient, block k I
    tie.set([[0, 1]], [0.01])
    e, g, H = term_derivatives(tie, np.zeros((2, 3)))
    assert e == pytest.approx(0.5 * 250 * 1e-4) and np.abs(g).max() == 0 and np.allclose(H[:3, :3], 250 * np.eye(3))
    tie.clear()
    assert tie.num_blocks() == 0


def test_validation_and_inputs_untouched():
    X0, X = random_triangles(3, seed=0)
    B, A = triangle_rest_shape(X0)
    keep = [a.copy() for a in (X, B, A)]
    membrane_derivatives(X, B, A, MU, LAM, "stvk")
    membrane_energy(X, B, A, np.full(3, MU), np.full(3, LAM))
    for a, k in zip((X, B, A), keep): np.testing.assert_array_equal(a, k)
    with pytest.raises(ValueError, match=r"X must have shape \(n, 3, 3\)"): membrane_energy(X[:, :2], B, A, MU, LAM)
    with pytest.raises(ValueError, match=r"B must have shape \(n, 3, 2\)"): membrane_energy(X, B[:, :, :1], A, MU, LAM)
    with pytest.raises(ValueError, match="same length"): membrane_energy(X, B[:2], A, MU, LAM)
    with pytest.raises(ValueError, match=r"area\[1\] must be > 0"): membrane_energy(X, B, [1.0, 0.0, 1.0], MU, LAM)
    with pytest.raises(ValueError, match=r"mu must be a scalar or have shape \(3,\)"):
        membrane_energy(X, B, A, [MU, MU], LAM)
    with pytest.raises(ValueError, match="model must be one of"): membrane_energy(X, B, A, MU, LAM, model="mooney")
    with pytest.raises(ValueError, match="numeric array"): membrane_energy("abc", B, A, MU, LAM)
    with pytest.raises(ValueError, match=r"X\[0\] has a non-finite"): hinge_angle(np.full((2, 4, 3), np.nan))
    with pytest.raises(ValueError, match=r"X must have shape \(n, 4, 3\)"): hinge_angle(np.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match="degenerate at rest"): triangle_rest_shape(np.zeros((1, 3, 3)))
    with pytest.raises(ValueError, match="model must be one of"): MembraneTerm(None, "linear")
    sup = SupportTerm(device="cpu")
    with pytest.raises(ValueError, match="must hold integers"): sup.set([0.5], [[0, 0, 0]], 1.0)
    with pytest.raises(ValueError, match="negative"): sup.set([0], [[0, 0, 0]], -1.0)
    with pytest.raises(ValueError, match=r"indices\[0\] = -1 is outside"): sup.set([-1], [[0, 0, 0]], 1.0)
    with pytest.raises(ValueError, match=r"targets\[0\] has a non-finite"): sup.set([0], [[np.nan, 0, 0]], 1.0)
    sup.set([7], [[0, 0, 0]], 1.0)
    with pytest.raises(ValueError, match="references particle 7"): sup.energy(wp.zeros(3, dtype=wp.vec3d, device="cpu"))
    with pytest.raises(ValueError, match="wp.vec3d"): sup.energy(wp.zeros(10, dtype=wp.vec3, device="cpu"))
    tie = TieTerm(device="cpu")
    with pytest.raises(ValueError, match=r"pairs must have shape \(n, 2\)"): tie.set([0, 1], [0.1])
    with pytest.raises(ValueError, match="1 entries for 2 pairs"): tie.set([[0, 1], [1, 2]], [0.1])
    with pytest.raises(ValueError, match="k must be finite"): TieTerm(device="cpu", k=-1.0)
    idx, tg = np.array([1, 2]), np.ones((2, 3))
    sup.set(idx, tg, 2.0)
    tg[:] = 5.0
    assert sup.energy(wp.array(np.ones((3, 3)), dtype=wp.vec3d, device="cpu")) == 0.0   # targets were copied


@pytest.mark.gpu
def test_cuda_matches_cpu():
    X0, X = random_triangles(500, seed=3)
    B, A = triangle_rest_shape(X0)
    for model in MODELS:
        ec, gc, Hc = membrane_derivatives(X, B, A, MU, LAM, model, device="cpu")
        eg, gg, Hg = membrane_derivatives(X, B, A, MU, LAM, model, device="cuda")
        np.testing.assert_allclose(eg, ec, rtol=1e-12)
        np.testing.assert_allclose(gg, gc, rtol=1e-10, atol=1e-12 * np.abs(gc).max())
        np.testing.assert_allclose(Hg, Hc, rtol=1e-9, atol=1e-11 * np.abs(Hc).max())
    Xh = np.random.default_rng(0).normal(size=(500, 4, 3))
    np.testing.assert_allclose(hinge_angle(Xh, device="cuda"), hinge_angle(Xh, device="cpu"), atol=1e-13)
    t = torch_agreement(500, device="cuda")
    assert (t.energy_rel_diff < 1e-10).all() and (t.gradient_rel_diff < 1e-10).all()
