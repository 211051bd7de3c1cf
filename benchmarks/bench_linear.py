"""Benchmark: the linear solvers side by side on Newton systems the bag solver really assembles.

Systems: every Newton system of one bag step, taken with the solver's `observer` — by default the first step of the
scene whose contact gap falls below 0.9 d̂ (`validation.bag_contact_systems`, ~0.1 s into the fold); with
`--resume RUN.npz --at T`, the step after time T of a saved run (e.g. 8.0 s: the neck bands tightening, the most
contacts). For each solver and system: the pattern analysis, the numeric factorisation and the solve, each the
median of --repeat calls, and the relative residual ‖A z − b‖/‖b‖ of the equilibrated system; PCG also reports its
CG iterations. When the `qdldl` package is installed (not a dependency), it is measured too as a candidate CPU
direct solver with a numeric-only refactorisation: `Solver(U)` (ordering + factorisation), `update(U)`, `solve`, on the
same upper-triangular matrix. When `cvxopt` is installed (not a dependency; its wheel bundles CHOLMOD with OpenBLAS),
CHOLMOD's supernodal Cholesky is measured the same way: `cholmod.symbolic` once, `cholmod.numeric` on the values set
into the same matrix, `cholmod.solve`. Prints a table and writes benchmarks/results/linear.json.

    python benchmarks/bench_linear.py [--resume RUN.npz --at 8.0] [--repeat 7] [--solvers pardiso cholespy dense pcg]
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp
import warp as wp

from newtonipc_nb.linear import make_linear_solver, system_from_bsr


def systems_of_saved_run(path, at):
    "Every Newton system of the bag step after time `at` of a saved run, copied off the solver's observer."
    from newtonipc_nb.scenes.bag_scene import DT
    from newtonipc_nb.scenes.bag_run import load_trajectory, run_bag, trajectory_resolution
    kept, resolution = [], trajectory_resolution(load_trajectory(path))
    run_bag(at + DT, resume=path, resume_at=at, progress=False, resolution=resolution,
            observer=lambda info: kept.append(info.system.copy()))
    return kept


def window_steps(path, t0, t1, **solver_options) -> pd.DataFrame:
    "Step statistics of the bag from `t0` to `t1` s, resumed from a saved run at its resolution, with `solver_options`."
    from newtonipc_nb.scenes.bag_run import load_trajectory, run_bag, trajectory_resolution
    traj = run_bag(t1, resume=path, resume_at=t0, progress=False,
                   resolution=trajectory_resolution(load_trajectory(path)), **solver_options)
    steps = pd.DataFrame(traj.steps)
    return steps[steps["t"] > t0 + 1e-9]


def settle_membrane_rule():
    """Make every new `MembraneHessianRule` start settled (absolute values, the exact form on trial), as a whole run at
    resolution 2 or 4 leaves it after the fold, so that a resumed window solves as that run did; returns the undo."""
    from newtonipc_nb.elastic import MembraneHessianRule as Rule
    start = Rule.__init__

    def settled(rule):
        start(rule)
        rule.form = "absolute"
    Rule.__init__ = settled
    return lambda: setattr(Rule, "__init__", start)


def median_ms(f, repeat):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))


def cholmod_rows(i, s, A, b, repeat) -> list:
    "CHOLMOD (through cvxopt, when installed) on system `s`: analysis once, numeric factorisation of its values, solve."
    try:
        import cvxopt
        from cvxopt import cholmod
    except ImportError:
        return []
    L = sp.tril(A, format="csc")
    L.sort_indices()
    cols = np.repeat(np.arange(A.shape[0]), np.diff(L.indptr))
    M = cvxopt.spmatrix(L.data, cvxopt.matrix(L.indices.astype(int)), cvxopt.matrix(cols), A.shape)
    F = cholmod.symbolic(M, uplo="L")
    analyse = median_ms(lambda: cholmod.symbolic(M, uplo="L"), repeat)

    def factorise():
        M.V = cvxopt.matrix(L.data)         # the values, in M's own (column) order
        cholmod.numeric(M, F)
    factorise_ms = median_ms(factorise, repeat)
    x = cvxopt.matrix(b)
    solve = median_ms(lambda: cholmod.solve(F, cvxopt.matrix(b)), repeat)
    cholmod.solve(F, x)
    res = float(np.linalg.norm(A @ np.asarray(x)[:, 0] - b) / np.linalg.norm(b))
    print(f"system {i} cholmod: factorise {factorise_ms:.2f} ms  solve {solve:.2f} ms  residual {res:.1e}", flush=True)
    return [dict(system=i, dofs=3 * s.n, blocks=s.nnz, solver="cholmod via cvxopt (candidate)", analyse_ms=analyse,
                 factorise_ms=factorise_ms, solve_ms=solve, per_iteration_ms=factorise_ms + solve,
                 relative_residual=res)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resume", default=None, help="a saved bag run (every step stored) to take the systems from")
    ap.add_argument("--at", type=float, default=8.0, help="with --resume: the step after this time (s)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--solvers", nargs="+", default=["pardiso", "cholespy", "dense", "pcg"])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "linear.json"))
    a = ap.parse_args()
    wp.config.quiet = True
    if a.resume:
        systems, where = systems_of_saved_run(a.resume, a.at), f"bag step after t = {a.at:.3f} s of {a.resume}"
    else:
        from newtonipc_nb.verification.runner import bag_contact_systems
        raw, gap, t = bag_contact_systems("cpu")
        systems, where = [], f"bag steps to t = {t:.4f} s (from the first contact gap {1e6 * gap:.0f} µm)"
        systems = [system_from_bsr(H, -(D * g)) for g, H, D in raw]        # (∇Φ, D H D, D) copies
    rows = []
    for i, s in enumerate(systems):
        A = sp.bsr_matrix((s.H.values.numpy()[:s.nnz], s.H.columns.numpy()[:s.nnz], s.H.offsets.numpy()),
                          shape=(3 * s.n, ) * 2).tocsr()
        b = s.rhs.numpy().reshape(-1)
        for name in a.solvers:
            solver = make_linear_solver(name)
            z = wp.zeros(s.n, dtype=wp.vec3d)
            analyse = median_ms(lambda: solver.analyse(s), a.repeat)
            factorise = median_ms(lambda: solver.factorise(s), a.repeat)
            solve = median_ms(lambda: solver.solve(s, z), a.repeat)
            res = float(np.linalg.norm(A @ z.numpy().reshape(-1) - b) / np.linalg.norm(b))
            row = dict(system=i, dofs=3 * s.n, blocks=s.nnz, solver=name, analyse_ms=analyse, factorise_ms=factorise,
                       solve_ms=solve, per_iteration_ms=factorise + solve, relative_residual=res)
            if name == "pardiso": row["nnz_L"] = int(solver._ps.iparm[17])
            if name == "pcg": row["cg_iterations"] = solver.stats["last_cg_iterations"]
            rows.append(row)
            print(f"system {i} ({3 * s.n} DOF, {s.nnz} blocks) {name:9s} analyse {analyse:8.2f} ms  factorise "
                  f"{factorise:8.2f} ms  "
                  f"solve {solve:8.2f} ms  residual {res:.1e}", flush=True)
        rows += cholmod_rows(i, s, A, b, a.repeat)
        try:
            import qdldl
        except ImportError:
            continue
        U = sp.triu(A, format="csc")
        U.sort_indices()
        q = qdldl.Solver(U)
        analyse, factorise = median_ms(lambda: qdldl.Solver(U), a.repeat), median_ms(lambda: q.update(U), a.repeat)
        solve = median_ms(lambda: q.solve(b), a.repeat)
        res = float(np.linalg.norm(A @ q.solve(b) - b) / np.linalg.norm(b))
        rows.append(
            dict(system=i, dofs=3 * s.n, blocks=s.nnz, solver="qdldl (candidate)", analyse_ms=analyse - factorise,
                 factorise_ms=factorise, solve_ms=solve, per_iteration_ms=factorise + solve, relative_residual=res))
        print(f"system {i} qdldl: factorise {factorise:.2f} ms  solve {solve:.2f} ms  residual {res:.1e}", flush=True)
    table = pd.DataFrame(rows)
    summary = table.groupby(
        "solver", sort=False)[["analyse_ms", "factorise_ms", "solve_ms", "per_iteration_ms",
                               "relative_residual"]].median()
    pd.set_option("display.width", 200)
    print(summary.to_string(float_format=lambda v: f"{v:.3g}"))
    meta = dict(benchmark="linear solvers", systems=where, count=len(systems), statistic=f"median of {a.repeat} calls "
                f"per system; table: median "
                f"over systems", warp=wp.config.version, python=platform.python_version(), machine=platform.machine(),
                cpu_count=os.cpu_count(), date=time.strftime("%Y-%m-%d"))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(
        json.dumps(dict(meta=meta, results=rows, summary=summary.reset_index().to_dict(orient="records")), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
