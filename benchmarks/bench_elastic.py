"""Benchmark: energy + gradient + Hessian blocks of the elastic terms over the 481-vertex bag.

Times `energy(x)` and `accumulate(x, grad, blocks, 0)` of each term (StVK membrane, Neo-Hookean
membrane, hinge bending) on a randomly perturbed bag, median over repeats after a warm-up (the
kernel compilation is excluded). Prints a table and writes benchmarks/results/elastic.json.

    python benchmarks/bench_elastic.py [--device cpu] [--repeats 200]
"""
import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import warp as wp

from newtonipc_nb.elastic import HingeTerm, MembraneTerm
from newtonipc_nb.terms import HessianBlocks
from newtonipc_nb.inputs import IPCModel
from newtonipc_nb.scenes.bag_scene import bag_scene_builder


def _median_ms(fn, repeats, device):
    fn()
    wp.synchronize_device(device)  # warm-up (compilation, allocation)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        wp.synchronize_device(device)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times), 1e3 * min(times)


def run(device="cpu", repeats=200, seed=0):
    wp.config.quiet = True
    wp.init()
    builder, _ = bag_scene_builder()
    ipc = IPCModel.from_newton(builder.finalize(device=device))
    rng = np.random.default_rng(seed)
    free = (ipc.fixed.numpy() == 0)[:, None]
    x = wp.array(ipc.rest_q.numpy() + rng.normal(size=(ipc.particle_count, 3)) * 3e-4 * free, dtype=wp.vec3d,
                 device=device)
    grad = wp.zeros(ipc.particle_count, dtype=wp.vec3d, device=device)
    rows = []
    for name, term in (("membrane stvk", MembraneTerm(ipc, "stvk")),
                       ("membrane neohookean", MembraneTerm(ipc, "neohookean")), ("hinge bending", HingeTerm(ipc))):
        blocks = HessianBlocks.allocate(term.num_blocks(), device=device)
        def acc(): term.accumulate(x, grad, blocks, 0)

        def both():
            term.energy(x)
            term.accumulate(x, grad, blocks, 0)
        e_med, e_min = _median_ms(lambda: term.energy(x), repeats, device)
        a_med, a_min = _median_ms(acc, repeats, device)
        b_med, b_min = _median_ms(both, repeats, device)
        rows.append(dict(term=name, elements=term.count, blocks=term.num_blocks(), energy_ms=e_med, accumulate_ms=a_med,
                         energy_plus_accumulate_ms=b_med, energy_plus_accumulate_min_ms=b_min))
    table = pd.DataFrame(rows)
    total = float(table.energy_plus_accumulate_ms.sum())
    meta = dict(benchmark="elastic", scene="481-vertex bag (928 film triangles, 1,376 interior hinges), 0.3 mm "
                "random perturbation", device=device, repeats=repeats,
                statistic="median wall time per call (ms), after one warm-up call", warp=wp.config.version,
                numpy=np.__version__, python=platform.python_version(), machine=platform.machine(),
                cpu_count=os.cpu_count(), date=time.strftime("%Y-%m-%d"))
    return table, total, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "elastic.json"))
    a = ap.parse_args()
    table, total, meta = run(a.device, a.repeats)
    pd.set_option("display.width", 200)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"all three terms, energy + gradient + Hessian blocks: {total:.3f} ms (median sum)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(
        json.dumps(dict(meta=meta, total_energy_plus_accumulate_ms=total, rows=table.to_dict(
            orient="records")), indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
