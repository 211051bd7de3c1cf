"""Benchmark: Newton-iteration variants on windows of the bag, each resumed from one saved run.

Every variant patches the solver in this process only; the committed solver is the first row. Variants:

* `friction-sticky`: friction's majorizing blocks for the rest of a step once one of its line searches cut the step
  (committed: only in the iteration right after a cut one); `friction-exact`: never the majorizer.
* `shift-keep`: after a shifted iteration, the step's next factorisation starts at that τ (committed: τ = 0, then a
  tenth of it, then ×10); `shift-tenth`: starts at a tenth of it, skipping τ = 0.
* `damped`: after a step cut below α = ½ the next iteration is shifted by at least `--damping` (Levenberg–Marquardt
  on the equilibrated matrix; four times more after each further cut), and only a full step removes the shift; such
  a damped iteration never declares convergence (its step is shorter than the Newton step the tolerance is about);
  `damped-converges` lets it.
* `barrier-exact`: each contact's unprojected Hessian from the fifth iteration on, after a full step.
* `membrane-absolute`: the membrane's absolute-value Hessian instead of its exact one in an iteration (from the
  fourth) that follows a step cut below α = ½.
* `clip`: after a step the line search cut, each particle's move in the next directions is clipped to the longest
  move that step took (times `--clip-slack`), the radius growing `--clip-grow`-fold after each full step; a clipped
  direction that is no descent direction is taken whole. (Host reads of Δx: a measurement, not a solver.)
* `trial-wait16`: refused trials of the exact membrane skip up to 16 chances before the next (committed: 4);
  `trial-near`: the exact membrane is tried only when the last Newton step is below `--near` × the tolerance;
  `trial-none`: never tried. These act only once the membrane rule has settled (`--settled`, or a long window).
* `always-absolute`, `always-exact`: the solver's `membrane_hessian` option set to that form for the whole window.
* `secant`: a memory of the step's last `--memory` cut directions v, each adding σ v vᵀ to the Newton matrix (by
  Woodbury, on PARDISO's factor: `--memory` extra solves), σ chosen so that the line search's α would have been the
  minimum of the corrected quadratic model along v: σ‖v‖² = −∇Φ·v (1/α − 1).
* `anderson`: Anderson acceleration (type II, the last `--memory` differences) of the iterates with the Newton step as
  their residual; its direction replaces the Newton step where it is a descent direction.
  Both judge convergence on the Newton step itself, as committed. (Host reads: a measurement, not a solver.)
* `hinge-exact`: each hinge's full Hessian (the curvature of the angle itself, kθ wrap(θ − θ0) ∇²θ, included; torch
  autograd on the host), projected to PSD per hinge, in place of the Gauss–Newton kθ ∇θ∇θᵀ.
* `halve`: a step that follows one of more than `--halve-after` Newton iterations is taken as two steps of dt/2 from
  the start: its first attempt fails at once, and the solver's own subdivision halves it.
* `predict`: each step starts from x0 + dt (v0 + c (v0 − v_prev)) (c: `--predict`), the velocity extrapolated
  linearly from the last two steps, in place of the constant-velocity guess x0 + dt v0 (the same CCD and halving).
* `shift-oracle`: a refused matrix is shifted by τ = c·(−λmin(D H D)) (c: `--oracle`), its smallest eigenvalue from a
  dense eigen-solve, doubled while still refused, in place of the τ ladder: what a just-sufficient shift would do to
  the iterations. Above `DENSE_MAX` unknowns (resolution 4) −λmin is bracketed by factorisations instead: the
  smallest accepted τ, found to within a factor 1.25 by bisection on log τ. (A dense eigen-solve or a dozen
  factorisations per shifted iteration: a measurement, not a solver; the bisection's refusals are counted.)
  `exact-oracle`: the same shift with the membrane's exact form throughout (`always-exact`'s option), where a settled
  rule's absolute values leave few matrices to shift.

`--settled` starts the membrane rule settled (absolute values, the exact form on trial), as a whole run at resolution
2 or 4 leaves it after the fold; without it a resumed window starts the rule afresh (exact), as resolution 1 stays.

Prints Newton iterations per window, the refused (indefinite) factorisations of all windows (refused trials
included) and the exact membrane's trials (refused ones), and writes
benchmarks/results/newton_variants.json (or `--out`).

    python benchmarks/bench_newton_variants.py RUN.npz [--windows 2.0 2.3 5.4 5.8 ...]
        [--variants committed friction-sticky ...] [--damping 0.3] [--settled] [--near 3] [--memory 4] [--oracle 1.1]
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.linalg
import scipy.sparse as sp
import torch

import newtonipc_nb.elastic as elastic_mod
import newtonipc_nb.linear as linear_mod
import newtonipc_nb.solver as solver_mod
from bench_linear import settle_membrane_rule, window_steps

WINDOWS = (2.0, 2.3, 5.4, 5.8, 6.2, 6.6, 8.0, 8.4, 9.38, 9.6)
COUNTS = dict(refused=0, trials=0, refused_trials=0, clipped=0, steered=0)     # under the current variant
VARIANTS = ("committed", "friction-sticky", "friction-exact", "shift-keep", "shift-tenth", "damped",
            "damped-converges", "barrier-exact", "membrane-absolute", "clip", "trial-wait16", "trial-near",
            "trial-none", "always-absolute", "always-exact", "secant", "anderson", "hinge-exact",
            "halve", "predict", "shift-oracle", "exact-oracle")
OPTIONS = {"always-absolute": dict(membrane_hessian="absolute"), "always-exact": dict(membrane_hessian="exact"),
           "exact-oracle": dict(membrane_hessian="exact")}


def patched(variant: str, a):
    """Install `variant` into the solver module; returns a function that restores it. The step's state (a cut seen, the
    last τ, the damping, the clip radius) lives on the solver, reset at each step's first iteration."""
    S, factorise_shifted = solver_mod.SolverIPC, linear_mod.factorise_shifted
    iteration, direction, unscale = S._iteration, S._direction, linear_mod.NewtonSystem.unscale
    Rule = elastic_mod.MembraneHessianRule
    trial, tried, wait_max = Rule.trial, Rule.tried, elastic_mod.TRIAL_WAIT_MAX

    def shifted(linear, system, last=0.0, shift=True):
        s, refused = shifted.solver, linear.stats["indefinite"]
        start = {"shift-keep": s._last_tau, "shift-tenth": s._last_tau / 10, "damped": s._damp,
                 "damped-converges": s._damp}.get(variant, 0.0)
        try:
            if variant in ("shift-oracle", "exact-oracle") and shift: tau = oracle_shift(linear, system, a.oracle)
            elif not (shift and start > 0): tau = factorise_shifted(linear, system, last, shift)
            else: tau = climb(linear, system, start, 10)
        finally:                                    # a refused trial raises: counted too
            COUNTS["refused"] += linear.stats["indefinite"] - refused
        s._last_tau = tau
        return tau

    def new_iteration(s, x, phi, k, dt, st):
        if k == 0: s._cut, s._cut_half, s._last_tau, s._damp, s._clip = False, False, 0.0, 0.0, np.inf
        if k == 0: s._memory, s._history = [], ([], [])
        shifted.solver, s._k, s._longest, tolerance = s, k, None, s.options["tolerance"]
        if variant == "damped" and s._damp > 0: s.options["tolerance"] = 0.0
        try:
            alpha, phi_t, done = iteration(s, x, phi, k, dt, st)
        finally:
            s.options["tolerance"] = tolerance
        s._cut, s._cut_half = s._cut or not s._full, 0 < alpha < 0.5
        if variant.startswith("damped"):
            s._damp = max(4 * s._damp, a.damping) if 0 < alpha < 0.5 else (0.0 if alpha == 1.0 else s._damp)
        if variant == "clip" and s._longest is not None and alpha > 0:
            s._clip = a.clip_slack * alpha * s._longest if alpha < 1 else a.clip_grow * s._clip
        if variant == "secant" and 0 < alpha < 1 and not done and s._slope < 0:
            d = s._dx.numpy().reshape(-1)
            s._memory = [*s._memory, (d / np.linalg.norm(d), -s._slope * (1 / alpha - 1) / (d @ d))][-a.memory:]
        return alpha, phi_t, done

    def secant_step(s, system, z, D):
        "z corrected for the memory's σ v vᵀ terms, on the equilibrated system (Woodbury)."
        if not s._memory: return None
        U = np.stack([D * v for v, _ in s._memory], 1)
        W = np.stack([s.linear._run(33, np.ascontiguousarray(u)).copy() for u in U.T], 1)
        small = np.diag([1 / sigma for _, sigma in s._memory]) + U.T @ W
        return D * (z - W @ np.linalg.solve(small, U.T @ z))

    def anderson_step(s, x, f):
        "The Anderson-mixed step from the last iterates x and their Newton steps f."
        X, F = s._history
        X.append(x)
        F.append(f)
        del X[:-(a.memory + 1)], F[:-(a.memory + 1)]
        if len(X) < 2: return None
        dX, dF = np.diff(np.stack(X, 1), axis=1), np.diff(np.stack(F, 1), axis=1)
        A = dF.T @ dF
        ridge = (1e-10 * np.trace(A) + 1e-300) * np.eye(len(A))       # (1e-300: all differences zero)
        gamma = np.linalg.solve(A + ridge, dF.T @ f)
        return f - (dX + dF) @ gamma

    def steered(system, z, dx, k=1.0):
        "`secant`, `anderson`: the Newton step D z replaced by the variant's direction before it is unscaled."
        s = getattr(shifted, "solver", None)
        if variant in ("secant", "anderson") and s is not None and system is s.system:
            D, zz = system.D.numpy().reshape(-1), z.numpy().reshape(-1).copy()
            s._raw = float(np.abs(k * D * zz).max())          # the Newton step, for convergence
            d = (secant_step(s, system, zz, D) if variant == "secant"
                 else anderson_step(s, s._x.numpy().reshape(-1).copy(), D * zz))
            if d is not None and system.grad.numpy().reshape(-1) @ d < 0:
                COUNTS["steered"] += 1
                z.assign((d / D).reshape(-1, 3))          # the line search's extension k still applies
        return unscale(system, z, dx, k)

    def clipped(s, x, out):
        "The direction with each particle's move clipped to the radius, when that is still a descent direction."
        slope, max_dx, longest, shortening = out
        r = s._clip
        if not (np.isfinite(r) and longest > r) or max_dx / s._ls.extend < s.options["tolerance"]: return out
        dx = s._dx.numpy()
        dx = dx * np.minimum(1.0, r / np.maximum(np.linalg.norm(dx, axis=1), 1e-300))[:, None]
        slope = float((s.system.grad.numpy() * dx).sum())
        if not slope < 0: return out
        COUNTS["clipped"] += 1
        s._dx.assign(dx)
        s._xt.assign(x.numpy() + dx)
        s._outside, s._ls.first = None, None        # the candidates and first trials cover the old direction
        return slope, max_dx, r, min(shortening, 1.0 - 1e-9)    # not the whole Newton step: no extension follows

    def new_direction(s, x, st):
        if variant == "friction-sticky" and s._cut: s.friction.hessian = "majorizer"
        if variant == "friction-exact": s.friction.hessian = "exact"
        if variant == "barrier-exact" and s._k >= 4 and s._full: s.barrier.hessian = "exact"
        if variant == "membrane-absolute" and s._cut_half and s.membrane.hessian == "exact":
            s.membrane.hessian = "absolute"
        s._raw = None
        out = direction(s, x, st)
        if s._raw is not None: out = (out[0], s._raw, *out[2:])
        if variant == "clip": out = clipped(s, x, out)
        s._slope = out[0]
        s._longest, s._newton_dx = out[2], out[1] / s._ls.extend
        return out

    def counted_tried(rule, refused):
        COUNTS["trials"] += 1
        COUNTS["refused_trials"] += bool(refused)
        return tried(rule, refused)

    def near_trial(rule):
        s = shifted.solver
        return s._newton_dx < a.near * s.options["tolerance"] and trial(rule)

    S._iteration, S._direction, solver_mod.factorise_shifted = new_iteration, new_direction, shifted
    linear_mod.NewtonSystem.unscale = steered
    Rule.tried = counted_tried
    unsettle = settle_membrane_rule() if a.settled else (lambda: None)
    if variant == "trial-wait16": elastic_mod.TRIAL_WAIT_MAX = 16
    if variant == "trial-near": Rule.trial = near_trial
    if variant == "trial-none": Rule.trial = lambda rule: False
    H, accumulate = elastic_mod.HingeTerm, elastic_mod.HingeTerm.accumulate
    if variant == "hinge-exact": H.accumulate = lambda t, x, g, b, o: exact_hinge(accumulate, t, x, g, b, o)
    step, solve = S.step, S._solve

    def stepped(s, *args):
        step(s, *args)
        s._last_iterations = s.last_stats.newton_iterations

    def halved(s, xs, xe, v0, f, dt, st, checked=False):
        "`halve`: a step's first attempt after a hard step fails at once, so that the solver's subdivision halves it."
        if not st.failures and getattr(s, "_last_iterations", 0) > a.halve_after:
            raise solver_mod.StepFailure(f"the last step took more than {a.halve_after} Newton iterations")
        return solve(s, xs, xe, v0, f, dt, st, checked)
    if variant == "halve": S.step, S._solve = stepped, halved
    extrapolate = S._extrapolate

    def predicted(s, v0, dt, st, tries=4):
        "`predict`: the step's guess from v0 + c (v0 − v_prev), the velocity extrapolated from the last two steps."
        last, s._v_last = getattr(s, "_v_last", None), (v0.copy(), dt)
        if last is not None and last[1] == dt: v0 = v0 + a.predict * (v0 - last[0])
        return extrapolate(s, v0, dt, st, tries)
    if variant == "predict": S._extrapolate = predicted

    def restore():
        S._iteration, S._direction, solver_mod.factorise_shifted = iteration, direction, factorise_shifted
        linear_mod.NewtonSystem.unscale = unscale
        Rule.trial, Rule.tried, elastic_mod.TRIAL_WAIT_MAX = trial, tried, wait_max
        H.accumulate, S.step, S._solve, S._extrapolate = accumulate, step, solve, extrapolate
        unsettle()
    return restore


DENSE_MAX = 6000        # unknowns up to which `shift-oracle` finds λmin by a dense eigen-solve


def accepted(linear, system, tau) -> bool:
    "Whether the system shifted by τ I factorises (a refusal is counted)."
    system.shift(tau)
    try:
        linear.prepare(system)
        return True
    except linear_mod.NotPositiveDefinite:
        linear.stats["indefinite"] += 1
        return False


def smallest_accepted(linear, system, ratio=1.25) -> float:
    "The smallest τ, to within `ratio`, whose shifted factorisation is accepted (−λmin of the equilibrated matrix)."
    lo, hi = 0.0, linear_mod.SHIFT_MIN
    while not accepted(linear, system, hi):
        if hi >= linear_mod.SHIFT_MAX: raise linear_mod.NotPositiveDefinite("shift-oracle: past SHIFT_MAX")
        lo, hi = hi, 10 * hi
    while lo > 0 and hi > ratio * lo:       # lo = 0: SHIFT_MIN suffices, the floor the dense oracle keeps too
        mid = float(np.sqrt(lo * hi))
        lo, hi = (lo, mid) if accepted(linear, system, mid) else (mid, hi)
    return hi


def oracle_shift(linear, system, c):
    """`shift-oracle`: τ = 0; refused, τ = c·(−λmin) of the equilibrated matrix (a dense eigen-solve, or above
    `DENSE_MAX` unknowns the smallest accepted shift), ×2 while refused."""
    if accepted(linear, system, 0.0): return 0.0
    if 3 * system.n > DENSE_MAX: return climb(linear, system, c * smallest_accepted(linear, system), 2)
    csr = getattr(linear, "csr", None)              # PARDISO's upper triangle, refreshed by the refused factorisation
    if csr is None: raise SystemExit(f"shift-oracle reads PARDISO's matrix; this run's linear solver is {linear.name}")
    U = sp.csr_matrix((csr.data.numpy(), csr.indices, csr.indptr), shape=csr.shape)
    lam = scipy.linalg.eigh((U + U.T - sp.diags(U.diagonal())).toarray(), eigvals_only=True, subset_by_index=[0, 0])
    return climb(linear, system, max(linear_mod.SHIFT_MIN, -c * float(lam[0])), 2)


def climb(linear, system, tau, factor):
    "Factorise the system shifted by τ I, τ × `factor` at each refusal (past SHIFT_MAX the refusal is raised)."
    while not accepted(linear, system, tau):
        if tau >= linear_mod.SHIFT_MAX: raise linear_mod.NotPositiveDefinite(f"refused up to τ = {tau:g}")
        tau *= factor
    linear.stats["shifted"] += 1
    return tau


def hinge_energy(X, theta0, k):
    "½ k wrap(θ − θ0)² of one hinge X (12,) in (a, b, c, d) order, the package's signed dihedral angle (torch)."
    a, b, c, d = X.reshape(4, 3)
    e = d - c
    n1, n2 = torch.linalg.cross(c - a, d - a), torch.linalg.cross(d - b, c - b)
    n1, n2 = n1 / n1.norm(), n2 / n2.norm()
    theta = torch.atan2(torch.linalg.cross(n1, n2) @ (e / e.norm()), n1 @ n2)
    w = torch.atan2(torch.sin(theta - theta0), torch.cos(theta - theta0))
    return 0.5 * k * w * w


def exact_hinge(accumulate, term, x, grad, blocks, offset):
    """`hinge-exact`: each hinge's full Hessian (the angle's own curvature included, by torch autograd on the host),
    projected to PSD by clamping its eigenvalues, in place of kθ ∇θ∇θᵀ. (Host reads: a measurement, not a solver.)"""
    accumulate(term, x, grad, blocks, offset)
    if not term.count: return
    hinge = term.hinge.numpy()
    X = torch.from_numpy(x.numpy()[hinge].reshape(-1, 12))
    Hs = torch.func.vmap(torch.func.hessian(hinge_energy))(X, torch.from_numpy(term.theta0.numpy()),
                                                         torch.from_numpy(term.k.numpy()))
    lam, V = torch.linalg.eigh(torch.nan_to_num(Hs))
    Hs = (V * lam.clamp(min=0)[:, None, :]) @ V.transpose(1, 2)
    n = term.count
    Hs = Hs.reshape(n, 4, 3, 4, 3).permute(0, 1, 3, 2, 4)          # block (i, j) of hinge h at slot 16 h + 4 i + j
    blocks.vals.numpy()[offset:offset + 16 * n] = Hs.reshape(-1, 3, 3).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a saved bag run (every step stored)")
    ap.add_argument("--windows", type=float, nargs="+", default=list(WINDOWS), help="pairs T0 T1 (s)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--damping", type=float, default=0.3, help="`damped`: the shift after a cut step")
    ap.add_argument("--clip-slack", type=float, default=1.0, help="`clip`: the radius over the cut step's move")
    ap.add_argument("--clip-grow", type=float, default=2.0, help="`clip`: the radius's growth after a full step")
    ap.add_argument("--near", type=float, default=3.0, help="`trial-near`: the Newton step, in tolerances")
    ap.add_argument("--memory", type=int, default=4, help="`secant`, `anderson`: directions or differences kept")
    ap.add_argument("--halve-after", type=int, default=12, help="`halve`: a step's iterations that halve the next")
    ap.add_argument("--predict", type=float, default=1.0, help="`predict`: c in v0 + c (v0 − v_prev)")
    ap.add_argument("--oracle", type=float, default=1.1, help="`shift-oracle`: c in τ = c·(−λmin)")
    ap.add_argument("--settled", action="store_true", help="the membrane rule starts settled on absolute values")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "newton_variants.json")
    a = ap.parse_args()
    if len(a.windows) % 2: ap.error("--windows takes pairs T0 T1")
    windows = list(zip(a.windows[::2], a.windows[1::2]))
    rows = []
    for variant in a.variants:
        restore, wall = patched(variant, a), time.perf_counter()
        COUNTS.update(dict.fromkeys(COUNTS, 0))
        try:
            counts = [int(window_steps(a.run, t0, t1, **OPTIONS.get(variant, {}))["newton_iterations"].sum())
                      for t0, t1 in windows]
        finally:
            restore()
        rows.append(dict(variant=variant, **{f"{t0:g}–{t1:g}": n for (t0, t1), n in zip(windows, counts)},
                         total=sum(counts), **COUNTS, wall_s=round(time.perf_counter() - wall, 1)))
        print(rows[-1], flush=True)
    pd.set_option("display.width", 200)
    print(pd.DataFrame(rows).to_string(index=False))
    a.out.write_text(json.dumps(dict(run=a.run, settled=a.settled, damping=a.damping, clip_slack=a.clip_slack,
                                     clip_grow=a.clip_grow, near=a.near, memory=a.memory, halve_after=a.halve_after,
                                     predict=a.predict,
                                     rows=rows), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
