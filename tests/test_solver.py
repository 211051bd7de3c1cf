"""SolverIPC end to end: rejected inputs, linear solvers that agree, energy descent, and a cloth drop without
intersections."""
import gc
import importlib
import math
import pkgutil

import numpy as np
import pytest
import warp as wp

import newton
from newtonipc_nb.elastic import MembraneHessianRule
from newtonipc_nb.ccd import fp32_gaps
from newtonipc_nb.intersections import count_intersections
from newtonipc_nb.linear import REUSE_CG, PardisoSolver
from newtonipc_nb.supports import SupportTerm
import newtonipc_nb
from newtonipc_nb import terms
from newtonipc_nb.terms import term_derivatives

from newtonipc_nb.solver import EXACT_FROM, SolverIPC
from newtonipc_nb.solver_interface import SolverError
from newtonipc_nb.scenes.reference import hinge_scene, sheet_on_sphere


def copy_state(model, state):
    s = model.state()
    s.particle_q.assign(state.particle_q)
    s.particle_qd.assign(state.particle_qd)
    return s


def test_initial_overlap_is_rejected_and_output_untouched():
    model, s0 = hinge_scene("vt")
    # vertex a below the fixed triangle's plane: through it
    q = s0.particle_q.numpy()
    q[0, 2] = -1e-4
    q[1:4, 2] += 0.0
    s0.particle_q.assign(q)
    s1 = model.state()
    before = s1.particle_q.numpy().copy(), s1.particle_qd.numpy().copy()
    solver = SolverIPC(model)
    with pytest.raises(SolverError, match="invalid start"):
        solver.step(s0, s1, None, None, 1 / 240)
    np.testing.assert_array_equal(s1.particle_q.numpy(), before[0])
    np.testing.assert_array_equal(s1.particle_qd.numpy(), before[1])


def test_edge_through_face_is_rejected():
    model, s0 = hinge_scene("ee")
    # the shared edge c–d 2 mm below the ridge: the film cuts through it
    q = s0.particle_q.numpy()
    q[:4, 2] -= q[2, 2] + 2e-3
    s0.particle_q.assign(q)
    s1 = model.state()
    before = s1.particle_q.numpy().copy()
    with pytest.raises(SolverError, match="invalid start"):
        SolverIPC(model).step(s0, s1, None, None, 1 / 240)
    np.testing.assert_array_equal(s1.particle_q.numpy(), before)


def test_nan_input_is_rejected():
    model, s0 = hinge_scene("vt")
    q = s0.particle_q.numpy()
    q[2, 1] = np.nan
    s0.particle_q.assign(q)
    s1 = model.state()
    before = s1.particle_q.numpy().copy()
    with pytest.raises(SolverError, match="particle_q of particle 2 is not finite"):
        SolverIPC(model).step(s0, s1, None, None, 1 / 240)
    np.testing.assert_array_equal(s1.particle_q.numpy(), before)


@pytest.mark.parametrize("kind", ["vt", "ee"])
def test_linear_solvers_give_the_same_step(kind):
    out = {}
    for method in ("pardiso", "cholespy", "dense", "pcg"):
        model, s0 = hinge_scene(kind)
        solver = SolverIPC(model, linear_solver=method, tolerance=1e-9)
        s1 = model.state()
        for _ in range(3):
            solver.step(s0, s1, None, None, 1 / 240)
            s0, s1 = s1, s0
        out[method] = s0.particle_q.numpy().astype(np.float64)
    for method in ("cholespy", "dense", "pcg"):
        np.testing.assert_allclose(out[method], out["pardiso"], rtol=0, atol=1e-9)


def test_energy_decreases_at_every_accepted_iteration():
    model, s0 = hinge_scene("vt")
    solver = SolverIPC(model)
    s1 = model.state()
    checked = 0
    for _ in range(12):
        solver.step(s0, s1, None, None, 1 / 240)
        s0, s1 = s1, s0
        st = solver.last_stats
        assert st.min_gap > 0
        e = np.asarray(st.energies)
        if st.subdivisions == 0 and len(e) > 1:
            assert np.all(np.diff(e) <= 1e-12 * np.abs(e).max()), e
            checked += 1
    assert checked >= 3


def run_cloth_drop(steps):
    model, faces = sheet_on_sphere(21, 0.1)
    solver = SolverIPC(model, drag=2.0)
    s0, s1 = model.state(), model.state()
    worst_gap, hits = math.inf, []
    for _ in range(steps):
        solver.step(s0, s1, None, None, 1 / 240)
        s0, s1 = s1, s0
        x = s0.particle_q.numpy().astype(np.float64)[: len(np.unique(faces))]
        hits.append(count_intersections(x, faces))
        worst_gap = min(worst_gap, solver.last_stats.min_gap)
    return x, hits, worst_gap, solver


def test_cloth_drop_on_sphere_has_no_intersections():
    x, hits, gap, _ = run_cloth_drop(48)
    assert sum(hits) == 0 and gap > 0
    assert x[:, 2].min() < 0.02            # the sheet has draped past the sphere's top


def test_replayed_launches_take_the_plain_launches_steps(monkeypatch):
    """The package's kernels go through `terms.launch`, which replays recorded launches (on the CPU through the
    kernel's entry): the cloth drop takes the same steps, bit for bit, as with every launch made by `wp.launch`."""
    before = set(terms._records())
    x, hits, _, solver = run_cloth_drop(24)
    made = set(terms._records()) - before
    assert made and sum(hits) == 0
    assert all(terms._records()[k].entry is not None for k in made)     # every replay called the entry itself
    del solver
    gc.collect()
    left = made & set(terms._records())
    assert not left, [k[0].key for k in left]   # no record outlives its arrays: the solver's memory went with it
    for info in pkgutil.iter_modules(newtonipc_nb.__path__):       # every module that launches through it
        module = importlib.import_module(f"newtonipc_nb.{info.name}")
        if getattr(module, "launch", None) is terms.launch: monkeypatch.setattr(module, "launch", wp.launch)
    terms._records().clear()
    x_plain, *_ = run_cloth_drop(24)
    assert len(terms._records()) == 0           # every launch went through wp.launch this time
    assert np.array_equal(x, x_plain)


@pytest.mark.slow
def test_cloth_drop_settles_without_intersections():
    x, hits, gap, _ = run_cloth_drop(240)
    assert sum(hits) == 0 and gap > 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["vt", "ee"])
def test_cuda_matches_cpu_on_small_scenes(kind):
    """6 steps of the small scenes (StVK) on CUDA and on the CPU agree within 2e-7 m."""
    if not wp.is_cuda_available():
        pytest.skip("no CUDA device")
    out = {}
    for device in ("cpu", "cuda:0"):
        model, s0 = hinge_scene(kind, device=device)
        solver = SolverIPC(model, membrane="stvk")
        s1 = model.state()
        for _ in range(6):
            solver.step(s0, s1, None, None, 1 / 240)
            s0, s1 = s1, s0
        out[device] = s0.particle_q.numpy().astype(np.float64)
    np.testing.assert_allclose(out["cuda:0"], out["cpu"], rtol=0, atol=2e-7)


def run_bag_steps(device, steps):
    from newtonipc_nb.scenes.bag_scene import DT, BagScene
    from newtonipc_nb.scenes.choreography import Choreographer
    from newtonipc_nb.scenes.bag_run import apply_controls
    sc, ch = BagScene.build(device), Choreographer()
    for k in range(steps):
        apply_controls(sc, ch.controls((k + 1) * DT, sc.positions()))
        sc.solver.step(sc.state, sc.scratch, None, None, DT)
        sc.state, sc.scratch = sc.scratch, sc.state
    return sc.positions()


@pytest.mark.gpu
def test_cuda_matches_cpu_on_the_bag():
    """The first 24 bag steps (the fold over the rim, contact with the bin) on CUDA and on the CPU: positions within
    2e-7 m."""
    x_cpu, x_gpu = run_bag_steps("cpu", 24), run_bag_steps("cuda:0", 24)
    assert np.abs(x_gpu - x_cpu).max() <= 2e-7, np.abs(x_gpu - x_cpu).max()


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["cholespy", "pcg"])
def test_cuda_linear_solvers_match_cpu(method):
    model, s0 = hinge_scene("vt", device="cuda:0")
    s1 = model.state()
    solver = SolverIPC(model, linear_solver=method, tolerance=1e-9)
    for _ in range(3):
        solver.step(s0, s1, None, None, 1 / 240)
        s0, s1 = s1, s0
    model_c, c0 = hinge_scene("vt", device="cpu")
    c1 = model_c.state()
    ref = SolverIPC(model_c, tolerance=1e-9)
    for _ in range(3):
        ref.step(c0, c1, None, None, 1 / 240)
        c0, c1 = c1, c0
    np.testing.assert_allclose(s0.particle_q.numpy(), c0.particle_q.numpy(), rtol=0, atol=1e-9)


def test_state_out_of_another_size_is_rejected_untouched():
    model, s0 = hinge_scene("vt")
    other_model, _ = sheet_on_sphere(4)
    bigger = other_model.state()                                   # 16 + 4 + 1 particles vs the hinge scene's 7
    before = bigger.particle_q.numpy().copy()
    with pytest.raises(SolverError, match="state_out.particle_q must be a wp.vec3 array of 7 particles"):
        SolverIPC(model).step(s0, bigger, None, None, 1 / 240)
    np.testing.assert_array_equal(bigger.particle_q.numpy(), before)
    b = newton.ModelBuilder()
    b.add_particle(wp.vec3(0.0, 0.0, 0.0), wp.vec3(0.0, 0.0, 0.0), mass=1.0, radius=0.01)
    smaller = b.finalize(device="cpu").state()
    with pytest.raises(SolverError, match="state_out.particle_q"):
        SolverIPC(model).step(s0, smaller, None, None, 1 / 240)


def test_nothing_to_move_is_a_converged_step():
    """A free particle at rest without gravity, and a model of fixed particles only: the zero gradient is
    convergence."""
    for mass in (1.0, 0.0):
        b = newton.ModelBuilder(gravity=(0.0, 0.0, 0.0))
        b.add_particle(wp.vec3(0.0, 0.0, 0.1), wp.vec3(0.0, 0.0, 0.0), mass=mass, radius=0.01)
        model = b.finalize(device="cpu")
        s0, s1 = model.state(), model.state()
        solver = SolverIPC(model)
        solver.step(s0, s1, None, None, 1 / 240)
        np.testing.assert_array_equal(s1.particle_q.numpy(), s0.particle_q.numpy())
        assert solver.last_stats.subdivisions == 0 and solver.last_stats.newton_iterations == 1


def pulled_particle(target, max_move, v0=(0.0, 0.0, 0.0)):
    """A 1 kg particle at (0, 0, 0.1) with velocity `v0`, no gravity, pulled towards `target` by a stiff support: one
    step of 1/240 s. Returns (end position, each direction's longest move, the step's statistics)."""
    b = newton.ModelBuilder(gravity=(0.0, 0.0, 0.0))
    b.add_particle(wp.vec3(0.0, 0.0, 0.1), wp.vec3(*v0), mass=1.0, radius=0.01)
    model = b.finalize(device="cpu")
    seen = []
    solver = SolverIPC(model, max_move=max_move,
                       observer=lambda info: seen.append(np.linalg.norm(info.dx.numpy(), axis=1).max()))
    solver.set_supports([0], [target], 1e7)
    s1 = model.state()
    solver.step(model.state(), s1, None, None, 1 / 240)
    return s1.particle_q.numpy()[0], seen, solver.last_stats


def test_long_directions_are_shortened_to_max_move():
    """Pulled 5 cm (20 cm) from rest, Newton's first direction goes almost the whole way. With `max_move` = 1 cm every
    direction is at most 1 cm, the particle takes more iterations, it ends where the uncut solve ends, and a full step
    along a shortened direction never lengthens the next one."""
    for dx in (0.05, 0.2):
        end, moves, _ = pulled_particle([dx, 0.0, 0.1], math.inf)
        end_cut, moves_cut, st = pulled_particle([dx, 0.0, 0.1], 1e-2)
        assert moves[0] > 0.98 * dx and len(moves) <= 3
        assert max(moves_cut) <= 1e-2 * (1 + 1e-12) and len(moves_cut) >= 100 * dx
        assert st.extended == 0
        np.testing.assert_allclose(end_cut, end, atol=2e-5)


def test_the_trust_radius_covers_twice_the_inertial_move():
    """Moving at 7.2 m/s (3 cm per step) and pulled 5 cm beyond where it is headed: the step's radius is 6 cm, not
    `max_move` = 1 cm, so the first direction is not cut."""
    end, moves, _ = pulled_particle([0.08, 0.0, 0.1], 1e-2, v0=(7.2, 0.0, 0.0))
    assert moves[0] > 0.049 and len(moves) <= 3


@pytest.mark.parametrize("option, value", [("max_iterations", 0), ("line_search_trials", 0), ("max_subdivisions", -1),
                                           ("tolerance", 0.0), ("dhat", float("nan")), ("kappa", -1.0),
                                           ("friction", -0.1), ("min_gap", 2e-3), ("skin", float("inf")),
                                           ("membrane", "linear"), ("step_bound", "exact"), ("linear_solver", "lu"),
                                           ("max_iterations", 2.5), ("observer", 3), ("barrier_hessian", "exact"),
                                           ("line_search_batch", 0), ("line_search_batch", 2.0), ("max_move", 0.0),
                                           ("max_move", float("nan"))])
def test_bad_options_are_refused_at_construction(option, value):
    model, _ = hinge_scene("vt")
    with pytest.raises(ValueError, match=option):
        SolverIPC(model, **{option: value})


def test_closed_gap_names_the_primitives():
    model, s0 = hinge_scene("vt")
    # vertex a 10 µm above the fixed triangle: inside min_gap
    q = s0.particle_q.numpy()
    q[0, 2] = 1e-5
    s0.particle_q.assign(q)
    with pytest.raises(SolverError, match=r"the gap between vertex 0 and triangle \(4, 5, 6\) is -2\.000e-05 m"):
        SolverIPC(model).step(s0, model.state(), None, None, 1 / 240)


def test_observer_sees_every_iteration():
    model, s0 = hinge_scene("vt")
    seen = []
    solver = SolverIPC(model, observer=lambda info: seen.append((info.iteration, info.alpha, info.system.nnz)))
    solver.step(s0, model.state(), None, None, 1 / 240)
    assert [i for i, _, _ in seen] == list(range(solver.last_stats.newton_iterations))
    assert all(0 <= a <= 1 for _, a, _ in seen) and all(n > 0 for _, _, n in seen)


def sheet_reads(monkeypatch, **options):
    """A sheet draped over a sphere (contacts active), then six steps with every Newton iteration's small device-to-host
    reads counted: (reads, line-search trials, pattern growths, candidate builds) per iteration, and the final state."""
    model, _ = sheet_on_sphere(21, 0.1)
    # PARDISO's CG on a kept factor may choose to refactorise by timing: no kept factor, so that runs repeat bit for bit
    solver = SolverIPC(model, drag=2.0, linear_solver=PardisoSolver(threads=1, reuse=0), **options)
    s0, s1 = model.state(), model.state()
    for _ in range(30):                     # until the sheet lies on the sphere
        solver.step(s0, s1, None, None, 1 / 240)
        s0, s1 = s1, s0
    numpy, iteration, reads, rows = wp.array.numpy, SolverIPC._iteration, [0], []

    def counted(a):
        if a.size <= 32:                    # scalars and flags; whole arrays (the linear solve's) are not decisions
            reads[0] += 1
        return numpy(a)

    def one(self, *args):
        st, builds = self.last_stats, self.search.stats["builds"]
        before = reads[0], st.line_search_trials, st.patterns
        out = iteration(self, *args)
        rows.append((reads[0] - before[0], st.line_search_trials - before[1], st.patterns - before[2],
                     self.search.stats["builds"] - builds))
        return out

    monkeypatch.setattr(wp.array, "numpy", counted)
    monkeypatch.setattr(SolverIPC, "_iteration", one)
    for _ in range(6):
        solver.step(s0, s1, None, None, 1 / 240)
        s0, s1 = s1, s0
    monkeypatch.undo()
    assert solver.last_stats.active_contacts > 0 and len(rows) >= 12
    return rows, s0.particle_q.numpy()


def test_host_reads_per_newton_iteration(monkeypatch):
    """The sequential line search (the CPU's default): two small reads per iteration (the direction with its flags and
    counts, then Φ with the step bound at the first trial), plus one per further trial, one more direction when the
    block pattern grew and three for a candidate rebuild."""
    rows, _ = sheet_reads(monkeypatch, line_search_batch=1)
    plain = [r for r, trials, patterns, builds in rows if trials <= 1 and patterns == builds == 0]
    assert len(plain) >= 0.75 * len(rows) and max(plain) <= 2, rows
    assert all(r <= 2 + max(t - 1, 0) + p + 3 * b for r, t, p, b in rows), rows


def test_batched_line_search_reads_once_per_newton_iteration(monkeypatch):
    """line_search_batch=4 (CUDA's default): the step bound and trials α…α/8 go with the direction's read, so an
    iteration whose accepted trial is among them makes one read; a later batch costs one read, a pattern growth one, a
    candidate rebuild four (its own three, and the first batch again over the new set). At most two on average, and
    the same steps as the sequential search, bit for bit."""
    rows, x = sheet_reads(monkeypatch, line_search_batch=4)
    plain = [r for r, trials, patterns, builds in rows if trials <= 4 and patterns == builds == 0]
    assert len(plain) >= 0.75 * len(rows) and max(plain) == 1, rows
    assert all(r <= 1 + -(-max(t - 4, 0) // 4) + p + 4 * b for r, t, p, b in rows), rows
    assert sum(r for r, *_ in rows) <= 2 * len(rows), rows
    rows1, x1 = sheet_reads(monkeypatch, line_search_batch=1)
    assert [r[1:] for r in rows] == [r[1:] for r in rows1] and np.array_equal(x, x1)


@pytest.mark.parametrize("step_bound, user_term", [("accd", False), ("normal", False), ("accd", True)])
def test_batched_line_search_takes_the_sequential_steps(step_bound, user_term):
    """Batches of 3 trials (the first launched with the direction, over the near set still counted on the device; with
    a user's term, read after the near set) take the trial the sequential search takes: the same steps, bit for bit,
    backtracking included."""
    runs = []
    for batch in (1, 3):
        model, s0 = hinge_scene("ee", speed=3.0)
        extra = []
        if user_term:                           # a support pulling the hinge's first particle sideways
            extra = [SupportTerm(device="cpu")]
            extra[0].set([0], s0.particle_q.numpy()[:1].astype(np.float64) + [0.002, 0.0, 0.0], 0.5)
        solver = SolverIPC(model, step_bound=step_bound, line_search_batch=batch, terms=extra,
                           linear_solver=PardisoSolver(threads=1, reuse=0))     # bit for bit: see sheet_reads
        s1, stats = model.state(), []
        for _ in range(12):
            solver.step(s0, s1, None, None, 1 / 240)
            s0, s1 = s1, s0
            st = solver.last_stats
            stats.append((st.newton_iterations, st.line_search_trials, st.alphas, st.energies))
        runs.append((s0.particle_q.numpy(), stats))
    assert np.array_equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert sum(t for _, t, _, _ in stats) > sum(n for n, _, _, _ in stats) + 3     # trials beyond the first were taken


def drape_iterations(membrane_hessian: str, steps: int = 80, **options):
    """(Newton iterations, the solver, the iterations the steps' stats count as shifted) of a 15 × 15 bag-film sheet
    falling over a sphere for `steps` steps."""
    model, _ = sheet_on_sphere(15)
    solver = SolverIPC(model, membrane_hessian=membrane_hessian, **options)
    a, b = model.state(), model.state()
    its = shifted = 0
    for _ in range(steps):
        solver.step(a, b, None, None, 1 / 240)
        a, b = b, a
        its, shifted = its + solver.last_stats.newton_iterations, shifted + solver.last_stats.shifted
    return its, solver, shifted


def test_exact_membrane_hessian_on_a_drape():
    """A sheet draping over a sphere folds under compression: with the membrane's exact Hessian some Newton matrices
    are indefinite, refused and factorised shifted, and the drape takes fewer iterations than with the projected one
    (420 against 472 when written); absolute values are never indefinite (473 iterations: on a mesh this coarse they
    gain nothing); PCG, which cannot notice an indefinite matrix, turns "exact" into the projected form and "auto" into
    absolute values."""
    exact, s_exact, shifted = drape_iterations("exact")
    absolute, s_absolute, shifted_absolute = drape_iterations("absolute")
    projected, s_projected, _ = drape_iterations("projected")
    assert (s_exact.membrane.hessian, s_absolute.membrane.hessian, s_projected.membrane.hessian) == (
        "exact", "absolute", "projected")
    assert s_exact.linear.stats["indefinite"] > 0 and s_exact.linear.stats["shifted"] > 0
    assert s_projected.linear.stats["indefinite"] == 0 and s_absolute.linear.stats["indefinite"] == 0
    # the steps' stats count the iterations whose final matrix was shifted: none without an indefinite one
    assert 0 < shifted <= s_exact.linear.stats["shifted"] and shifted_absolute == 0
    # every block PSD (absolute values): with `reuse`, PARDISO solves on its kept factor; by default it never does
    _, s_kept, _ = drape_iterations("absolute", steps=20, linear_solver=PardisoSolver(reuse=REUSE_CG))
    assert s_kept.linear.stats["reused"] > 0 and s_absolute.linear.stats["reused"] == 0
    assert exact < 0.95 * projected, (exact, absolute, projected)
    model, _ = sheet_on_sphere(4)
    pcg = [SolverIPC(model, linear_solver="pcg", membrane_hessian=h).membrane.hessian for h in ("auto", "exact")]
    assert pcg == ["absolute", "projected"]
    assert SolverIPC(model, linear_solver="pcg", membrane_hessian="absolute").membrane.hessian == "absolute"
    with pytest.raises(ValueError, match="membrane_hessian"): SolverIPC(model, membrane_hessian="clipped")


def test_exact_membrane_on_trial_after_full_steps_and_friction_majorizer_after_cut_ones():
    """Where the "auto" rule has settled on absolute values, an iteration from `EXACT_FROM` on that follows a full
    step (α = 1) is a chance to assemble the exact membrane on trial: factorised without a shift, kept if PARDISO
    takes it, else the iteration is re-assembled with absolute values; after refusals the rule skips chances (1, 2,
    then 4), and the solver takes exactly the chances the rule allows. No other iteration changes form, and an
    explicit "absolute" never tries. After a cut step friction assembles its majorizing blocks. On this drape (when
    written): 459 iterations against 473 with absolute values alone; of 212 chances, 202 exact trials kept, 3 refused
    and 7 skipped."""
    model, _ = sheet_on_sphere(15)
    seen, friction, log = [], [], []
    solver = SolverIPC(model, observer=lambda i: (seen.append((i.iteration, i.alpha, solver.membrane.hessian,
                                                               solver._trial)),
                                                  friction.append(solver.friction.hessian)))
    rule = solver._auto
    rule.form = solver._late = "absolute"          # as the rule leaves a fine bag within its first 0.21 s
    chance, tried = rule.trial, rule.tried
    rule.trial = lambda: log.append(("chance", chance())) or log[-1][1]
    rule.tried = lambda refused: log.append(("tried", refused)) or tried(refused)
    a, b = model.state(), model.state()
    for _ in range(80):
        solver.step(a, b, None, None, 1 / 240)
        a, b = b, a
    # friction's majorizing blocks exactly in the iterations that follow a cut step (α < 1) of the same step
    cut = [it > 0 and prev[1] < 1.0 for (it, *_), prev in zip(seen, [(0, 1.0)] + seen[:-1])]
    assert friction == ["majorizer" if c else "exact" for c in cut] and any(cut)
    trials = absolute = 0
    for (it, alpha, form, trial), (_, prev_alpha, _, _) in zip(seen[1:], seen[:-1]):
        if it < EXACT_FROM:
            assert form == "projected" and not trial
        elif prev_alpha == 1.0:
            assert (form, trial) in (("exact", True), ("absolute", False)), (it, form, trial)
            trials, absolute = trials + trial, absolute + (not trial)
        else:
            assert (form, trial) == ("absolute", False), (it, form, trial)
    # every chance follows a full step: taken, it is kept (exact) or refused (absolute); skipped, it is absolute
    chances = [v for kind, v in log if kind == "chance"]
    refusals = [v for kind, v in log if kind == "tried"]
    assert len(chances) == trials + absolute and sum(chances) == len(refusals) == trials + sum(refusals)
    stats = solver.linear.stats
    assert trials > 0 and sum(refusals) > 0 and stats["shifted"] == 0 and stats["indefinite"] == sum(refusals)
    replay = MembraneHessianRule()                 # the solver took exactly the chances the rule's back-off allows
    for kind, v in log:
        if kind == "chance": assert replay.trial() == v
        else: replay.tried(v)
    its_absolute, s_absolute, _ = drape_iterations("absolute")
    assert s_absolute.linear.stats["indefinite"] == 0
    assert len(seen) < its_absolute, (len(seen), its_absolute, trials, sum(refusals), len(chances))


def test_a_refused_trial_writes_only_the_membranes_blocks_anew():
    """After a refused exact trial the iteration is assembled again in the rule's form by writing only the membrane's
    blocks anew (its gradient did not change) and scattering every block again: the matrix and right-hand side then
    factorised are, bit for bit, those of a whole assembly in that form."""
    model, _ = sheet_on_sphere(15)
    solver = SolverIPC(model)
    solver._auto.form = solver._late = "absolute"
    assemble, checked = solver._assemble, []

    def checking(x, again=False, redo=None):
        assemble(x, again, redo)
        if redo is not None:
            sys = solver.system
            H, rhs = sys.H.values.numpy().copy(), sys.rhs.numpy().copy()
            assemble(x)                         # every term run again, in the same form
            checked.append((redo is solver.membrane, solver.membrane.hessian, np.array_equal(H, sys.H.values.numpy()),
                            np.array_equal(rhs, sys.rhs.numpy())))
    solver._assemble = checking
    a, b = model.state(), model.state()
    for _ in range(80):
        solver.step(a, b, None, None, 1 / 240)
        a, b = b, a
    assert checked and all(c == (True, "absolute", True, True) for c in checked), checked
    assert len(checked) == solver.linear.stats["indefinite"]        # one retry per refused trial


def test_a_trial_that_leaves_a_diagonal_without_stiffness_is_refused():
    """An exact trial whose matrix has a diagonal entry that is not positive (compression took a particle's own
    stiffness; `flags[1]`) is refused like an indefinite one: the iteration is assembled again in the rule's form
    (absolute values, not the projected fallback of an exact rule) and the rule counts a refusal, so it backs off. The
    diagonal count is injected into the direction's read on every other trial of a drape."""
    model, _ = sheet_on_sphere(15)
    seen, log, injected = [], [], {}        # injected: trial number → whether its read got the bad diagonal
    solver = SolverIPC(model, observer=lambda i: seen.append((i.iteration, solver.membrane.hessian, solver._trial)))
    rule = solver._auto
    rule.form = solver._late = "absolute"
    tried = rule.tried
    rule.tried = lambda refused: log.append(refused) or tried(refused)
    read = solver._reads.read

    def read_with_a_bad_diagonal(*arrays):
        out = read(*arrays)
        if solver._trial and len(arrays) > 1 and arrays[1] is solver.system.flags:
            if injected.setdefault(len(log), len(log) % 2 == 0): out[1][1] = 1.0
        return out
    solver._reads.read = read_with_a_bad_diagonal
    a, b = model.state(), model.state()
    for _ in range(30):
        solver.step(a, b, None, None, 1 / 240)
        a, b = b, a
    assert sum(injected.values()) > 0 and all(log[k] for k, bad in injected.items() if bad), (log, injected)
    assert sum(log[k] for k, bad in injected.items() if not bad) <= solver.linear.stats["indefinite"]
    assert all((form, trial) in (("exact", True), ("absolute", False)) for it, form, trial in seen if it >= EXACT_FROM)


def test_fp32_check_covers_every_candidate_within_dhat():
    """The end-of-step FP32 rounding check runs over the candidates within d̂ at the rounded positions
    (`barrier.near(x, 0)`), not every candidate: on a sheet draped over a sphere, after each step every candidate whose
    gap there is below d̂ is among them, with the same gap, so no gap the check could find lost is left out."""
    model, _ = sheet_on_sphere(15)
    solver = SolverIPC(model)
    a, b = model.state(), model.state()
    close_ones = 0
    for _ in range(40):
        solver.step(a, b, None, None, 1 / 240)
        a, b = b, a
        x = wp.array(a.particle_q.numpy().astype(np.float64), dtype=wp.vec3d)
        solver.search.update(x, x)
        every = fp32_gaps(solver.search.contacts, x)
        near = fp32_gaps(solver.barrier.near(x, 0.0), x)
        dhat = solver.barrier.dhat
        np.testing.assert_array_equal(np.sort(every[every < dhat]), np.sort(near[near < dhat]))
        close_ones += int(np.sum(every < dhat))
    assert close_ones > 0


def test_terms_that_declare_psd_write_psd_blocks():
    """A term's `psd` lets a linear solver keep a factorisation, so it must be true: on a sheet draped over a sphere
    (contacts, friction), with supports and a tie compressed to half its rest lengths, every term that declares it
    writes blocks that sum to a PSD matrix, in each of its Hessian forms; the forms that do not (the exact membrane
    and barrier, the tie unprojected) do not declare it."""
    model, _ = sheet_on_sphere(15)
    solver = SolverIPC(model)
    a, b = model.state(), model.state()
    for _ in range(40):
        solver.step(a, b, None, None, 1 / 240)
        a, b = b, a
    x = a.particle_q.numpy().astype(np.float64)
    film = np.arange(15 * 15)
    solver.supports.set(film[:5], x[:5] + 1e-3, 50.0)
    pairs = np.stack([film[:7], film[-7:]], 1)
    solver.tie.set(pairs, 2 * np.linalg.norm(x[pairs[:, 0]] - x[pairs[:, 1]], axis=1))       # compressed to half
    xw = wp.array(x, dtype=wp.vec3d, device=solver.device)
    forms = {solver.membrane: ("projected", "absolute", "exact"),
             solver.barrier: ("gauss-newton", "projected", "exact")}
    declared = {}
    for term in solver.terms:
        for form in forms.get(term, (None,)):
            if form is not None: term.hessian = form
            term.prepare(xw)
            _, _, H = term_derivatives(term, x)
            lo, hi = np.linalg.eigvalsh(H)[[0, -1]]
            assert hi > 0 or term is solver._drag, type(term).__name__          # every term but the drag is at work
            assert not (term.psd and lo < -1e-9 * hi), (type(term).__name__, form, lo, hi)
            declared[type(term).__name__, form] = term.psd
    assert not declared["MembraneTerm", "exact"] and not declared["BarrierTerm", "exact"]
    assert all(p for (_, form), p in declared.items() if form != "exact"), declared
    solver.tie.project = False                  # the compressed tie's own Hessian is indefinite, and says so
    assert not solver.tie.psd and np.linalg.eigvalsh(term_derivatives(solver.tie, x)[2])[0] < 0
