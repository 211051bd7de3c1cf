"""Every argument of `run_bag` and of the commands is checked before anything is computed, with one line that says what
was wrong and what to do; one run per output file; a full disk found at the first write."""
import errno
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import warp as wp

import newtonipc_nb.scenes.bag_run as bag_run
from newtonipc_nb.scenes.bag_cli import main
from newtonipc_nb.scenes.bag_run import BadInput, load_trajectory, output_lock, run_bag
from newtonipc_nb.scenes.bag_scene import DT, bag_mesh
from newtonipc_nb.scenes.reference import hinge_scene
from newtonipc_nb.solver import SolverIPC

from cli_helpers import BAG, VALIDATE, cli, fake_run, in_process, one_line, sigint_default

@pytest.fixture
def nothing_computed(monkeypatch):
    "Fail the test if the scene is built (the first thing a run computes)."
    def build(*a, **k): raise AssertionError("the scene was built before the refusal")
    monkeypatch.setattr(bag_run.BagScene, "build", build)


# --- run_bag: every argument refused before anything is built, in the command's words
# -------------------------------------
@pytest.mark.parametrize("kwargs, says, cli_args", [
    (dict(every=0), "every: 0 is out of range: give a whole number ≥ 1", ["--every", "0"]),
    (dict(every=1.5), "every: 1.5 is not a whole number", None),
    (dict(until=math.nan), "until: nan is out of range: give a finite time in seconds ≥ 0.00416667", ["--until", "nan"
                                                                                                      ]),
    (dict(until=-1), "until: -1 is out of range: give a finite time in seconds ≥ 0.00416667", ["--until", "-1"]),
    (dict(save_every=-1.0), "save_every: -1 is out of range: give a finite time in seconds ≥ 0", ["--save-every", "-1"
                                                                                                  ]),
    (dict(resume="x.npz",
          resume_at=math.nan), "resume_at: nan is out of range: give a finite time in seconds > 0", None),
    (dict(timeline="garbage"), "timeline: a list of rows (start s, end s, action, group, parameters, what), got str",
     None),
    (dict(timeline=[(0.0, 1.0, "wave", "neck", {}, "")]), "timeline row 0: unknown action 'wave'", None),
    (dict(timeline=[(0.0, 1.0, "hold", "elbow", {}, "")]), "timeline row 0: unknown support group 'elbow'", None),
    (dict(timeline=[(1.0, 0.5, "hold", "neck", {}, "")]), "timeline row 0: 0.5 is out of range", None),
    (dict(out="/nonexistent/x.npz"), "out /nonexistent/x.npz: the directory /nonexistent does not exist", None),
    (dict(out=""), "out: an empty path; give the name of a file to write", None),
    (dict(resolution=3), "resolution: bag mesh resolution must be one of 1, 2, 4, got 3", None),
    (dict(progress="yes"), "progress: True or False", None),
    (dict(on_save=1), "on_save: a callable", None),
    (dict(resume=5), "resume: a path to a saved run or a dict of its arrays, got int", None),
    (dict(device="tpu"), "device tpu: not a device of this machine", None),
    (dict(kapa=1.0), "kapa: neither an argument of run_bag nor an option of SolverIPC", None),
    (dict(hinge_rule="plate"), "hinge_rule: 'plate' is not a hinge rule; give one of calibrated, reference", None),
])
def test_run_bag_refuses_bad_arguments_before_building_anything(kwargs, says, cli_args, nothing_computed, tmp_path):
    with pytest.raises(BadInput) as e:
        run_bag(**{"until": 0.1, "progress": False, **kwargs})
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    if cli_args:        # the command says the same after its option's name
        r = in_process(BAG, *cli_args, "--out", tmp_path / "x.npz")
        one_line(r, 2, says.split(": ", 1)[1])


def test_cli_refuses_an_unknown_hinge_rule(nothing_computed, tmp_path):
    r = in_process(BAG, "--hinge-rule", "plate", "--out", tmp_path / "x.npz")
    one_line(r, 2, "argument --hinge-rule: invalid choice: 'plate' (choose from 'calibrated', 'reference')")
    assert list(tmp_path.iterdir()) == []


def test_run_bag_checks_a_resume_dict_and_until_first(nothing_computed, tmp_path):
    d = load_trajectory(fake_run(tmp_path / "r.npz"))
    with pytest.raises(BadInput, match="until 0.0125: the run resumed at t = 0.0167 s has nothing left to compute; "
                                       "give a later until"):
        run_bag(3 * DT, resume=d, progress=False)
    d["faces"] = d["faces"].astype(np.float64)
    with pytest.raises(BadInput, match="resume: faces holds float64 values, a saved run stores integer vertex "
                                       "indices there"):
        run_bag(0.1, resume=d, progress=False)


@pytest.mark.skipif(wp.is_cuda_available(), reason="this machine has a CUDA device")
def test_device_cuda_without_a_gpu_is_bad_input(nothing_computed, tmp_path):
    with pytest.raises(BadInput, match="device cuda: this machine has no CUDA device"):
        run_bag(0.1, device="cuda", progress=False)
    r = in_process(BAG, "--device", "cuda", "--until", 0.1, "--out", tmp_path / "x.npz")
    one_line(r, 2, "--device cuda: this machine has no CUDA device (Warp found none); give --device cpu")
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


# --- saved runs: every array checked before the first step
# --------------------------------------------------------------
@pytest.mark.parametrize("make, says", [
    (lambda p: fake_run(p, time=np.array(["0", "a", "b", "c", "d"])), "time holds <U1 values, a saved run stores "
     "floating-point times in seconds there"),
    (lambda p: fake_run(p, faces=bag_mesh()[1].astype(np.float64)), "faces holds float64 values, a saved run "
     "stores integer vertex indices there"),
    (lambda p: fake_run(p, faces=bag_mesh()[1][::-1].copy()), "its faces are not those of the bag mesh at "
     "resolution 1"),
    (lambda p: fake_run(p, film=np.ones((5, 481, 3), np.int32)), "film holds int32 values"),
    (lambda p: fake_run(p, step_t=np.arange(2) * DT), "step_t has shape (2,)"),
    (lambda p: fake_run(p, step_t=np.zeros((4, 2))), "step_t has shape (4, 2)"),
    (lambda p: fake_run(p, resolution=np.array([1, 1])), "resolution has shape (2,), a saved run stores one value "
     "there"),
    (lambda p: fake_run(p, resolution=np.asarray("one")), "resolution holds <U3 values"),
    (lambda p: fake_run(p, time=np.r_[0.0, 2.0, 1.0, 3.0, 4.0] * DT), "its times do not increase (frame 2 at t = "
     "0.0042 s)"),
    (lambda p: (p.write_text('{"stopped": "completed", "frames": 3}'), p)[1], "a JSON text, not a saved trajectory"),
    (lambda p:
     (np.save(p.with_suffix(".npy"), np.zeros(3)), p.with_suffix(".npy").rename(p), p)[2], "a single .npy array"),
])
def test_cli_refuses_a_bad_resume_file_at_once(make, says, tmp_path):
    f = make(tmp_path / "saved.npz")
    r = in_process(BAG, "--resume", f, "--out", tmp_path / "new.npz", "--until", 0.1, "--device", "cpu")
    line = one_line(r, 2, f"--resume {f}: ", says)
    assert "allow_pickle" not in line and r.stdout == "", "refused before the run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved.npz"]


def test_resume_of_the_json_table_names_the_trajectory(tmp_path):
    table = tmp_path / "run.json"
    table.write_text('{"stopped": "completed at t = 0.0125 s", "frames": 4, "measurements": []}')
    line = one_line(in_process(BAG, "--resume", table, "--out", tmp_path / "b.npz", "--until", 0.1), 2,
                    f"--resume {table}")
    assert "give the .npz" in line and "pickle" not in line


# --- the solver: a step too small to mean anything
# -------------------------------------------------------------------------
def test_tiny_dt_is_refused_in_words_without_a_warning():
    model, s0 = hinge_scene("vt", device="cpu")
    solver, s1 = SolverIPC(model), model.state()
    before = s1.particle_q.numpy().copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"dt = 1e-300 s is below 1e-12 s: .*give a step ≥ 1e-12 s"):
            solver.step(s0, s1, None, None, 1e-300)
    assert np.array_equal(s1.particle_q.numpy(), before)


# --- newtonipc-validate: an empty --report is refused
# -------------------------------------------------------------------------
@pytest.mark.parametrize("argv, says", [(["--report", ""], "--report: an empty path"),
                                        (["--full", "--bag-out", ""], "--bag-out: an empty path")])
def test_validate_refuses_empty_output_paths(argv, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = in_process(VALIDATE, *argv)
    one_line(r, 2, "newtonipc-validate: " + says, "give the name of a file to write")
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


# --- Ctrl-C while the command starts: one line, 130
# ------------------------------------------------------------------------
def _wait_for_numpy(p, timeout=120):
    "Wait until process `p` has loaded NumPy's core library: the first heavy import, made inside the launcher's guard."
    maps, deadline = Path(f"/proc/{p.pid}/maps"), time.time() + timeout
    while time.time() < deadline and p.poll() is None and "_multiarray_umath" not in maps.read_text():
        time.sleep(0.02)


@pytest.mark.parametrize("prog, args", [(BAG, ["--until", "0.1"]), (VALIDATE, [])])
def test_ctrl_c_during_start_up_is_one_line_and_130(prog, args, tmp_path):
    p = subprocess.Popen([str(prog), *args, *(["--out", str(tmp_path / "x.npz")] if prog == BAG else [])],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                         preexec_fn=sigint_default)
    _wait_for_numpy(p)              # the launcher is running: it is importing Warp, Newton and torch for seconds more
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    one_line(r, 130, f"{prog.name}: interrupted")
    assert "nothing was" in err and list(tmp_path.iterdir()) == []


# --- one run per output file
# ---------------------------------------------------------------------------------------------
def test_a_second_run_on_the_same_out_is_refused_and_the_first_completes(tmp_path):
    out, until = tmp_path / "same.npz", 0.1
    err = tmp_path / "first.err"
    with open(err, "w") as e:
        first = subprocess.Popen(
            [str(BAG), "--until",
             str(until), "--out",
             str(out), "--device", "cpu", "--save-every", "0"], stdout=subprocess.DEVNULL, stderr=e,
            preexec_fn=sigint_default)
        try:
            t0 = time.monotonic()
            # the first holds the lock and has saved
            while not (out.exists() and len(load_trajectory(out)["time"]) >= 2):
                assert first.poll() is None and time.monotonic() - t0 < 600, err.read_text()[-2000:]
                time.sleep(0.05)
            # paused mid-run, lock held, while the second starts: no race with its end
            first.send_signal(signal.SIGSTOP)
            try:
                second = cli(BAG, "--until", 0.0875, "--out", out, "--device", "cpu", "--save-every", "0")
            finally:
                first.send_signal(signal.SIGCONT)
            one_line(second, 2, f"--out {out}: another run is writing it (process {first.pid} holds same.npz.lock)",
                     "wait for it to finish or give another --out")
            assert "stored in" not in second.stdout, "the second computed nothing"
            assert first.wait(900) == 0, err.read_text()[-2000:]
        finally:
            if first.poll() is None: first.kill()
    d = load_trajectory(out)
    n = round(until / DT)
    assert len(d["time"]) == n + 1 and len(d["step_t"]) == n and str(d["stopped"]).startswith("completed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.err", "same.json",
                                                          "same.npz"], "no lock or temporary file left"


def test_run_bag_refuses_an_out_locked_by_another_process(nothing_computed, tmp_path):
    out = tmp_path / "x.npz"
    code = (f"import sys, time; from newtonipc_nb.scenes.bag_run import output_lock\nwith "
               f"output_lock({str(out)!r}):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BadInput, match=rf"out {out}: another run is writing it \(process {holder.pid} holds "
                                           rf"x.npz.lock\)"):
            run_bag(0.1, out=out, progress=False)
    finally:
        holder.kill()
        holder.wait()
    with output_lock(out) as lock:                # the kernel dropped the dead holder's lock; nested holders share it
        with output_lock(out):
            assert lock.read_text().strip() == str(os.getpid())
    assert not lock.exists()


# --- a full disk: found at the first write, after one step
# ------------------------------------------------------------------
def test_full_disk_at_the_first_write_stops_after_one_step(tmp_path, monkeypatch, capsys):
    writes = []
    def full(f, arrays, frames=None):
        writes.append(f)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
    monkeypatch.setattr(bag_run, "write_npz", full)
    out = tmp_path / "run.npz"
    assert main(["--until", "0.1", "--out", str(out), "--device", "cpu"]) == 1       # the default --save-every, 5 s
    # no progress bar
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip() and not l.startswith("bag:")]
    assert len(err) == 1 and len(writes) == 1, err
    assert (f"could not write {out}: No space left on device; the run stopped at this first failed write, after t = "
               f"0.0042 s") in err[0]
    assert "this run wrote nothing there" in err[0]
    assert list(tmp_path.iterdir()) == []
