"""Benchmark: the bag at resolution 1 with the barrier's Gauss–Newton blocks against each contact's projected Hessian.

Runs `run_bag` twice (`barrier_hessian="gauss-newton"` and `"projected"`, everything else the scene's defaults), each
in its own process at the same time, or reads two trajectories written before (`--files GN.npz PROJECTED.npz`), and
prints per phase: steps, Newton iterations, Armijo overshoots (line-search trials beyond the first of an iteration),
subdivisions, and the milliseconds per iteration of assembly and factorisation from the steps' own timers. Wall times
of two runs sharing a machine are not comparable to an idle one: assembly over factorisation (same matrix size, same
linear solver in both) is the contention-free measure of what the projection costs per iteration. Writes
benchmarks/results/barrier_hessian.json.

    python benchmarks/bench_barrier_hessian.py [--until 10.5] [--files GN.npz PROJECTED.npz]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from newtonipc_nb.scenes.choreography import phase_at, phase_rows

MODES = ("gauss-newton", "projected")


def run(until: float, folder: Path) -> list[Path]:
    "Both runs at once, one MKL thread each; returns their trajectory files."
    env = dict(os.environ, MKL_NUM_THREADS="1", OMP_NUM_THREADS="1")
    code = ("import sys; from newtonipc_nb.scenes.bag_run import run_bag; "
            "run_bag(float(sys.argv[1]), out=sys.argv[2], progress=False, barrier_hessian=sys.argv[3])")
    files = [folder / f"bag_{m}.npz" for m in MODES]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(until), str(f), m], env=env)
             for f, m in zip(files, MODES)]
    for p in procs:
        if p.wait() != 0: raise SystemExit(f"bench_barrier_hessian: a run failed (exit {p.returncode})")
    return files


def phases(path: Path, steps: int | None = None) -> pd.DataFrame:
    "Per-phase sums of one trajectory's step statistics (its first `steps` steps)."
    d = {k: v[:steps] for k, v in np.load(path).items() if k.startswith("step_")}
    rows = phase_rows(None)
    df = pd.DataFrame(dict(phase=[phase_at(t, rows) for t in d["step_t"]], iterations=d["step_newton_iterations"],
                           overshoots=d["step_line_search_trials"] - d["step_newton_iterations"],
                           subdivisions=d["step_subdivisions"], assembly=d["step_time_assembly"],
                           factorisation=d["step_time_factorisation"]))
    g = df.groupby("phase", sort=False).agg(steps=("iterations", "size"), iterations=("iterations", "sum"),
                                             overshoots=("overshoots", "sum"), subdivisions=("subdivisions", "sum"),
                                             assembly=("assembly", "sum"), factorisation=("factorisation", "sum"))
    g.loc["whole run"] = g.sum()
    g["assembly_ms"] = 1e3 * g.assembly / g.iterations
    g["assembly_over_factorisation"] = g.assembly / g.factorisation
    return g.drop(columns=["assembly", "factorisation"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--until", type=float, default=10.5)
    ap.add_argument("--files", nargs=2, type=Path, metavar=("GN.npz", "PROJECTED.npz"))
    a = ap.parse_args()
    files = a.files or run(a.until, Path(tempfile.mkdtemp()))
    n = min(len(np.load(f)["step_t"]) for f in files)      # an unfinished run: both up to the same step
    tabs = {m: phases(f, n) for m, f in zip(MODES, files)}
    table = pd.concat(tabs, axis=1)
    pd.set_option("display.width", 250)
    print(f"steps compared: {n}")
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    out = Path(__file__).parent / "results" / "barrier_hessian.json"
    rows = {m: t.reset_index().to_dict(orient="list") for m, t in tabs.items()}
    out.write_text(json.dumps(rows, indent=1, default=float))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
