"""Diagnostic: which term's Newton model misses curvature. Runs a window of the resolution-1 bag resumed from a saved
run and, at every Newton iteration from `--from-iteration` on, compares each term's modelled curvature along the
direction, Δxᵀ H_t Δx, with its true one, Δxᵀ (∇Φ_t(x + εΔx) − ∇Φ_t(x − εΔx)) / 2ε (dense, for 481 vertices only).
Prints one line per probed iteration and writes benchmarks/results/curvature_probe.json (per term: model, true).

    python benchmarks/bench_curvature_probe.py SAVED.npz --at 2.0 --until 2.03 [--from-iteration 5]
        [--membrane-hessian projected]
"""
import argparse
import json
from pathlib import Path

import numpy as np
import warp as wp

import newtonipc_nb.solver as solver_mod
from newtonipc_nb.scenes.bag_run import run_bag
from newtonipc_nb.terms import term_derivatives

TERMS = ("inertia", "membrane", "bending", "barrier", "friction", "supports", "tie", "_drag")


def gradient(term, x: np.ndarray):
    "Gradient and dense Hessian of `term` at x (its active set prepared there)."
    term.prepare(wp.array(x, dtype=wp.vec3d, device="cpu"))
    _, g, H = term_derivatives(term, x)
    return g.ravel(), H


def probe(solver, x: np.ndarray, dx: np.ndarray, eps: float = 1e-3) -> dict:
    "Per term: (modelled, true) curvature along dx at x."
    out, d = {}, dx.ravel()
    for name in TERMS:
        term = getattr(solver, name)
        _, H = gradient(term, x)
        gp, _ = gradient(term, x + eps * dx)
        gm, _ = gradient(term, x - eps * dx)
        out[name] = (float(d @ H @ d), float(d @ (gp - gm) / (2 * eps)))
    solver._restrict(solver._near)          # the probe prepared the terms elsewhere: the solver's own set again
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("saved")
    ap.add_argument("--at", type=float, required=True)
    ap.add_argument("--until", type=float, required=True)
    ap.add_argument("--from-iteration", type=int, default=5)
    ap.add_argument("--membrane-hessian", default="projected")
    a = ap.parse_args()
    rows, iteration = [], solver_mod.SolverIPC._iteration

    def probed(self, x, phi, it, dt, st):
        r = iteration(self, x, phi, it, dt, st)
        if it >= a.from_iteration:
            terms = probe(self, x.numpy(), self._dx.numpy())
            model, true = (sum(v[k] for v in terms.values()) for k in (0, 1))
            rows.append(dict(iteration=it, max_dx=float(np.abs(self._dx.numpy()).max()), alpha=r[0], terms=terms))
            big = {k: m / t if t else float("inf") for k, (m, t) in terms.items() if abs(m) > 1e-3 * model}
            print(f"it {it:3d} |dx| {rows[-1]['max_dx']:.2e} alpha {r[0]:.3g} true/model {true / model:.3f}  " +
                  " ".join(f"{k} {v:.2f}" for k, v in big.items()))
        return r
    solver_mod.SolverIPC._iteration = probed
    run_bag(a.until, resume=a.saved, resume_at=a.at, progress=False, membrane_hessian=a.membrane_hessian)
    out = Path(__file__).parent / "results" / "curvature_probe.json"
    out.write_text(json.dumps(dict(window=[a.at, a.until], membrane_hessian=a.membrane_hessian, iterations=rows),
                              indent=1))
    print(f"wrote {out} ({len(rows)} iterations; per term the ratio printed is modelled / true curvature)")


if __name__ == "__main__":
    main()
