"""Run every notebook in nbs/ through nbdev's test runner, one pytest test per notebook.

Cells flagged with one of settings.ini's `tst_flags` (slow, gpu) are skipped unless the flag
is named in the environment variable NEWTONIPC_TEST_FLAGS (for example "slow gpu").
"""
import os
from configparser import ConfigParser
from pathlib import Path

import pytest
from nbdev import test as nbdev_test

ROOT = Path(__file__).resolve().parents[1]
_cfg = ConfigParser(delimiters=["="])
_cfg.read(ROOT / "settings.ini")
TST_FLAGS = _cfg["DEFAULT"].get("tst_flags", "").split("|")
FORCED = os.environ.get("NEWTONIPC_TEST_FLAGS", "").split()
NOTEBOOKS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb):
    unknown = [f for f in FORCED if f not in TST_FLAGS + ["browser"]]   # browser: the docs check's own flag
    assert not unknown, f"NEWTONIPC_TEST_FLAGS names flags {unknown} that settings.ini's tst_flags does not define"
    ok, seconds = nbdev_test.test_nb(nb, skip_flags=[f for f in TST_FLAGS if f not in FORCED], force_flags=FORCED)
    assert ok, f"{nb.name} failed (see the traceback above)"
