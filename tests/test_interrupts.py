"""A step is a transaction for the solver's own state: a KeyboardInterrupt at any stage boundary of `SolverIPC.step` —
inside the pattern update, the analysis, the factorisation, the candidate search, the friction lag, the Newton loop —
leaves the solver able to take the step again, to the result of a solver that was never interrupted."""
import numpy as np
import pytest
import warp.sparse as wps

import newtonipc_nb.solver as solver_module
from newtonipc_nb.barrier import BarrierTerm
from newtonipc_nb.candidates import CandidateSearch
from newtonipc_nb.friction import FrictionTerm
from newtonipc_nb.line_search import LineSearch
from newtonipc_nb.linear import NewtonSystem, PardisoSolver, ScalarCSR
from newtonipc_nb.scenes.bag_run import apply_controls
from newtonipc_nb.scenes.bag_scene import BagScene
from newtonipc_nb.scenes.choreography import Choreographer
from newtonipc_nb.scenes.reference import hinge_scene
from newtonipc_nb.solver import SolverIPC

DT, STEPS = 1 / 240, 8


def make(kind, **options):
    """A hinge falling onto an obstacle (contact, friction and a growing pattern within the first steps); one MKL
    thread: bitwise repeatable."""
    model, s0 = hinge_scene(kind, device="cpu")
    return SolverIPC(model, membrane="stvk", linear_solver=PardisoSolver(threads=1), **options), s0, model.state()


def reference(kind):
    "Positions and velocities after each of STEPS uninterrupted steps."
    solver, a, b = make(kind)
    out = []
    for _ in range(STEPS):
        solver.step(a, b, None, None, DT)
        a, b = b, a
        out.append((a.particle_q.numpy().copy(), a.particle_qd.numpy().copy()))
    return out


# (where, attribute, before or after the real call, which call fires, a condition on the call's arguments)
POINTS = {
    "first analysis: its scalar pattern built": (ScalarCSR, "__init__", "after", 1, None),
    "analysis (PARDISO phase 11) done": (PardisoSolver, "_run", "after", 1, lambda a: a[1] == 11),
    "factorisation: values gathered, PARDISO not run": (PardisoSolver, "_run", "before", 1, lambda a: a[1] == 22),
    "factorisation (PARDISO phase 22) done": (PardisoSolver, "_run", "after", 2, lambda a: a[1] == 22),
    "solve (PARDISO phase 33) done": (PardisoSolver, "_run", "after", 2, lambda a: a[1] == 33),
    "pattern update: right after bsr_set_from_triplets": (wps, "bsr_set_from_triplets", "after", 1, None),
    "assembly done (blocks scattered, nothing read)": (SolverIPC, "_assemble", "after", 2, None),
    "pattern settled from the read-back flags": (NewtonSystem, "settle", "after", 2, None),
    "equilibration done": (NewtonSystem, "finish", "after", 2, None),
    "prediction set": (SolverIPC, "_predict", "after", 1, None),
    "candidate query done, set not yet counted": (CandidateSearch, "_query", "after", 1, None),
    "candidate build done": (CandidateSearch, "build", "after", 1, None),
    "start gaps screened": (BarrierTerm, "min_gap", "after", 1, None),
    "near candidates selected": (BarrierTerm, "near", "after", 2, None),
    "friction lagged": (FrictionTerm, "lag", "after", 1, None),
    "extrapolation done": (SolverIPC, "_extrapolate", "after", 1, None),
    "step bound done": (SolverIPC, "_step_bound", "after", 2, None),
    "line search done": (SolverIPC, "_line_search", "after", 1, None),
    "second Newton iteration done": (SolverIPC, "_iteration", "after", 2, None),
    "FP32 recheck done": (solver_module, "fp32_gap_check", "after", 1, None),
    "attempt done, state_out not written": (SolverIPC, "_solve", "after", 1, None),
}


class Trap:
    "Raises KeyboardInterrupt at the `nth` matching call while armed, once."
    def __init__(self, nth): self.nth, self.calls, self.armed, self.fired = nth, 0, False, False
    def hit(self):
        self.calls += 1
        if self.calls == self.nth:
            self.armed, self.fired = False, True
            raise KeyboardInterrupt


def install(monkeypatch, point):
    owner, name, when, nth, cond = {**POINTS, **BATCHED_POINTS}[point]
    real, trap = getattr(owner, name), Trap(nth)
    def wrapped(*a, **k):
        match = trap.armed and (cond is None or cond(a))
        if match and when == "before": trap.hit()
        r = real(*a, **k)
        if match and when == "after": trap.hit()
        return r
    monkeypatch.setattr(owner, name, wrapped)
    return trap


@pytest.fixture(scope="module")
def references():
    return {k: reference(k) for k in ("vt", "ee")}


# the batched line search (CUDA's default): its first batch goes with the direction, the later ones have a read each
BATCHED_POINTS = {
    "first line-search batch launched with the direction": (SolverIPC, "_launch_first_batch", "after", 2, None),
    "a line-search batch launched, not read": (LineSearch, "launch", "after", 3, None),
    "line search done": POINTS["line search done"],
    "second Newton iteration done": POINTS["second Newton iteration done"],
}


@pytest.mark.parametrize("kind", ["vt", "ee"])
@pytest.mark.parametrize("point", list(POINTS))
def test_interrupted_step_retakes_the_uninterrupted_result(point, kind, references, monkeypatch):
    retake(point, kind, references, monkeypatch)


@pytest.mark.parametrize("kind", ["vt", "ee"])
@pytest.mark.parametrize("point", list(BATCHED_POINTS))
def test_interrupted_batched_line_search_retakes_the_uninterrupted_result(point, kind, references, monkeypatch):
    "With line_search_batch=4 the interrupted solver retakes the sequential search's uninterrupted result, bit for bit."
    retake(point, kind, references, monkeypatch, line_search_batch=4)


def retake(point, kind, references, monkeypatch, **options):
    "Interrupt one solver at `point` once and step on; every step must equal the uninterrupted reference."
    ref = references[kind]
    solver, a, b = make(kind, **options)
    trap = install(monkeypatch, point)
    fired_at = None
    for j in range(STEPS):
        if fired_at is None:
            trap.armed = True
            try:
                solver.step(a, b, None, None, DT)
            except KeyboardInterrupt:
                fired_at = j
                solver.step(a, b, None, None, DT)        # the same solver takes the same step again
            trap.armed = False
        else:
            solver.step(a, b, None, None, DT)
        a, b = b, a
        q, qd = ref[j]
        assert np.abs(a.particle_q.numpy() - q).max() <= 1e-12, (point, j, fired_at)
        assert np.abs(a.particle_qd.numpy() - qd).max() <= 1e-12, (point, j, fired_at)
    assert fired_at is not None, f"{point}: never reached in {STEPS} steps"


def _bag_step(scene, ch, k):
    "Step k + 1 of the bag scene: its controls, then the solver (as run_bag does)."
    apply_controls(scene, ch.controls((k + 1) * DT, scene.positions()))
    scene.solver.step(scene.state, scene.scratch, None, None, DT)


def test_interrupted_bag_steps_retake_the_uninterrupted_result(monkeypatch):
    """The bag scene (hundreds of candidates, friction, a pattern that grows): one solver interrupted at each of several
    stage boundaries in turn, step after step, stays on the trajectory of one that never was."""
    def scene():
        s = BagScene.build("cpu", 1, linear_solver=PardisoSolver(threads=1))
        return s, Choreographer(None, resolution=1)
    ref, ch = scene()
    expected = []
    for k in range(BAG_STEPS):
        _bag_step(ref, ch, k)
        ref.state, ref.scratch = ref.scratch, ref.state
        expected.append(ref.state.particle_q.numpy().copy())
    sc, ch = scene()
    traps = [(p, install(monkeypatch, p)) for p in BAG_POINTS]
    fired, k = [], 0
    for point, trap in traps:
        while k < BAG_STEPS:
            trap.armed = True
            try:
                _bag_step(sc, ch, k)
            except KeyboardInterrupt:
                fired.append(point)
                sc.solver.step(sc.state, sc.scratch, None, None, DT)    # the controls are set: take the step again
            trap.armed = False
            sc.state, sc.scratch = sc.scratch, sc.state
            assert np.abs(sc.state.particle_q.numpy() - expected[k]).max() <= 1e-12, (point, k)
            k += 1
            if trap.fired: break
    assert fired == BAG_POINTS, f"reached {fired} of {BAG_POINTS} in {BAG_STEPS} steps"


BAG_STEPS = 40
BAG_POINTS = ["pattern update: right after bsr_set_from_triplets",     # the bag's pattern grows in the first steps only
              "attempt done, state_out not written", "second Newton iteration done", "friction lagged",
              "candidate query done, set not yet counted", "factorisation (PARDISO phase 22) done",
              "line search done"]                                         # the first steps need none: the bag rests
