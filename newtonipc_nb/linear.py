"""The Newton system on a fixed block pattern, and the linear solvers that take it: analyse a pattern once, factorise per iteration, solve."""

from __future__ import annotations

import math
import os

import numpy as np
import torch
import warp as wp
import warp.sparse as wps
from warp.optim.linear import cg, preconditioner

from .inputs import HessianBlocks

class LinearSolveError(RuntimeError):
    "The Newton system could not be factorised or solved."

@wp.func
def _find_block(offsets: wp.array(dtype=wp.int32), columns: wp.array(dtype=wp.int32), i: wp.int32, j: wp.int32) -> wp.int32:
    "Index of block (i, j) in a BSR pattern (columns sorted within each row), or −1."
    lo = offsets[i]
    end = offsets[i + 1]
    hi = end
    while lo < hi:
        mid = (lo + hi) // 2
        if columns[mid] < j:
            lo = mid + 1
        else:
            hi = mid
    if lo < end:
        if columns[lo] == j:
            return lo
    return -1

@wp.kernel
def _scatter_blocks(rows: wp.array(dtype=wp.int32), cols: wp.array(dtype=wp.int32), vals: wp.array(dtype=wp.mat33d),
                    fixed: wp.array(dtype=wp.int32), offsets: wp.array(dtype=wp.int32), columns: wp.array(dtype=wp.int32),
                    values: wp.array(dtype=wp.mat33d), missed: wp.array(dtype=wp.int32)):
    k = wp.tid()
    r = rows[k]
    c = cols[k]
    if r < 0 or c < 0:
        return
    if fixed[r] != 0 or fixed[c] != 0:      # a fixed particle's row and column are eliminated
        return
    s = _find_block(offsets, columns, r, c)
    if s >= 0:
        wp.atomic_add(values, s, vals[k])
    else:
        wp.atomic_add(missed, 0, 1)

@wp.kernel
def _finish_diagonal(diag: wp.array(dtype=wp.int32), fixed: wp.array(dtype=wp.int32), values: wp.array(dtype=wp.mat33d),
                     d: wp.array(dtype=wp.vec3d), bad: wp.array(dtype=wp.int32)):
    "Identity on fixed particles' diagonal blocks; the equilibration scaling D = diag(H)^(-1/2)."
    i = wp.tid()
    s = diag[i]
    if fixed[i] != 0:
        values[s] = wp.identity(n=3, dtype=wp.float64)
    m = values[s]
    one = wp.float64(1.0)
    if m[0, 0] > wp.float64(0.0) and m[1, 1] > wp.float64(0.0) and m[2, 2] > wp.float64(0.0):
        d[i] = wp.vec3d(one / wp.sqrt(m[0, 0]), one / wp.sqrt(m[1, 1]), one / wp.sqrt(m[2, 2]))
    else:
        d[i] = wp.vec3d(one)
        wp.atomic_add(bad, 0, 1)

@wp.kernel
def _equilibrate(block_rows: wp.array(dtype=wp.int32), columns: wp.array(dtype=wp.int32), values: wp.array(dtype=wp.mat33d),
                 d: wp.array(dtype=wp.vec3d)):
    s = wp.tid()
    di = d[block_rows[s]]
    dj = d[columns[s]]
    m = values[s]
    for a in range(3):
        for b in range(3):
            m[a, b] = m[a, b] * di[a] * dj[b]
    values[s] = m

@wp.kernel
def _scaled_rhs(g: wp.array(dtype=wp.vec3d), d: wp.array(dtype=wp.vec3d), fixed: wp.array(dtype=wp.int32), rhs: wp.array(dtype=wp.vec3d)):
    "rhs = −D g, with the gradient of fixed particles dropped."
    i = wp.tid()
    if fixed[i] != 0:
        g[i] = wp.vec3d(0.0)
    rhs[i] = -wp.cw_mul(d[i], g[i])

@wp.kernel
def _unscale(z: wp.array(dtype=wp.vec3d), d: wp.array(dtype=wp.vec3d), dx: wp.array(dtype=wp.vec3d)):
    i = wp.tid()
    dx[i] = wp.cw_mul(d[i], z[i])

@wp.kernel
def _gather(values: wp.array(dtype=wp.mat33d), index: wp.array(dtype=wp.int32), out: wp.array(dtype=wp.float64)):
    "out[k] = the scalar entry index[k] = 9·block + 3·row + column of the block values."
    k = wp.tid()
    e = index[k]
    s = e // 9
    a = (e // 3) % 3
    out[k] = values[s][a, e % 3]

class NewtonSystem:
    """The Newton system of one iteration on a 3×3-block pattern that is kept while it holds every block:
    `H` (warp BSR, equilibrated D H D once `finish` ran), `D` (the scaling), `grad` and `rhs` = −D ∇Φ (Warp vec3d arrays)."""
    def __init__(self, n: int, fixed: wp.array, device=None):
        self.n, self.device = int(n), str(wp.get_device(device))
        self.fixed = fixed
        d = self.device
        self.grad = wp.zeros(n, dtype=wp.vec3d, device=d)
        self.rhs = wp.zeros(n, dtype=wp.vec3d, device=d)
        self.D = wp.ones(n, dtype=wp.vec3d, device=d)
        self.H = wps.bsr_zeros(n, n, wp.mat33d, device=d)
        self._missed = wp.zeros(1, dtype=wp.int32, device=d)
        self._bad = wp.zeros(1, dtype=wp.int32, device=d)
        self.version = 0                    # bumped whenever the pattern changes: linear solvers re-analyse
        self.stats = dict(patterns=0)
        self._keys = np.zeros(0, np.int64)
        self._set_pattern(np.arange(n, dtype=np.int64) * (n + 1))

    @property
    def nnz(self) -> int: return self._keys.size

    def _set_pattern(self, keys: np.ndarray):
        "Make the pattern the sorted unique block keys r·n + c (the diagonal always included)."
        n, d = self.n, self.device
        keys = np.union1d(keys, np.arange(n, dtype=np.int64) * (n + 1))
        r, c = (keys // n).astype(np.int32), (keys % n).astype(np.int32)
        self._keys = keys
        wps.bsr_set_from_triplets(self.H, wp.array(r, dtype=wp.int32, device=d), wp.array(c, dtype=wp.int32, device=d),
                                  wp.zeros(len(keys), dtype=wp.mat33d, device=d), prune_numerical_zeros=False)
        self.block_rows = wp.array(r, dtype=wp.int32, device=d)
        self.diag = wp.array(np.searchsorted(keys, np.arange(n, dtype=np.int64) * (n + 1)).astype(np.int32), dtype=wp.int32, device=d)
        self.version += 1
        self.stats["patterns"] += 1

    def _triplet_keys(self, blocks: HessianBlocks, count: int) -> np.ndarray:
        r, c = blocks.rows.numpy()[:count].astype(np.int64), blocks.cols.numpy()[:count].astype(np.int64)
        fx = self.fixed.numpy()
        ok = (r >= 0) & (c >= 0)
        r, c = r[ok], c[ok]
        ok = (fx[r] == 0) & (fx[c] == 0)
        return np.unique(r[ok] * self.n + c[ok])

    def assemble(self, blocks: HessianBlocks, count: int, *, fresh: bool = False) -> bool:
        """Sum the first `count` triplets of `blocks` into H (blocks touching a fixed particle dropped). A block outside
        the pattern grows it (from these triplets alone when `fresh`, else kept with the old ones); returns whether it changed."""
        changed = False
        for attempt in range(2):
            self.H.values.zero_(); self._missed.zero_()
            if count:
                wp.launch(_scatter_blocks, dim=count, device=self.device,
                          inputs=[blocks.rows, blocks.cols, blocks.vals, self.fixed, self.H.offsets, self.H.columns, self.H.values, self._missed])
            if int(self._missed.numpy()[0]) == 0:
                return changed
            keys = self._triplet_keys(blocks, count)
            self._set_pattern(keys if fresh else np.union1d(self._keys, keys))
            changed = True
        raise AssertionError("a block is still missing after the pattern was rebuilt")

    def finish(self):
        "Identity on fixed particles, D = diag(H)^(−1/2), H ← D H D and rhs = −D ∇Φ; raises if a free diagonal entry is not positive."
        d = self.device
        self._bad.zero_()
        wp.launch(_finish_diagonal, dim=self.n, device=d, inputs=[self.diag, self.fixed, self.H.values, self.D, self._bad])
        if int(self._bad.numpy()[0]):
            raise LinearSolveError(f"{int(self._bad.numpy()[0])} diagonal block(s) of the Newton matrix are not positive")
        wp.launch(_equilibrate, dim=self.nnz, device=d, inputs=[self.block_rows, self.H.columns, self.H.values, self.D])
        wp.launch(_scaled_rhs, dim=self.n, device=d, inputs=[self.grad, self.D, self.fixed, self.rhs])

    def unscale(self, z: wp.array, dx: wp.array):
        "dx = D z: the Newton direction from the solution of the equilibrated system."
        wp.launch(_unscale, dim=self.n, device=self.device, inputs=[z, self.D, dx])

class ScalarCSR:
    "The scalar CSR form (upper triangle, or full) of a block pattern, refreshed from the block values by one gather."
    def __init__(self, system: NewtonSystem, upper: bool):
        H, n = system.H, system.n
        br, bc = system.block_rows.numpy().astype(np.int64), H.columns.numpy()[: system.nnz].astype(np.int64)
        a, b = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
        R = (3 * br[:, None, None] + a).ravel(); C = (3 * bc[:, None, None] + b).ravel()
        src = np.arange(9 * len(br), dtype=np.int64)
        keep = C >= R if upper else np.ones(len(R), bool)
        R, C, src = R[keep], C[keep], src[keep]
        order = np.lexsort((C, R))
        self.shape = (3 * n, 3 * n)
        self.indptr = np.zeros(3 * n + 1, np.int32); np.cumsum(np.bincount(R, minlength=3 * n), out=self.indptr[1:])
        self.indices = C[order].astype(np.int32)
        self._src = wp.array(src[order].astype(np.int32), dtype=wp.int32, device=system.device)
        self.data = wp.zeros(len(order), dtype=wp.float64, device=system.device)
        self._system = system

    def refresh(self) -> wp.array:
        "Copy the current block values into `data`."
        wp.launch(_gather, dim=len(self.indices), device=self._system.device, inputs=[self._system.H.values, self._src, self.data])
        return self.data

class LinearSolver:
    """Solves the equilibrated Newton system: `analyse(system)` when its pattern changes, then `factorise(system)` and
    `solve(system, out)` every iteration; `stats` counts what it did."""
    name = "linear solver"
    def __init__(self):
        self.stats = dict(analyses=0, factorisations=0, solves=0)
        self._version = None

    def prepare(self, system: NewtonSystem) -> None:
        "Analyse the pattern if it changed since the last call, then factorise the current values."
        if system.version != self._version:
            self.analyse(system); self._version = system.version; self.stats["analyses"] += 1
        self.factorise(system); self.stats["factorisations"] += 1

    def analyse(self, system: NewtonSystem) -> None: pass
    def factorise(self, system: NewtonSystem) -> None: raise NotImplementedError
    def solve(self, system: NewtonSystem, out: wp.array) -> None: raise NotImplementedError

def _check_solution(x: np.ndarray, name: str):
    if not np.isfinite(x).all():
        raise LinearSolveError(f"{name}: the solution is not finite (the matrix is not positive definite)")

class PardisoSolver(LinearSolver):
    "Sparse LDLᵀ (Cholesky) by Intel MKL PARDISO (pypardiso) on the CPU: ordering and symbolic analysis once per pattern, numeric factorisation per iteration."
    name = "pardiso"
    def __init__(self):
        super().__init__()
        import pypardiso
        self._pypardiso = pypardiso
        self._ps = None

    def analyse(self, system):
        if str(system.device) != "cpu": raise LinearSolveError("pardiso runs on the CPU only; use 'cholespy' or 'pcg' on CUDA")
        if self._ps is None:
            self._ps = self._pypardiso.PyPardisoSolver(mtype=2)          # real symmetric positive definite
            # pypardiso searches the whole environment for MKL (~0.3 s) unless told where it is: tell the next solvers
            os.environ.setdefault("PYPARDISO_MKL_RT", self._ps.libmkl._name)
        else:
            self._call(-1, np.zeros(3 * system.n))   # release the old pattern's factors
        self.csr = ScalarCSR(system, upper=True)
        self._A = None
        self._call(11, np.zeros(3 * system.n))

    def _matrix(self):
        import scipy.sparse as sp
        return sp.csr_matrix((self.csr.data.numpy(), self.csr.indices, self.csr.indptr), shape=self.csr.shape, copy=False)

    def _call(self, phase, b):
        self._ps.set_phase(phase)
        try:
            return self._ps._call_pardiso(self._matrix(), b)      # pypardiso's public solve() would redo the analysis
        except self._pypardiso.pardiso_wrapper.PyPardisoError as e:
            raise LinearSolveError(f"pardiso phase {phase} failed: {e}") from e

    def factorise(self, system):
        self.csr.refresh()
        self._call(22, np.zeros(3 * system.n))

    def solve(self, system, out):
        x = self._call(33, system.rhs.numpy().reshape(-1))
        _check_solution(x, self.name); self.stats["solves"] += 1
        out.assign(x.reshape(-1, 3))

class CholespySolver(LinearSolver):
    "Sparse Cholesky by cholespy (CHOLMOD on the CPU, its own kernels on CUDA); it has no numeric-only refactorisation, so every factorisation redoes the analysis."
    name = "cholespy"
    def analyse(self, system):
        self.csr = ScalarCSR(system, upper=False)
        self._dev = "cuda" if system.device.startswith("cuda") else "cpu"
        self._indptr = torch.from_numpy(self.csr.indptr).to(self._dev); self._indices = torch.from_numpy(self.csr.indices).to(self._dev)

    def factorise(self, system):
        from cholespy import CholeskySolverD, MatrixType
        data = wp.to_torch(self.csr.refresh())
        try:
            self._s = CholeskySolverD(3 * system.n, self._indptr, self._indices, data, MatrixType.CSR)
        except (RuntimeError, ValueError) as e:
            raise LinearSolveError(f"cholespy: sparse Cholesky factorisation failed: {e}") from e

    def solve(self, system, out):
        x = torch.zeros(3 * system.n, dtype=torch.float64, device=self._dev)
        self._s.solve(wp.to_torch(system.rhs).reshape(-1), x)
        _check_solution(x.cpu().numpy(), self.name); self.stats["solves"] += 1
        out.assign(wp.from_torch(x.reshape(-1, 3), dtype=wp.vec3d))

class DenseSolver(LinearSolver):
    "Dense FP64 Cholesky in torch: the reference implementation's solver, O(N³); for small systems and checks."
    name = "dense"
    def analyse(self, system):
        self.csr = ScalarCSR(system, upper=False)
        self._dev = "cuda" if system.device.startswith("cuda") else "cpu"
        self._rows = torch.from_numpy(np.repeat(np.arange(3 * system.n), np.diff(self.csr.indptr))).to(self._dev)
        self._cols = torch.from_numpy(self.csr.indices.astype(np.int64)).to(self._dev)

    def factorise(self, system):
        n = 3 * system.n
        A = torch.zeros((n, n), dtype=torch.float64, device=self._dev)
        A[self._rows, self._cols] = wp.to_torch(self.csr.refresh())
        L, info = torch.linalg.cholesky_ex(A)
        if int(info) != 0:
            raise LinearSolveError(f"dense Cholesky failed: leading minor {int(info)} of {n} is not positive definite")
        self._L = L

    def solve(self, system, out):
        x = torch.cholesky_solve(wp.to_torch(system.rhs).reshape(-1, 1), self._L)[:, 0]
        _check_solution(x.cpu().numpy(), self.name); self.stats["solves"] += 1
        out.assign(wp.from_torch(x.reshape(-1, 3).contiguous(), dtype=wp.vec3d))

class PCGSolver(LinearSolver):
    """Conjugate gradients (Warp) with a block-Jacobi preconditioner. Stops when the true relative residual
    ‖b − A z‖/‖b‖ ≤ `tol`: CG's recursively updated residual drifts from the true one, so it restarts from z until both agree."""
    name = "pcg"
    def __init__(self, tol: float = 1e-12, max_restarts: int = 20):
        super().__init__()
        if not (0 < tol < 1): raise ValueError(f"PCGSolver: tol must be in (0, 1), got {tol}")
        self.tol, self.max_restarts = float(tol), int(max_restarts)
        self.stats.update(cg_iterations=0, last_cg_iterations=0, last_residual=math.nan)

    def factorise(self, system):
        self._M = preconditioner(system.H, ptype="block_jacobi_direct")

    def solve(self, system, out):
        H, b, n = system.H, system.rhs, 3 * system.n
        bn = float(np.linalg.norm(b.numpy()))
        out.zero_()
        if bn == 0.0: self.stats["solves"] += 1; return
        r = wp.empty_like(b); its = 0
        for _ in range(self.max_restarts):
            k, _, _ = cg(H, b, out, tol=self.tol, maxiter=10 * n, M=self._M, use_cuda_graph=False)
            its += int(k)
            wp.copy(r, b); wps.bsr_mv(H, out, r, alpha=-1.0, beta=1.0)
            res = float(np.linalg.norm(r.numpy())) / bn
            if res <= self.tol or int(k) == 0: break
        self.stats["solves"] += 1; self.stats["cg_iterations"] += its
        self.stats["last_cg_iterations"], self.stats["last_residual"] = its, res
        _check_solution(out.numpy(), self.name)
        if res > max(self.tol, 1e-9):
            raise LinearSolveError(f"PCG did not converge: relative residual {res:.3e} after {its} iterations")

LINEAR_SOLVERS = dict(pardiso=PardisoSolver, cholespy=CholespySolver, dense=DenseSolver, pcg=PCGSolver)

def make_linear_solver(spec="auto", device=None) -> LinearSolver:
    "A `LinearSolver` from a name ('auto': pardiso on the CPU, cholespy on CUDA; 'cholesky' is cholespy) or the instance itself."
    if isinstance(spec, LinearSolver): return spec
    if not isinstance(spec, str): raise TypeError(f"linear_solver must be a name or a LinearSolver, got {type(spec).__name__}")
    if spec == "auto": spec = "cholespy" if str(wp.get_device(device)).startswith("cuda") else "pardiso"
    if spec == "cholesky": spec = "cholespy"
    if spec not in LINEAR_SOLVERS: raise ValueError(f"linear_solver must be 'auto', one of {sorted(LINEAR_SOLVERS)} or 'cholesky', or a LinearSolver; got {spec!r}")
    return LINEAR_SOLVERS[spec]()

def _system_from_bsr(H: wps.BsrMatrix, rhs) -> NewtonSystem:
    "A `NewtonSystem` holding a copy of the block matrix `H` (no fixed particles, D = 1) and right-hand side `rhs` (N, 3)."
    n, d = H.nrow, str(H.device)
    s = NewtonSystem(n, wp.zeros(n, dtype=wp.int32, device=d), device=d)
    off = H.offsets.numpy(); nnz = int(off[-1])
    rows = np.repeat(np.arange(n), np.diff(off)).astype(np.int64)
    s._set_pattern(rows * n + H.columns.numpy()[:nnz])
    blocks = HessianBlocks(rows=wp.array(rows.astype(np.int32), dtype=wp.int32, device=d), cols=wp.array(H.columns.numpy()[:nnz], dtype=wp.int32, device=d),
                           vals=wp.array(H.values.numpy()[:nnz], dtype=wp.mat33d, device=d))
    s.assemble(blocks, nnz)
    s.rhs.assign(np.asarray(rhs, dtype=np.float64).reshape(n, 3))
    return s

def solve_linear(H: wps.BsrMatrix, rhs, method="auto") -> np.ndarray:
    "Solve the SPD block system H z = rhs once (rhs of shape (N, 3)) with a linear solver (`method`: a name or a `LinearSolver`); returns z (N, 3)."
    s = _system_from_bsr(H, rhs)
    solver = make_linear_solver(method, device=s.device)
    solver.prepare(s)
    z = wp.zeros(s.n, dtype=wp.vec3d, device=s.device)
    solver.solve(s, z)
    return z.numpy()
