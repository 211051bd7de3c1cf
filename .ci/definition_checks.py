"""How many public definitions each notebook exercises right after defining them.

A public definition is a top-level function, class or constant of an exported cell whose name does not start with
`_`. It is *exercised* when a non-exported code cell between its export cell and the next export cell names it (a
check, an example, a table or a 3D view a reader can run). Prints one row per notebook and the total; with
`--min P`, exits 1 when the total share is below P percent."""
import argparse
import ast
import json
import re
import sys
from pathlib import Path

NBS = Path(__file__).resolve().parents[1] / "nbs"


def code_cells(path: Path) -> list[tuple[bool, str]]:
    "(exported?, source) of every code cell."
    cells = json.loads(path.read_text())["cells"]
    out = []
    for c in cells:
        if c["cell_type"] != "code": continue
        src = "".join(c["source"])
        out.append((bool(re.match(r"\s*#\|\s*export", src)), src))
    return out


def public_names(src: str) -> list[str]:
    "Top-level public names an exported cell defines."
    try: tree = ast.parse(src)
    except SyntaxError: return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)): names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name): names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


def notebook_counts(path: Path) -> tuple[int, int]:
    "(public definitions, those exercised before the next export cell) of one notebook."
    cells, total, used = code_cells(path), 0, 0
    for i, (exported, src) in enumerate(cells):
        if not exported: continue
        after = []
        for ex, s in cells[i + 1:]:
            if ex: break
            after.append(s)
        text = "\n".join(after)
        for name in public_names(src):
            total += 1
            used += bool(re.search(rf"\b{re.escape(name)}\b", text))
    return total, used


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min", type=float, default=None, help="fail below this percentage")
    a = ap.parse_args(argv)
    rows = [(p.name, *notebook_counts(p)) for p in sorted(NBS.glob("*.ipynb"))]
    rows = [r for r in rows if r[1]]
    for name, total, used in rows: print(f"{name:40s} {used:4d} / {total:4d}")
    total, used = sum(r[1] for r in rows), sum(r[2] for r in rows)
    share = 100.0 * used / max(total, 1)
    print(f"public definitions exercised before the next export cell: {used} of {total} ({share:.0f} %)")
    return 1 if a.min is not None and share < a.min else 0


if __name__ == "__main__":
    sys.exit(main())
