"""The package's layout: core modules (the method) import no scene and no verification module, the package has no
import cycle, every module stays small enough to read, and every public name lives in one module (no compatibility
layer re-exports or redirects it)."""
import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "newtonipc_nb"
NOT_CORE = ("newtonipc_nb.scenes", "newtonipc_nb.verification")
MAX_LINES = 650  # the solver reached 607 with obstacles, prescribed motion and step rollback: split it next


def modules() -> dict:
    "Every module of the package (`newtonipc_nb.x.y` → path), the generated `_modidx` aside."
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        if p.name == "_modidx.py": continue
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def package_imports(name: str, path: Path) -> set:
    """The package modules `name` imports anywhere in its source (module level or inside functions), relative imports
    resolved."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    known, found = modules(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import): cands = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            cands = [base] + [f"{base}.{a.name}" for a in node.names]
        else: continue
        found |= {c for c in cands if c in known and c != name}
    return found


def is_core(name: str) -> bool: return not name.startswith(NOT_CORE) and name != "newtonipc_nb"


def test_layout_has_core_scenes_and_verification():
    names = set(modules())
    assert {"newtonipc_nb.distances", "newtonipc_nb.candidates", "newtonipc_nb.barrier", "newtonipc_nb.ccd",
            "newtonipc_nb.intersections", "newtonipc_nb.friction", "newtonipc_nb.elastic", "newtonipc_nb.linear",
            "newtonipc_nb.solver"} <= names
    assert any(n.startswith("newtonipc_nb.scenes.")
               for n in names) and any(n.startswith("newtonipc_nb.verification.") for n in names)


def test_core_source_never_imports_a_scene_or_verification_module():
    bad = {
        n: sorted(i for i in package_imports(n, p) if not is_core(i) and i != "newtonipc_nb")
        for n, p in modules().items() if is_core(n)
    }
    assert not {n: v for n, v in bad.items() if v}, bad


def test_no_import_cycle():
    graph = {n: package_imports(n, p) for n, p in modules().items()}
    state, path = {}, []
    def visit(n):
        state[n] = "open"
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "open": raise AssertionError("import cycle: " + " → ".join(path[path.index(m):] + [m]))
            if m not in state: visit(m)
        state[n] = "done"
        path.pop()
    for n in sorted(graph):
        if n not in state: visit(n)


def test_core_modules_imported_alone_load_no_scene_or_verification():
    "Each core module in a fresh interpreter: afterwards no scene or verification module is in sys.modules."
    core = [n for n in modules() if is_core(n)]
    code = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
            f"print(' '.join(m for m in sys.modules if m.startswith({NOT_CORE!r})))")
    procs = {
        n: subprocess.Popen([sys.executable, "-c", code, n], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in core
    }
    loaded = {}
    for n, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"importing {n} alone failed: {err[-2000:]}"
        if out.strip(): loaded[n] = out.split()
    assert not loaded, loaded


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_fits_in_a_reading(name):
    n = len(modules()[name].read_text().splitlines())
    assert n <= MAX_LINES, f"{name} has {n} lines (at most {MAX_LINES}): split it by concept"


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_name_lives_in_one_module(name):
    "No compatibility layer: a module's public names are defined in it, and it has no module-level `__getattr__`."
    mod = importlib.import_module(name)
    assert not hasattr(mod, "__getattr__"), f"{name} redirects attribute lookups (a compatibility layer)"
    homes = {n: getattr(getattr(mod, n), "__module__", None) for n in getattr(mod, "__all__", [])}
    foreign = [
        n for n, home in homes.items() if isinstance(home, str) and home.startswith("newtonipc_nb") and home != name
    ]
    assert not foreign, f"{name} re-exports {foreign}"


def test_no_moved_names_are_listed():
    from newtonipc_nb import barrier
    assert "bag_film_model" not in dir(barrier)


def test_export_cells_fit_in_view():
    "No export cell of a notebook is over 60 lines: one definition or a few small ones, which a reader holds in view."
    import json
    big = []
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        for c in json.loads(nb.read_text())["cells"]:
            src = "".join(c["source"])
            if c["cell_type"] == "code" and src.startswith("#| export") and len(src.splitlines()) > 60:
                big.append(f"{nb.name} cell {c.get('id')}: {len(src.splitlines())} lines")
    assert not big, "export cells over 60 lines (split them at a concept, with prose between):\n" + "\n".join(big)
