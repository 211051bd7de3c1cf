"""CCD benchmark: (1) the Wang et al. 2021 sample queries, our additive CCD vs ipctk's AdditiveCCD (false negatives,
false-positive rate, µs per query) in one run; (2) the step bound on folded states of the 481-vertex bag, ours
(CandidateSearch + step_bound, accd and normal) vs ipctk compute_collision_free_stepsize with AdditiveCCD on the same
states; (3) count_intersections on the bag. Prints tables, writes benchmarks/results/ccd.json.

Usage: python benchmarks/bench_ccd.py [--quick]
"""
import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
import warp as wp

from newtonipc_nb import ccd
from newtonipc_nb.candidates import CandidateSearch
from newtonipc_nb.scenes.test_scenes import bag_film_model, flattened_bag
from newtonipc_nb.scenes.bag_scene import bag_mesh

OUT = Path(__file__).resolve().parent / "results" / "ccd.json"


def _best(f, repeat):
    "Smallest wall time of `repeat` calls of f, and its last result."
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        r = f()
        ts.append(time.perf_counter() - t)
    return min(ts), r


def sample_queries(limit=None):
    batches = ccd.load_ccd_queries(limit_per_file=limit)
    rep = ccd.ccd_query_report(batches, with_ipctk=True)
    tot = rep[["queries", "collisions", "ours_FN", "normal_FN", "ipctk_FN"]].sum()
    neg = tot.queries - tot.collisions
    fp = lambda col: float((rep[col] * (rep.queries - rep.collisions)).sum() / neg)
    us = lambda col: float((rep[col] * rep.queries).sum() / tot.queries)
    total = dict(queries=int(tot.queries), collisions=int(tot.collisions), ours_FN=int(tot.ours_FN),
                 normal_FN=int(tot.normal_FN), ipctk_FN=int(tot.ipctk_FN), ours_FP_rate=fp("ours_FP_rate"),
                 normal_FP_rate=fp("normal_FP_rate"), ipctk_FP_rate=fp("ipctk_FP_rate"),
                 ours_us_per_query=us("ours_us_per_query"), ipctk_us_per_query=us("ipctk_us_per_query"))
    return rep, total


def bag_states():
    V, F = bag_mesh()
    rng = np.random.default_rng(0)
    out = []
    for seed, push in ((0, 1.2e-3), (1, 3e-4), (2, 1e-4)):
        x, dx, _ = ccd.bag_step_states(seed=seed, push=push, noise=push / 6)
        out.append((f"folded, push {push * 1e3:.1f} mm", x, dx))
    x, _, _ = ccd.bag_step_states(seed=3, fold_ring=6)
    out.append(("folded at ring 6, random 0.3 mm", x, 3e-4 * rng.standard_normal(x.shape)))
    X = flattened_bag(V)
    dx = np.zeros_like(X)
    dx[:, 1] = -2e-3 * np.sign(X[:, 1])
    out.append(("flattened, layers squeezed 2 mm", X, dx))
    return out, F


def bag_step_bounds(repeat=3):
    model = bag_film_model()
    states, F = bag_states()
    rows = []
    for name, x, dx in states:
        search = CandidateSearch(model, dhat=1e-3, min_gap=3e-5)
        xs, xe = wp.array(x, dtype=wp.vec3d), wp.array(x + dx, dtype=wp.vec3d)
        t_cand, cs = _best(lambda: search.update(xs, xe, force=True), repeat)
        ccd.step_bound(cs, x, dx)                                            # warm
        t_accd, a = _best(lambda: ccd.step_bound(cs, xs, wp.array(dx, dtype=wp.vec3d)), repeat)
        t_norm, an = _best(lambda: ccd.step_bound(cs, xs, wp.array(dx, dtype=wp.vec3d), method="normal"), repeat)
        t_ip, ai = _best(lambda: ccd.ipctk_step_bound(x, dx, F, 3e-5), repeat)
        ok = ccd.fp32_gap_check(cs, x + a * dx)[0]
        inter = int(sum(ccd.count_intersections(x + s * a * dx, F) for s in np.linspace(0, 1, 5)))
        rows.append(
            dict(state=name, candidates=cs.count, accd=a, normal=an, ipctk_accd=ai,
                 ratio_accd_to_ipctk=a / ai if ai > 0 else np.nan, ratio_normal_to_ipctk=an / ai if ai > 0 else np.nan,
                 fp32_ok_at_accd=ok, intersections_on_path=inter, candidates_ms=1e3 * t_cand, accd_ms=1e3 * t_accd,
                 normal_ms=1e3 * t_norm, ipctk_ms=1e3 * t_ip, ours_total_ms=1e3 * (t_cand + t_accd),
                 full_step_intersections=ccd.count_intersections(x + dx, F)))
    return pd.DataFrame(rows)


def intersections(repeat=3):
    V, F = bag_mesh()
    X = V.copy()
    X[470] = -X[470] * [1.2, 1.2, 1.0]
    rows = []
    for name, x in (("rest bag", V), ("bag, one hem vertex pushed through the wall", X), ("flattened bag",
                                                                                          flattened_bag(V))):
        ccd.count_intersections(x, F)
        t, n = _best(lambda: ccd.count_intersections(x, F), repeat)
        ti, hi = _best(lambda: ccd.ipctk_has_intersections(x, F), repeat)
        rows.append(dict(mesh=name, pairs=n, ours_ms=1e3 * t, ipctk_has_intersections=hi, ipctk_ms=1e3 * ti))
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 queries per file and one repeat")
    args = ap.parse_args()
    wp.config.quiet = True
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    res = dict(machine=dict(platform=platform.platform(), processor=platform.processor(), device=str(wp.get_device())),
               quick=args.quick)
    if ccd.ccd_queries_dir() is not None:
        rep, total = sample_queries(60 if args.quick else None)
        print("== CCD sample queries (Wang et al. 2021), min_gap = 0, η = 0.9")
        print(rep.round(4).to_string(index=False))
        print("total:", json.dumps(total, indent=None))
        res["sample_queries"] = dict(per_group=rep.to_dict(orient="records"), total=total)
    else:
        print("CCD sample queries not found: skipped")
    bag = bag_step_bounds(1 if args.quick else 3)
    print("\n== step bound on bag states (min_gap 30 µm)")
    print(bag.round(5).to_string(index=False))
    res["bag_step_bound"] = bag.to_dict(orient="records")
    inter = intersections(1 if args.quick else 3)
    print("\n== count_intersections")
    print(inter.round(3).to_string(index=False))
    res["intersections"] = inter.to_dict(orient="records")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(res, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    print(f"\nwrote {OUT}")


if __name__ == "__main__":
    main()
