"""Build the docs site's pages offline, without Quarto: nbclient runs each notebook, nbdev's docs processors prepare it
(API docs, `#| hide`, doc links), nbconvert's HTMLExporter renders it. `python .ci/docs_preview.py [--only STEM...]
[--force] [--run-flags slow]` builds the changed pages into _docs_preview/ (serve it with `python -m http.server -d
_docs_preview`); `--execute-in-place` executes nbs/ for the deploy job's nbdev_docs. A notebook that raises fails its
page: the last good page stays, the failed render goes to _failed/, build.json names it, the exit status is 1."""
import argparse, hashlib, html, json, os, re, shutil, subprocess, sys, tarfile
from pathlib import Path

import jinja2, nbformat, yaml
from execnb.nbio import dict2nb, nb2dict
from jupyter_core.paths import jupyter_path
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from nbconvert.filters import strings
from nbdev.config import get_config
from nbdev.doclinks import _nbpath2html, nbglob
from nbdev.process import extract_directives
from nbdev.processors import FilterDefaults

ROOT = Path(__file__).resolve().parents[1]
NBS, OUT = ROOT / "nbs", ROOT / "_docs_preview"
VENDOR = {"@jupyter-widgets/html-manager@1.0.15": "2b9d65cb7913e1c7d671757a10008b32c9c2448d4429513371e55c07d6107638",
          "requirejs@2.3.7": "31f3330c978fb28684622fe71165dc946432cf0210b2ea8a1ca0233e70f2737d",  # tarballs' SHA-256
          "mathjax@3.2.2": "1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09"}
KERNEL_SETUP = ["import warp as _wp; _wp.config.log_level = _wp.LOG_WARNING",  # no banner, no "Module ... load";
                "_wp.init()",  # now, so that its no-CUDA-driver warning goes to the kernel's log, not into a cell
                "import pandas as _pd; _pd.set_option('display.max_colwidth', None)"]  # table cells never cut
TEMPLATE = r"""{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}
<link rel="icon" href="data:,"><link rel="stylesheet" href="{{ resources.root }}styles.css">
<script>window.MathJax = {tex: {inlineMath: [['$', '$'], ['\\(', '\\)']], processEscapes: true},
  options: {enableMenu: false},
  startup: {ready() { MathJax.startup.defaultReady();  // ipywidgets typesets with MathJax 2's Hub.Queue
    MathJax.Hub = {Queue: job => MathJax.typesetPromise(job && job[2] ? [job[2]] : undefined)}; }}};</script>
<script src="{{ resources.root }}_static/mathjax/package/es5/tex-svg-full.js"></script>
<script src="{{ resources.root }}_static/requirejs/package/require.js"></script>
<script>require.config({baseUrl: "{{ resources.root }}", paths: {{ resources.paths }}});</script>
{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block body_header -%}{{ super() }}<nav style="font: 13px system-ui, sans-serif">{{ resources.nav }}</nav>
{%- endblock body_header -%}
{%- block input_group -%}{%- if cell.source -%}{{ super() }}{%- endif -%}{%- endblock input_group -%}
"""

def notebooks():
    "The site's notebooks as nbdev finds them (no file or folder starting with `_` or `.`), index first."
    return sorted(nbglob(NBS, as_path=True), key=lambda p: (p.name != "index.ipynb", str(p)))

def page_name(nb: Path) -> str:
    return _nbpath2html(nb.relative_to(NBS) if nb.is_relative_to(NBS) else Path(nb.name)).as_posix()

def vendor(out: Path) -> dict:
    "Page assets under out/_static (npm packages fetched once, widget libraries from their Python packages)."
    for spec, sha in VENDOR.items():
        dst, tgz = out / "_static" / spec.split("@")[-2].split("/")[-1], out / "_vendor" / f"{spec.split('/')[-1]}.tgz"
        if not tgz.exists():
            tgz.parent.mkdir(parents=True, exist_ok=True)
            got = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(tgz.parent), spec], check=True,
                                 capture_output=True, text=True).stdout.split()[-1]
            (tgz.parent / got).rename(tgz)
        if hashlib.sha256(tgz.read_bytes()).hexdigest() != sha: sys.exit(f"{tgz}: not the SHA-256 of {spec}")
        if not (dst / "package").is_dir(): tarfile.open(tgz).extractall(dst, filter="data")
    paths = {"@jupyter-widgets": "_static/html-manager/package/dist"}
    for ext in (p for base in jupyter_path("nbextensions") for p in sorted(Path(base).glob("jupyter-*/index.js"))):
        shutil.copytree(ext.parent, out / "_static" / ext.parent.name, dirs_exist_ok=True)
        paths.update({js.stem if js.stem != "index" else ext.parent.name: f"_static/{ext.parent.name}/{js.stem}"
                      for js in ext.parent.glob("*.js") if js.stem != "extension"})  # index, and three beside it
    shutil.copy(NBS / "styles.css", out / "styles.css")
    shutil.copytree(NBS / "images", out / "images", dirs_exist_ok=True)
    return paths

def execute(path: Path, timeout=900, run_flags=()):
    "Run `path` in a fresh kernel as nbdev_test does (flagged, `eval: false` and nbdev_export cells skipped), keeping"
    " the outputs and the widget state; the notebook and its errors."
    nb, skip = nbformat.read(path, as_version=4), set(get_config().tst_flags.split("|")) - set(run_flags)
    for c in nb.cells:
        d = extract_directives(c, remove=False) if c.cell_type == "code" else {}
        why = next(iter(skip & d.keys()), "eval: false" if d.get("eval:") == ["false"] else None)
        if why or "nbdev_export(" in c.source:
            c.metadata.tags = [*c.metadata.get("tags", []), "skip-execution"]
            c.outputs = [nbformat.v4.new_output("stream", text=f"(not run for the docs: a `{why}` cell)\n")] * bool(why)
    os.environ["IN_TEST"] = "1"
    NotebookClient(nb, timeout=timeout, iopub_timeout=120, kernel_name="python3", allow_errors=True,  # big widgets
                   store_widget_state=True, resources={"metadata": {"path": str(path.parent)}},
                   extra_arguments=[f"--IPKernelApp.exec_lines={x}" for x in KERNEL_SETUP]).execute()
    return nb, [f"cell {i}: {o.ename}: {o.evalue}"[:500] for i, c in enumerate(nb.cells) for o in c.get("outputs", [])
                if o.output_type == "error"]

def pandoc_id(text: str) -> str:
    "The id pandoc (so Quarto) gives a heading, which nbdev's doc links point at."
    return re.sub(r"^[^a-z]+", "", re.sub(r"\s+", "-", re.sub(r"[^\w\s.-]", "", text).strip().lower())) or "section"

strings._convert_header_id = pandoc_id  # nbconvert's add_anchor names each heading with this function

def render(nb, path: Path, paths: dict, pages: list) -> str:
    "nbdev's docs processors, then nbconvert's HTML (JupyterLab look), with pandoc's heading ids and relative links."
    import warp
    warp.config.log_level = warp.LOG_WARNING  # show_doc runs the exported cells in this process
    state = nb.metadata.pop("widgets", None)  # execnb takes any "source" key (a jslink's state has one) for cell source
    d = dict2nb(nb)
    d.path_ = str(path)
    FilterDefaults()(d)
    nb, fm = nbformat.reads(json.dumps(nb2dict(d)), as_version=4), {}
    if state: nb.metadata.widgets = state
    for i, c in enumerate(nb.cells):
        if c.cell_type == "raw" and c.source.startswith("---"):  # nbdev's front matter: the title and the subtitle
            fm = yaml.safe_load(c.source.strip("-\n")) or {}
            nb.cells[i] = nbformat.v4.new_markdown_cell(f"# {fm.get('title')}\n\n> {fm.get('description', '')}")
        elif c.cell_type == "code" and re.search(r"^#\|\s*echo:\s*false", c.source, flags=re.M): c.source = ""
    rel = "../" * page_name(path).count("/")
    exp = HTMLExporter(extra_loaders=[jinja2.DictLoader({"p.j2": TEMPLATE})], template_file="p.j2",
                       exclude_input_prompt=True, exclude_output_prompt=True, anchor_link_text="",
                       widget_renderer_url=f"{rel}_static/html-manager/package/dist/embed-amd.js")
    body = exp.from_notebook_node(nb, resources=dict(
        root=rel or "./", metadata={"name": fm.get("title", path.stem)},
        paths=json.dumps({k: rel + v for k, v in paths.items()}),
        nav=" · ".join(f'<a href="{rel}{p}">{html.escape(p[:-5])}</a>' for p in pages)))[0]
    body = body.replace(get_config().doc_host + get_config().doc_baseurl + "/", rel or "./")
    return re.sub(r'<a href="([^"]+)">source</a>\{target="_blank" style="([^"]*)"\}',  # Quarto's link attributes
                  r'<a href="\1" target="_blank" style="\2">source</a>', body)

def write(dst: Path, text: str):
    "Write `dst`, readable by everyone (a web server is another user)."
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text)
    dst.chmod(0o644)

def build(out=OUT, only=(), force=False, timeout=900, run_flags=()) -> dict:
    "Build the pages older than their notebook or the package (or `only` these, or with `force` all) into `out`."
    paths, nbs, bj = vendor(out), notebooks(), out / "build.json"
    pages, old = [page_name(p) for p in nbs], json.loads(bj.read_text()) if bj.exists() else {}
    newest = max(p.stat().st_mtime for p in [*ROOT.glob("newtonipc_nb/**/*.py"), ROOT / "settings.ini", Path(__file__)])
    report = dict(pages=pages, failed={k: v for k, v in old.get("failed", {}).items() if k in pages}, built=[])
    for p, name in zip(nbs, pages):
        fresh = (out / name).exists() and (out / name).stat().st_mtime > max(newest, p.stat().st_mtime)
        if (only and p.stem not in only) or not (only or force or name in report["failed"] or not fresh): continue
        print(f"docs_preview: {name} from {p}", flush=True)
        try:
            nb, errors = execute(p, timeout, run_flags)
            body = render(nb, p, paths, pages)
        except Exception as e:  # a dead kernel, a cell past --timeout, a failed render
            errors, body = [f"{type(e).__name__}: {e}"[:500]], None
        report["built"].append(name)
        report["failed"].pop(name, None)
        if not errors: write(out / name, body)
        else:
            report["failed"][name] = "; ".join(errors)
            print(f"docs_preview: FAILED {name}: {errors[0]}", file=sys.stderr)
            if body: write(out / "_failed" / name, body)
    bj.write_text(json.dumps(report, indent=1))
    return report

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", default=(), help="notebook stems to build (default: the changed pages)")
    ap.add_argument("--force", action="store_true", help="build every page")
    ap.add_argument("--timeout", type=int, default=900, help="seconds a cell may run")
    ap.add_argument("--run-flags", nargs="*", default=(), help="also run the cells flagged so (slow, gpu)")
    ap.add_argument("--execute-in-place", action="store_true", help="write each executed notebook back into nbs/")
    a = ap.parse_args(argv)
    if not a.execute_in_place:
        return int(bool(build(a.out.resolve(), a.only, a.force, a.timeout, a.run_flags)["failed"]))
    runs = [(p, execute(p, a.timeout, a.run_flags)) for p in notebooks()]
    for p, (nb, _) in runs: nbformat.write(nb, p)
    return int(any(errors for _, (_, errors) in runs))

if __name__ == "__main__":
    sys.exit(main())
