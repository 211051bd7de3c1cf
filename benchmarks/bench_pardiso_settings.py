"""Benchmark: PARDISO's settings on the Newton systems the bag solver really assembles.

`pardiso_handle` starts from MKL's defaults (nested-dissection ordering, one-level factorisation) without iterative
refinement. This script times other settings on the same matrices: parallel nested dissection (`iparm[1]` = 3),
minimum-degree ordering (`iparm[1]` = 0), the two-level factorisation (`iparm[23]` = 1, which also changes how the
triangular solves are parallelised) and the 3×3 block (BSR) input (`iparm[36]` = 3). Systems: every Newton system of
the step after `--at` of a saved run (`bench_linear.systems_of_saved_run`), or of the first bag step with a contact
gap below 0.9 d̂ when no run is given; four of them at most, spread over the step. For each: the analysis (one call),
the numeric factorisation and the solve (medians of `--repeat` calls), the relative residual of the solve and the
factor's non-zeros (`iparm[17]`). Prints the table and writes benchmarks/results/pardiso_settings.json (or `--out`).

    python benchmarks/bench_pardiso_settings.py [RUN.npz --at T] [--repeat 9]
"""
import argparse
import ctypes
import json
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from bench_linear import median_ms, systems_of_saved_run
from newtonipc_nb.linear import NotPositiveDefinite, ScalarCSR, import_pypardiso, pardiso_handle, system_from_bsr

SETTINGS = {"default": {}, "parallel nested dissection": {1: 3}, "minimum degree": {1: 0},
            "two-level factorisation": {23: 1}, "3×3 blocks (BSR)": {36: 3}}


def call(ps, phase: int, n: int, data, ia, ja, b, x):
    "One `pardiso` call on arrays counted from 1, in the precision of `data` (FP32 where `iparm[27]` = 1)."
    i32, fp = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(np.ctypeslib.as_ctypes_type(data.dtype))
    err, one = ctypes.c_int32(0), ctypes.byref(ctypes.c_int32(1))
    ps._mkl_pardiso(ps.pt.ctypes.data_as(ctypes.POINTER(ps._pt_type[0])), one, one, ctypes.byref(ctypes.c_int32(2)),
                    ctypes.byref(ctypes.c_int32(phase)), ctypes.byref(ctypes.c_int32(n)), data.ctypes.data_as(fp),
                    ia.ctypes.data_as(i32), ja.ctypes.data_as(i32), ps.perm.ctypes.data_as(i32), one,
                    ps.iparm.ctypes.data_as(i32), ctypes.byref(ctypes.c_int32(0)), b.ctypes.data_as(fp),
                    x.ctypes.data_as(fp), ctypes.byref(err))
    if err.value == -4: raise NotPositiveDefinite(f"pardiso phase {phase}: the matrix is not positive definite")
    if err.value: raise RuntimeError(f"pardiso phase {phase}: error {err.value}")


def upper_blocks(A: sp.csr_matrix):
    "The upper block triangle of the full symmetric matrix A in 3×3 BSR form (diagonal blocks whole), counted from 1."
    B = sp.bsr_matrix(A, blocksize=(3, 3))
    B.sort_indices()
    rows = np.repeat(np.arange(B.shape[0] // 3), np.diff(B.indptr))
    keep = B.indices >= rows
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows[keep], minlength=B.shape[0] // 3))])
    # PARDISO reads each block column by column
    return np.ascontiguousarray(B.data[keep].transpose(0, 2, 1)).ravel(), (indptr + 1).astype(np.int32), (
        B.indices[keep] + 1).astype(np.int32)


def measure(system, repeat: int) -> list[dict]:
    csr = ScalarCSR(system, upper=True)
    csr.refresh()
    U = sp.csr_matrix((csr.data.numpy().copy(), csr.indices, csr.indptr), shape=csr.shape)
    A, n = U + sp.triu(U, 1).T, U.shape[0]
    b = np.random.default_rng(0).standard_normal(n)
    rows = []
    for name, settings in SETTINGS.items():
        ps = pardiso_handle(import_pypardiso())
        for k, v in settings.items(): ps.iparm[k] = v
        if 36 in settings: (data, ia, ja), m = upper_blocks(A.tocsr()), n // 3
        else: data, ia, ja, m = U.data.copy(), (U.indptr + 1).astype(np.int32), (U.indices + 1).astype(np.int32), n
        x = np.zeros(n)
        run = lambda phase: call(ps, phase, m, data, ia, ja, b, x)        # noqa: E731
        row = dict(setting=name, n=n, analyse_ms=median_ms(lambda: run(11), 1),
                   factorise_ms=median_ms(lambda: run(22), repeat), solve_ms=median_ms(lambda: run(33), repeat))
        row.update(residual=float(np.linalg.norm(A @ x - b) / np.linalg.norm(b)), factor_nnz=int(ps.iparm[17]))
        run(-1)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", nargs="?", default=None, help="a saved bag run (every step stored)")
    ap.add_argument("--at", type=float, default=8.0, help="with RUN: the step after this time (s)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "pardiso_settings.json")
    a = ap.parse_args()
    if a.run:
        systems, where = systems_of_saved_run(a.run, a.at), f"the step after t = {a.at:g} s of {a.run}"
    else:
        from newtonipc_nb.verification.runner import bag_contact_systems
        raw, _, t = bag_contact_systems()
        systems, where = [system_from_bsr(H, -(D * g)) for g, H, D in raw], f"the bag step ending at {t:.4f} s"
    picked = systems[:: max(1, len(systems) // 4)][:4]
    df = pd.DataFrame([dict(system=k, **r) for k, s in enumerate(picked) for r in measure(s, a.repeat)])
    summary = df.groupby("setting", sort=False)[["analyse_ms", "factorise_ms", "solve_ms", "residual",
                                                 "factor_nnz"]].median()
    pd.set_option("display.width", 200)
    print(f"{len(picked)} of {len(systems)} Newton systems of {where}; medians over the systems")
    print(summary.to_string(float_format=lambda v: f"{v:.3g}"))
    a.out.write_text(json.dumps(dict(where=where, rows=df.to_dict(orient="records")), indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
