"""Benchmark: SolverIPC against Newton's SolverVBD on the same bag choreography, both timed in this one run.

Both solvers run the bag scene from t = 0 to --until seconds (default 8.45 s, the reference side-by-side window)
in one process on one device, one after the other: IPC at dt = 1/240 s (`run_bag`), VBD at its own substep and
iteration count with the same TIMELINE (`validation.run_vbd_bag`, the `check` row reported rather than enforced).
Wall time covers the stepping loop of each (scene set-up and the measurements excluded; kernels are compiled
beforehand by a short run of each). The table adds the side-by-side measures of both final states, every frame
checked for intersecting film triangles.

    python benchmarks/bench_vbd.py [--until 8.45] [--device cpu] [--out benchmarks/results/vbd.json] [--npz PATH]
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import pandas as pd
import warp as wp

from newtonipc_nb.scenes.bag_run import run_bag
from newtonipc_nb.verification.vbd import compare_vbd, run_vbd_bag, save_side_by_side, unchecked_timeline


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--until", type=float, default=8.45, help="simulated seconds of the choreography (default 8.45)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "vbd.json"))
    ap.add_argument("--npz", default=None, help="also write both trajectories here (validation.save_side_by_side)")
    a = ap.parse_args()
    wp.config.quiet = True
    run_bag(2 / 240, device=a.device, progress=False)                                  # compile both solvers' kernels
    run_vbd_bag(2 / 240, device=a.device, timeline=unchecked_timeline())
    table, trajs = compare_vbd(a.until, device=a.device)
    ipc_s, vbd_s = float(trajs["ipc"]["wall_time"]), float(trajs["vbd"]["wall_time"])
    pd.set_option("display.width", 200)
    print(table.to_string(index=False))
    print(f"wall time: IPC {ipc_s:.1f} s, VBD {vbd_s:.1f} s, VBD / IPC = {vbd_s / ipc_s:.2f}")
    meta = dict(benchmark="IPC vs VBD", until=a.until, device=a.device, warp=wp.config.version,
                python=platform.python_version(), machine=platform.machine(), cpu_count=os.cpu_count(),
                date=time.strftime("%Y-%m-%d"))
    out = dict(meta=meta, ipc_wall_s=ipc_s, vbd_wall_s=vbd_s, ratio_vbd_over_ipc=vbd_s / ipc_s,
               table=table.to_dict(orient="records"))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    if a.npz: save_side_by_side(trajs, a.npz)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
