"""What the command-line tests share: run an installed console script, read its one-line error, and write a file
shaped like a saved bag run."""
import io
import signal
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

from newtonipc_nb.scenes.bag_scene import DT, bag_mesh

BIN = Path(sys.executable).parent
BAG, VALIDATE = BIN / "newtonipc-bag", BIN / "newtonipc-validate"


def cli(prog, *args, timeout=600):
    "Run the console script `prog` with `args`; the completed process, output captured as text."
    return subprocess.run([str(prog), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def sigint_default():
    """`preexec_fn` for a child that a test interrupts with SIGINT: a shell runs background jobs with SIGINT ignored,
    and a Python started so never installs its KeyboardInterrupt handler; the child gets the default back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def in_process(prog, *args):
    """Run the console script `prog`'s function in this process, as its script would (the launcher, then the
    command's `main`); the result as `cli` gives it. For argument checks, which end before anything is computed: they
    need no fresh interpreter, and a subprocess costs seconds of imports."""
    from newtonipc_nb.scenes import launch
    command = {BAG.name: launch.bag, VALIDATE.name: launch.validate}[Path(prog).name]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = command([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    return subprocess.CompletedProcess([str(prog), *map(str, args)], code, out.getvalue(), err.getvalue())


def one_line(r, code, *says):
    "The command exited `code` with a single stderr line, no traceback, containing every `says`; that line."
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for s in says:
        assert s in lines[0], (s, lines[0])
    return lines[0]


def fake_run(path, frames=5, **over):
    "A file shaped like a saved run at resolution 1 (the rest shape at every stored step); `over` replaces entries."
    v, f = bag_mesh()
    d = dict(film=np.repeat(v[None].astype(np.float32), frames, 0), spheres=np.zeros((frames, 7, 3), np.float32),
             faces=f, time=np.arange(frames) * DT, stopped=np.asarray("interrupted"),
             step_t=(np.arange(1, frames) * DT))
    d.update(over)
    np.savez(path, **{k: x for k, x in d.items() if x is not None})
    return path
