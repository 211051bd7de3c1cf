"""newtonipc-sweep: bad sweep files refused in one line; the same rows on the embedded cluster and on a hand-started
TCP cluster; a worker killed mid-sweep; a rerun after Ctrl-C runs only the missing tasks; failed rows and
--retry-failed; the command behind the start-up launcher.

Starting Dask worker processes is what these tests spend their time on (each imports Warp, Newton and torch and builds
the scene once), so the runs are three steps long, and one hand-started cluster serves the TCP, Ctrl-C and worker-loss
tests (the worker-loss test, which kills one of its workers, comes last)."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from cli_helpers import sigint_default

from newtonipc_nb.scenes.bag_run import BadInput
from newtonipc_nb.scenes.bag_scene import DT
from newtonipc_nb.scenes.sweep import (RUN_METADATA, THREAD_ENV, Task, main, pending, read_row, read_sweep, run_sweep,
                                       run_task)

BIN = Path(sys.executable).parent
# Four runs of three steps whose keys change the film's motion from the first step (the tie only acts at 8.4 s)
GRID = """name = "grid"
[base]
until = 0.0125
[grid]
E = [2.0e8, 3.15e8]
friction = [0.2, 0.35]
"""


def rows(table: pd.DataFrame) -> pd.DataFrame:
    "A sweep's table without the columns that differ between two runs of the same task (times, worker)."
    return table.drop(columns=[c for c in RUN_METADATA if c in table.columns]).reset_index(drop=True)


def exit_code(argv) -> int:
    "`newtonipc-sweep argv`'s exit code, run in this process (argparse's errors exit through SystemExit)."
    try: return main(argv)
    except SystemExit as e: return e.code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HandCluster:
    "`dask scheduler` and `dask worker` processes on localhost over TCP, as a user starts them; stopped on exit."
    def __init__(self, tmp: Path, n_workers: int = 2):
        self.address = f"tcp://127.0.0.1:{free_port()}"
        env = {**os.environ, **THREAD_ENV}
        log = open(tmp / "cluster.log", "ab")
        port = self.address.rsplit(":", 1)[1]
        scheduler = [BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", port, "--no-dashboard"]
        self.procs = [subprocess.Popen(scheduler, stdout=log, stderr=log, env=env)]
        self.workers = [subprocess.Popen([BIN / "dask", "worker", self.address, "--nthreads", "1", "--no-nanny",
                                          "--no-dashboard", "--name", f"w{i}"], stdout=log, stderr=log, env=env)
                        for i in range(n_workers)]
        self.procs += self.workers
        self.n_workers = n_workers

    def __enter__(self):
        from dask.distributed import Client
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                with Client(self.address, timeout="5s") as c:
                    if len(c.scheduler_info(n_workers=-1)["workers"]) == self.n_workers: return self
            except OSError: pass
            time.sleep(1)
        self.__exit__()
        raise RuntimeError(f"the hand-started cluster at {self.address} did not come up")

    def __exit__(self, *exc):
        for p in self.procs[::-1]:
            if p.poll() is None: p.terminate()
        for p in self.procs:
            try: p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    "The 2 × 2 sweep file and its rows on the embedded LocalCluster with 2 workers."
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "grid.toml").write_text(GRID)
    sweep = read_sweep(tmp / "grid.toml")
    table = run_sweep(sweep, tmp / "local", workers=2, progress=False, say=lambda m: None)
    assert (table["status"] == "done").all(), table[["status", "error"]]
    return tmp, sweep, table


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    "One `dask scheduler` and two `dask worker` processes over TCP for the module's cluster tests."
    with HandCluster(tmp_path_factory.mktemp("hand")) as cluster:
        yield cluster


def test_bad_files_one_line_exit_2(tmp_path, capsys):
    bad = {"unknown.toml": ("[grid]\ntie_shrnk = [0.1, 0.2]\n",
                            "[grid] tie_shrnk: unknown key (did you mean 'tie_shrink'?)"),
           "value.toml": ("[grid]\ntie_shrink = [0.2, 1.5]\n", "[grid] tie_shrink must be in (0, 1], got 1.5"),
           "type.toml": ("[base]\nuntil = 'long'\n", "[base] until must be a finite time"),
           "solver.toml": ("[[variants]]\nname = 'x'\nkappa = -1.0\n",
                           "[[variants]] 'x' kappa must be a finite number > 0"),
           "table.toml": ("[gird]\nE = [1e8]\n", "gird: unknown top-level key"),
           "toml.toml": ("[grid\n", "not valid TOML"),
           "binary.toml": (b"\xff\xfe\x00", "cannot read it"),
           "hinge.toml": ("[base]\nhinge_rule = 'plate'\n",
                          "[base] hinge_rule must be one of calibrated, reference, got 'plate'")}
    for name, (text, expected) in bad.items():
        p = tmp_path / name
        p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
        assert exit_code([str(p)]) == 2, name
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, (name, err)
        assert expected in err and str(p) in err, (name, err)
        assert not p.with_suffix("").exists(), name          # no sweep folder: nothing started
    for argv, expected in (([str(tmp_path / "none.toml")], "none.toml: no such file"),
                           ([str(tmp_path)], "is a directory, not a sweep file"),
                           ([str(tmp_path / "value.toml"), "--workers", "0"], "--workers")):
        assert exit_code(argv) == 2, argv
        out, err = capsys.readouterr()
        assert expected in err and len(err.strip().splitlines()) == 1, err


def test_the_command_starts_through_the_launcher(tmp_path, monkeypatch, capsys):
    import configparser
    import importlib
    import newtonipc_nb.scenes.sweep as sweep_module
    from newtonipc_nb.scenes import launch
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).parents[1] / "settings.ini")
    assert "newtonipc-sweep=newtonipc_nb.scenes.launch:sweep" in cfg["DEFAULT"]["console_scripts"].split()
    (tmp_path / "s.toml").write_text("[grid]\nE = [2.0e8, 3.15e8]\n")     # no solver key: no scene built to check it

    def lost(*args, **kwargs): raise OSError("Timed out trying to connect to tcp://10.0.0.9:8786 after 20 s")
    monkeypatch.setattr(sweep_module, "run_sweep", lost)                  # the cluster fails, not a run
    assert launch.sweep([str(tmp_path / "s.toml")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == ("newtonipc-sweep: the sweep stopped: OSError: Timed out trying to connect to "
                                 "tcp://10.0.0.9:8786 after 20 s (--debug for the traceback)\n")

    def interrupted(name, *args, **kwargs): raise KeyboardInterrupt      # a Ctrl-C while the packages load
    monkeypatch.setattr(importlib, "import_module", interrupted)
    assert launch.sweep([str(tmp_path / "s.toml")]) == 130
    assert capsys.readouterr().err == ("newtonipc-sweep: interrupted while starting (Ctrl-C); "
                                       "nothing was computed or written\n")


def test_hinge_rule_reaches_run_bag(tmp_path, monkeypatch):
    "A sweep's `hinge_rule` is the rule `run_bag` builds the scene with (`newtonipc-bag --hinge-rule`'s values)."
    import newtonipc_nb.scenes.sweep as sweep_module
    (tmp_path / "h.toml").write_text('[base]\nuntil = 0.0125\n[grid]\nhinge_rule = ["calibrated", "reference"]\n')
    sweep = read_sweep(tmp_path / "h.toml")
    real, rules = sweep_module.run_bag, []

    def recording(*args, **kwargs):
        rules.append(kwargs.get("hinge_rule"))
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "run_bag", recording)
    rows = [run_task(t, tmp_path) for t in sweep.tasks]
    assert rules == ["calibrated", "reference"]
    assert [(r["hinge_rule"], r["status"], r["frames"]) for r in rows] == [("calibrated", "done", 4),
                                                                          ("reference", "done", 4)]


def test_failed_run_is_a_row_and_reruns_only_with_retry(tmp_path):
    (tmp_path / "s.toml").write_text("[grid]\nuntil = [0.0125]\n")
    sweep = read_sweep(tmp_path / "s.toml")
    broken = Task("broken", "", dict(until=3 * DT, max_iterations=0))    # refused by SolverIPC inside the task
    row = run_task(broken, tmp_path)
    assert row["status"] == "failed" and row["error"].startswith("ValueError: SolverIPC: option max_iterations")
    assert "\n" not in row["error"] and read_row(tmp_path, broken)["status"] == "failed"
    assert pending(sweep, tmp_path) == sweep.tasks
    swept = Task(sweep.tasks[0].id, "", dict(until=3 * DT, max_iterations=0))
    run_task(swept, tmp_path)                                             # the sweep's task, failed
    assert pending(sweep, tmp_path) == [] and pending(sweep, tmp_path, retry_failed=True) == sweep.tasks


def test_same_rows_on_a_hand_started_tcp_cluster(grid, hand):
    tmp, sweep, local = grid
    table = run_sweep(sweep, tmp / "tcp", scheduler=hand.address, progress=False, say=lambda m: None)
    pd.testing.assert_frame_equal(rows(table), rows(local))
    assert len({w.split(":")[1] for w in table["worker"]}) == 2         # both workers ran tasks
    assert (tmp / "tcp" / "sweep.parquet").exists() and (tmp / "tcp" / "sweep.csv").exists()
    pd.testing.assert_frame_equal(rows(pd.read_parquet(tmp / "tcp" / "sweep.parquet")), rows(local))
    said = []
    run_sweep(sweep, tmp / "tcp", progress=False, say=said.append)        # nothing left: no cluster is even joined
    assert said == [f"4 runs: 4 already in {tmp / 'tcp'}, 0 to run"]


def test_rerun_after_ctrl_c_runs_only_missing_tasks(tmp_path, hand, capsys):
    (tmp_path / "three.toml").write_text("[base]\nuntil = 0.0125\n[grid]\nfriction = [0.2, 0.3, 0.35]\n")
    folder = tmp_path / "three"
    p = subprocess.Popen([BIN / "newtonipc-sweep", tmp_path / "three.toml", "--workers", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         preexec_fn=sigint_default)  # the embedded cluster, one run at a time
    deadline = time.time() + 300
    while not list(folder.glob("*.json")) and time.time() < deadline and p.poll() is None: time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 130, out
    assert "interrupted:" in out and "run the same command again" in out
    first = {f.name: f.stat().st_mtime_ns for f in folder.glob("*.json")}
    assert 1 <= len(first) < 3, first
    done = pd.read_csv(folder / "sweep.csv")
    assert (done["status"] == "done").sum() == len(first)                    # the table holds the finished rows
    assert exit_code([str(tmp_path / "three.toml"), "--scheduler", hand.address]) == 0     # rerun on the warm cluster
    assert f"3 runs: {len(first)} already in {folder}, {3 - len(first)} to run" in capsys.readouterr().err
    assert all(folder.joinpath(n).stat().st_mtime_ns == m for n, m in first.items())   # the finished row untouched
    assert (pd.read_parquet(folder / "sweep.parquet")["status"] == "done").all()


def test_worker_killed_mid_sweep(grid, hand):
    """Runs last of the cluster tests: it leaves the hand-started cluster one worker short. The worker is killed through
    a second client of this process, made after the sweep's own (so it is the default client) and closed while the
    sweep still runs: the sweep must wait on its own client, or it never sees the rest of its tasks finish."""
    from dask.distributed import Client
    tmp, sweep, local = grid
    result, killers = {}, []

    def say(message):
        if message.startswith("Dask:"): killers.append(Client(hand.address))     # between the client and the submits

    t = threading.Thread(target=lambda: result.update(table=run_sweep(sweep, tmp / "killed", scheduler=hand.address,
                                                                      progress=False, say=say)),
                         daemon=True)       # if the sweep never ends, the failed test must not hang pytest's exit
    t.start()
    deadline = time.time() + 300
    while not killers and time.time() < deadline and t.is_alive(): time.sleep(0.02)
    assert killers, "the sweep never joined the cluster"
    killed = None
    with killers[0] as c:
        pids = c.run(os.getpid)
        while killed is None and time.time() < deadline and t.is_alive():
            busy = [w for w, tasks in c.call_stack().items() if tasks]        # executing a run, not only assigned one
            if busy:
                killed = pids[busy[0]]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.02)
    t.join(timeout=300)
    assert killed is not None and not t.is_alive()
    table = result["table"]
    assert (table["status"] == "done").all()
    assert all(int(w.split(":")[1]) != killed for w in table["worker"])   # every row came from the surviving worker
    pd.testing.assert_frame_equal(rows(table), rows(local))


def test_resume_key_continues_a_saved_run(tmp_path):
    run_task(Task("prefix", "", dict(until=4 * DT)), tmp_path)
    (tmp_path / "r.toml").write_text('[base]\nuntil = 0.025\nresume = "prefix.npz"\nresume_at = 0.0083333\n'
                                     '[grid]\ntie_shrink = [0.1, 0.2]\n')
    sweep = read_sweep(tmp_path / "r.toml")
    assert sweep.tasks[0].params["resume"] == str(tmp_path / "prefix.npz")    # relative to the sweep file
    row = run_task(sweep.tasks[0], tmp_path)
    assert row["status"] == "done" and row["frames"] == 7 and row["resumed"].startswith("resumed at t = 0.0083 s")
    nope = "[base] resume " + str(tmp_path / "nope.npz") + ": no such file"
    for text, expected in (('[base]\nresume = "nope.npz"\n', nope),
                           ('[base]\nuntil = 0.005\nresume = "prefix.npz"\n',
                            "[base] until must be later than the frame"),
                           ("[base]\nresume_at = 1.0\n", "[base] resume_at needs resume")):
        (tmp_path / "b.toml").write_text(text)
        with pytest.raises(BadInput, match=re.escape(expected)): read_sweep(tmp_path / "b.toml")
