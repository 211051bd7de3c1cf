"""The docs site built offline, without Quarto (`python .ci/docs_preview.py --help`), and its checks. nbclient runs each
notebook, nbdev's docs processors prepare it, nbconvert's HTMLExporter renders it into _docs_preview/. A notebook that
raises fails its page: the last good page stays, the failed render goes to _failed/, build.json names it. `check_site`
reads the built files, `check_pages` opens each page in headless Chromium."""
import html, io, json, os, re, shutil, subprocess, sys, tarfile, time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import jinja2, nbconvert.filters.strings, nbformat, numpy as np, PIL.Image, warp
from bs4 import BeautifulSoup
from execnb.nbio import dict2nb, nb2dict
from fastcore.script import Param, call_parse, store_true
from jupyter_core.paths import jupyter_path
from nbclient import NotebookClient
from nbdev.config import get_config
from nbdev.doclinks import _nbpath2html, nbglob
from nbdev.process import extract_directives
from nbdev.processors import FilterDefaults

ROOT = Path(__file__).resolve().parents[1]
NBS, OUT = ROOT / "nbs", ROOT / "_docs_preview"
VENDOR = ("@jupyter-widgets/html-manager@1.0.15", "requirejs@2.3.7", "mathjax@2.7.7")  # npm checks their integrity
ASSET = {spec.split("@")[-2].split("/")[-1]: f"_static/{spec.split('/')[-1]}/package" for spec in VENDOR}
KERNEL_SETUP = ["import warp as _wp", "_wp.config.log_level = _wp.LOG_WARNING",  # no banner, no "Module ... load"
                "_wp.init()",  # now, so that its no-CUDA-driver warning goes to the kernel's log, not into a cell
                "import pandas as _pd", "_pd.set_option('display.max_colwidth', None)"]  # table cells never cut
TEMPLATE = r"""{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{{ super() }}<link rel="icon" href="data:,">
<link rel="stylesheet" href="{{ resources.root }}styles.css">
<script>require.config({baseUrl: "{{ resources.root }}", paths: {{ resources.paths }}});</script>{%- endblock -%}
{%- block body_header -%}{{ super() }}<nav style="font: 13px system-ui, sans-serif">{{ resources.nav }}</nav>
{%- endblock body_header -%}"""

def notebooks() -> dict:
    "The site's notebooks as nbdev finds them (no name starting with `_` or `.`), index first, and their pages."
    nbs = sorted(nbglob(NBS, as_path=True), key=lambda p: (p.name != "index.ipynb", str(p)))
    return {p: _nbpath2html(p.relative_to(NBS)).as_posix() for p in nbs}

def vendor(out: Path) -> dict:
    "The pages' assets (npm packages fetched once, the installed widget libraries, CSS, images); require.js paths."
    for spec in VENDOR:
        dst = out / "_static" / spec.split("/")[-1]
        if not (dst / "package").is_dir():
            dst.mkdir(parents=True, exist_ok=True)
            npm = ["npm", "pack", "--silent", "--pack-destination", str(dst), spec]
            tgz = subprocess.run(npm, check=True, capture_output=True, text=True).stdout.split()[-1]
            tarfile.open(dst / tgz).extractall(dst, filter="data")
    paths = {"@jupyter-widgets": f"{ASSET['html-manager']}/dist"}
    for ext in (p for base in jupyter_path("nbextensions") for p in sorted(Path(base).glob("jupyter-*/index.js"))):
        shutil.copytree(ext.parent, out / "_static" / ext.parent.name, dirs_exist_ok=True)
        paths.update({js.stem if js.stem != "index" else ext.parent.name: f"_static/{ext.parent.name}/{js.stem}"
                      for js in ext.parent.glob("*.js") if js.stem != "extension"})  # index, and three beside it
    shutil.copy(NBS / "styles.css", out / "styles.css")
    shutil.copytree(NBS / "images", out / "images", dirs_exist_ok=True)
    return paths

def execute(path: Path, timeout=900, run_flags=()):
    "Run `path` in a fresh kernel, skipping the cells nbdev_test skips; the notebook (outputs, widget state), errors."
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

nbconvert.filters.strings._convert_header_id = pandoc_id  # nbconvert's add_anchor names each heading with this function
warp.config.log_level = warp.LOG_WARNING  # quiet: show_doc runs the exported cells in this process

def render(nb, path: Path, name: str, paths: dict, pages: list) -> str:
    "nbdev's docs processors, then nbconvert's HTML (JupyterLab look), with pandoc's heading ids and relative links."
    state = nb.metadata.pop("widgets", None)  # execnb takes any "source" key (a jslink's state has one) for cell source
    FilterDefaults()(d := dict2nb({**nb, "path_": str(path)}))
    nb, fm = nbformat.reads(json.dumps(nb2dict(d)), as_version=4), getattr(d, "frontmatter_", {})
    if state: nb.metadata.widgets = state
    if fm:  # nbdev put the title and the subtitle into a front matter cell (for Quarto)
        nb.cells[0] = nbformat.v4.new_markdown_cell(f"# {fm.get('title')}\n\n> {fm.get('description', '')}")
    for c in nb.cells:  # Quarto's `echo: false` (nbdev's show_doc cells): the output only; no empty input boxes
        if not c.source or re.search(r"^#\|\s*echo:\s*false", c.source, flags=re.M):
            c.metadata.transient = {"remove_source": True}
    rel = "../" * name.count("/")
    exp = nbconvert.HTMLExporter(extra_loaders=[jinja2.DictLoader({"p.j2": TEMPLATE})], template_file="p.j2",
                       exclude_input_prompt=True, exclude_output_prompt=True, anchor_link_text="",
                       widget_renderer_url=f"{rel}{ASSET['html-manager']}/dist/embed-amd.js",
                       require_js_url=f"{rel}{ASSET['requirejs']}/require.js",
                       mathjax_url=f"{rel}{ASSET['mathjax']}/MathJax.js?config=TeX-AMS_CHTML-full,Safe")
    body = exp.from_notebook_node(nb, resources=dict(
        root=rel or "./", metadata={"name": fm.get("title", path.stem)},
        paths=json.dumps({k: rel + v for k, v in paths.items()}),
        nav=" · ".join(f'<a href="{rel}{p}">{html.escape(p[:-5])}</a>' for p in pages)))[0]
    body = body.replace(get_config().doc_host + get_config().doc_baseurl + "/", rel or "./")
    return re.sub(r'<a href="([^"]+)">source</a>\{target="_blank" style="([^"]*)"\}',  # Quarto's link attributes
                  r'<a href="\1" target="_blank" style="\2">source</a>', body)

def build(out=OUT, only=(), force=False, timeout=900, run_flags=()) -> dict:
    "Build the pages older than their notebook or the package (or `only` these, or with `force` all) into `out`."
    paths, nbs, bj = vendor(out), notebooks(), out / "build.json"
    pages, old = list(nbs.values()), json.loads(bj.read_text()) if bj.exists() else {}
    newest = max(p.stat().st_mtime for p in [*ROOT.glob("newtonipc_nb/**/*.py"), ROOT / "settings.ini", Path(__file__)])
    report = dict(pages=pages, failed={k: v for k, v in old.get("failed", {}).items() if k in pages})
    for p, name in nbs.items():
        fresh = (out / name).exists() and (out / name).stat().st_mtime > max(newest, p.stat().st_mtime)
        if (only and p.stem not in only) or not (only or force or name in report["failed"] or not fresh): continue
        print(f"docs_preview: {name} from {p}", flush=True)
        try:
            nb, errors = execute(p, timeout, run_flags)
            body = render(nb, p, name, paths, pages)
        except Exception as e:  # a dead kernel, a cell past --timeout, a failed render
            errors, body = [f"{type(e).__name__}: {e}"[:500]], None
        report["failed"].pop(name, None)
        if errors:
            report["failed"][name] = "; ".join(errors)
            print(f"docs_preview: FAILED {name}: {errors[0]}", file=sys.stderr)
        if body:  # readable by everyone: a web server is another user
            dst = out / "_failed" / name if errors else out / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(body)
            dst.chmod(0o644)
    bj.write_text(json.dumps(report, indent=1))
    return report

# ---------------------------------------------------------------- checks of the built site
NOISE = re.compile(r"Warp \d[\w.]* initialized|load on device '[^']*' took|CUDA driver not available|Warp CUDA warning")
SUBJECT = 0.15  # the least share of the canvas a trajectory view's film covers (its projected bounding box)

def check_site(out: Path, report=None) -> list:
    "One line per problem of the site built in `out` (`report`: its build.json)."
    report = report or json.loads((out / "build.json").read_text())
    soups = {n: BeautifulSoup((out / n).read_text(), "html.parser") for n in report["pages"] if (out / n).is_file()}
    problems = [f"{n}: its build failed: {why}" for n, why in report["failed"].items()]
    problems += [f"{n}: the page is missing" for n in report["pages"] if n not in soups]
    problems += [f"{n}: not world-readable (mode {oct(m)})" for n in soups  # a web server is another user
                 if (m := (out / n).stat().st_mode & 0o777) & 0o044 != 0o044]
    ids = {n: {t["id"] for t in s.find_all(id=True)} for n, s in soups.items()}
    for n, s in soups.items():
        for href in dict.fromkeys(a["href"] for a in s.find_all("a", href=True)):
            u, frag = urlsplit(href), unquote(urlsplit(href).fragment)
            path = os.path.normpath(os.path.join(os.path.dirname(n), unquote(u.path))) if u.path else n
            if u.scheme or u.netloc: continue
            if path.startswith("..") or path not in ids and not (out / path).is_file():
                problems.append(f"{n}: link {href!r}: no page {path}")
            elif frag and path in ids and frag not in ids[path]:
                problems.append(f"{n}: link {href!r}: {path} has no anchor #{frag}")
        if m := NOISE.search(s.get_text()): problems.append(f"{n}: Warp's log on the page ({m[0]!r})")
        cut = [c.get_text().strip() for c in s.select("td, th") if c.get_text().strip().endswith(("…", "..."))]
        if cut: problems.append(f"{n}: {len(cut)} table cell(s) cut short, e.g. {cut[0][-60:]!r}")
    return problems

def scene_frame(sc: dict):
    "The kept-frame weights of the drawn film if its wireframe, spheres, bodies and placement agree; else what not."
    K, base = len(sc["times"]), np.reshape(sc["base"], (1, -1, 3))
    # weights not yet applied: three.js draws the base positions, which are a kept frame
    loaded = (np.abs(np.reshape(sc["targets"], (K, -1, 3)) - base).max(axis=(1, 2)) < 1e-6).astype(float)
    w = {n: np.asarray(v, float) if abs(sum(v)) > 1e-6 else loaded for n, v in sc["weights"].items()}
    for name, wn in w.items():
        if abs(wn.sum() - 1) > 1e-4: return f"{name}: its morph weights sum to {wn.sum():.4g}"
    if max(np.abs(v - w["film"]).max() for v in w.values()) > 1e-4: return f"the film and its wireframe differ: {w}"
    for name, track in sc["tracks"].items():
        now, want = np.asarray(sc["now"][name], float), w["film"] @ np.reshape(track, (K, 3))
        if np.abs(now - want).max() > 1e-5 * (1 + abs(want).max()):
            return f"{name} is {np.round(now, 4).tolist()}, the film at t = {w['film'] @ sc['times']:.3f} s"
    return w["film"]

def clock_problem(sc: dict, w):
    "A time label (`t = X s`) or slider readout outside the kept frames the drawn frame `w` blends, or no label."
    t, shown = w @ np.asarray(sc["times"]), np.asarray(sc["times"])[w > 1e-9]
    said = [*map(float, re.findall(r"t = (-?[\d.]+) s", sc["label"])), *map(float, sc["readouts"])]
    bad = [x for x in said if not shown.min() - 1e-3 <= x <= shown.max() + 1e-3]
    return f"it says t = {bad[0]:g} s and shows t = {t:.3f} s" if bad else None if said else "no time label"

def check_view(js, name: str, k: int, shots: Path) -> list:
    "A trajectory view's problems on load, playing, paused, after stop and playing again; a screenshot of each."
    if not js("!!rec(arguments[0])", k): return [f"{name}: view {k}: its clip never played"]
    problems, seen, drawn = [], [], []
    for when, button in (("load", None), ("playing", 0), ("paused", 1), ("end", 2), ("replay", 0)):
        if button is not None:
            js("views()[arguments[0]].querySelectorAll('.trajectory-play button')[arguments[1]].click()", k, button)
        time.sleep(1.5 if button == 0 else 0.5)
        drawn.append(js("(views()[arguments[0]].scrollIntoView(), views()[arguments[0]].querySelector('canvas'))", k)
                     .screenshot_as_png)  # scrolled alike each time: the page may not scroll the canvas to the top
        (shots / f"{name}.view{k}.{when}.png").write_bytes(drawn[-1])
        seen.append(w := scene_frame(sc := js("scene(arguments[0])", k)))
        if why := w if isinstance(w, str) else clock_problem(sc, w): problems.append(f"{name}: view {k} {when}: {why}")
    after = [] if problems else [(np.abs(seen[0] - seen[3]).max() > 1e-6, "after stop another frame than on load"),
             (drawn[0] != drawn[3], "after stop the canvas is not redrawn (its picture is not the one on load)"),
             (np.abs(seen[3] - seen[4]).max() < 1e-6, "play does nothing after stop")]  # the first of them
    problems += [f"{name}: view {k}: {what}" for bad, what in after if bad][:1]
    # the film's projected box at each kept frame: its morph targets through three.js's (column-major) projections
    mvp = np.reshape(js("projections(arguments[0])", k), (-1, 4, 4))
    h = np.pad(np.reshape(sc["targets"], (len(mvp), -1, 3)), ((0, 0), (0, 0), (0, 1)), constant_values=1.0) @ mvp
    ndc = np.clip(h[..., :2] / h[..., 3:], -1, 1)
    if min(fill := np.prod(ndc.max(1) - ndc.min(1), axis=-1) / 4) < SUBJECT:
        problems.append(f"{name}: view {k}: the film covers {min(fill):.1%} of the canvas at kept frame "
                        f"{int(np.argmin(fill))} (at least {SUBJECT:.0%} wanted)")
    return problems

def check_page(d, url: str, shots: Path) -> list:
    "Open one page; its problems. Screenshots of the page, its canvases and each trajectory view."
    name, js = url.rsplit("/", 1)[1], lambda expr, *a: d.execute_script(f"return {expr}", *a)
    errors = lambda: [f"{name}: console error: {e['message']}" for e in d.get_log("browser") if e["level"] == "SEVERE"]
    d.get(url)
    for _ in range(120 if js("document.querySelector('[type$=\"view+json\"]')") else 0):  # widgets render, three draws
        if js("canvases().length") and js("views().every((_, k) => rec(k))"): break
        time.sleep(0.5)
    time.sleep(2)
    d.save_screenshot(str(shots / f"{name}.png"))
    problems = errors()
    for i, c in enumerate(js("canvases()")):
        size = js("inView(arguments[0])", c)  # a canvas the viewport's edge cuts is shot clipped to the viewport
        (shots / f"{name}.canvas{i}.png").write_bytes(png := c.screenshot_as_png)
        got = (img := PIL.Image.open(io.BytesIO(png)).convert("RGB")).size
        cov = 1 - max(counts := [n for n, _ in img.getcolors(1 << 24)]) / sum(counts), len(counts)  # off the commonest
        why = f": its screenshot is {got}, not the whole canvas {size}" if list(got) != size else \
            f" is blank {cov}" if cov[0] < 0.01 or cov[1] < 8 else ""
        problems += [f"{name}: canvas {i}{why}"] if why else []
    return problems + [p for k in range(js("views().length")) for p in check_view(js, name, k, shots)] + errors()

def check_pages(base_url: str, pages: list, shots: Path) -> list:
    "Open every page of a served site in Chromium; one line per problem."
    from selenium import webdriver  # Debian's chromium and chromium-driver; chromedriver makes a fresh profile
    shots.mkdir(parents=True, exist_ok=True)
    o = webdriver.ChromeOptions()
    o.binary_location = shutil.which("chromium")
    flags = ("headless no-sandbox disable-gpu enable-unsafe-swiftshader window-size=1400,1000 disable-quic no-first-run"
             " disable-background-networking disable-component-update disable-sync")  # no network but the registries
    o.arguments.extend("--" + a for a in flags.split())
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=o, service=webdriver.ChromeService(shutil.which("chromedriver")))
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": (ROOT / ".ci/docs_check.js").read_text()})
    try: return [p for n in pages for p in check_page(d, base_url + n, shots)]
    finally: d.quit()

@call_parse
def main(only: Param("notebook stems to build (default: the changed pages)", nargs="*") = (),
         force: store_true = False,  # build every page
         timeout: int = 900,  # seconds a cell may run
         run_flags: Param("also run the cells flagged so (slow, gpu)", nargs="*") = (),
         execute_in_place: store_true = False):  # write each executed notebook back into nbs/ (for nbdev_docs)
    "Build the changed pages of the docs preview, or execute the notebooks in place; exit status 1 if one failed."
    if not execute_in_place: sys.exit(1 if build(OUT, only, force, timeout, run_flags)["failed"] else 0)
    runs = [(p, execute(p, timeout, run_flags)) for p in notebooks()]
    for p, (nb, _) in runs: nbformat.write(nb, p)
    sys.exit(1 if any(errors for _, (_, errors) in runs) else 0)
