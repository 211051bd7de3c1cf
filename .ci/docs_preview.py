"""Build an offline preview of the docs site: the same pages `nbdev_docs` makes with Quarto, without Quarto.

    python .ci/docs_preview.py                 # build every page into _docs_preview/ (open _docs_preview/index.html)
    python .ci/docs_preview.py --serve         # ... then serve it on http://127.0.0.1:8000/
    python .ci/docs_preview.py --only 00a_viewer index   # rebuild some pages only
    python .ci/docs_preview.py --execute-in-place        # CI's deploy job: execute nbs/*.ipynb in place for nbdev_docs

For each notebook in nbs/ (each in its own process, so that one broken notebook breaks only its page):
1. execute it in a fresh kernel (nbclient), skipping the cells nbdev_test skips (`#| slow`, `#| gpu`, `#| eval: false`,
   unless NEWTONIPC_TEST_FLAGS names the flag), and keep the outputs and the widget state (the notebooks are committed
   without outputs, so a page gets its tables and 3D scenes here);
2. run nbdev's docs processors on it (the ones `nbdev_proc_nbs` runs: show_doc API docs, hidden cells, front matter);
3. render it to HTML (nbconvert, JupyterLab look) with a sidebar of all pages.

Every asset a page loads is local (nothing from a CDN): pythreejs's JS comes from the installed package; the ipywidgets
HTML manager (@jupyter-widgets/html-manager), require.js and MathJax come from their npm packages, fetched once with
`npm pack` (checked against the SHA-256 below) into _docs_preview/_vendor/. Pages whose source and package did not
change since the last build are not rebuilt (--force rebuilds). A notebook that raises still gets its page (with the
error shown) and is listed in _docs_preview/build.json and in the summary printed at the end.
"""
from __future__ import annotations

import argparse, hashlib, html, json, os, re, shutil, subprocess, sys, tarfile, tempfile, time
from configparser import ConfigParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
OUT = ROOT / "_docs_preview"

# npm package -> (sha256 of the tarball `npm pack` gives, {path in tarball: path under _static/})
VENDOR = {
    "@jupyter-widgets/html-manager@1.0.15": ("2b9d65cb7913e1c7d671757a10008b32c9c2448d4429513371e55c07d6107638",
                                             {"package/dist/": "html-manager/"}),
    "requirejs@2.3.7": ("31f3330c978fb28684622fe71165dc946432cf0210b2ea8a1ca0233e70f2737d", {"package/require.js": "require.js"}),
    "mathjax@3.2.2": ("1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09",
                      {"package/es5/tex-svg-full.js": "mathjax/tex-svg-full.js"}),
}


def cfg():
    c = ConfigParser(delimiters=["="]); c.read(ROOT / "settings.ini"); return c["DEFAULT"]


def notebooks():
    "The notebooks the site has, in nbdev's order (index first)."
    nbs = sorted(p for p in NBS.rglob("*.ipynb") if not any(part.startswith(("_", ".")) for part in p.relative_to(NBS).parts))
    return sorted(nbs, key=lambda p: (p.name != "index.ipynb", str(p.relative_to(NBS))))


def page_name(nb: Path) -> str:
    "The page Quarto makes of `nb` (nbdev sets `output-file`: the name without its number prefix)."
    from nbdev.doclinks import _nbpath2html
    return _nbpath2html(nb.relative_to(NBS) if nb.is_relative_to(NBS) else Path(nb.name)).as_posix()


def title_of(nb: Path) -> str:
    if nb.name == "index.ipynb": return "Home"
    for c in json.loads(nb.read_text()).get("cells", []):
        if c["cell_type"] == "markdown":
            m = re.search(r"^#\s+(\S.*?)\s*$", "".join(c["source"]), flags=re.M)
            if m: return m.group(1)
    return nb.stem


# ---------------------------------------------------------------- assets
def vendor(out: Path) -> dict:
    "Put every JS asset under out/_static and return the require.js paths of the widget modules."
    static, cache = out / "_static", out / "_vendor"
    static.mkdir(parents=True, exist_ok=True); cache.mkdir(parents=True, exist_ok=True)
    for spec, (sha, members) in VENDOR.items():
        if all((static / dst).exists() for dst in members.values()): continue
        name = spec.rsplit("@", 1)[0].lstrip("@").replace("/", "-") + "-" + spec.rsplit("@", 1)[1] + ".tgz"
        tgz = cache / name
        if not tgz.exists():
            if not shutil.which("npm"):
                sys.exit(f"docs_preview: npm is needed once to fetch {spec} (the page assets); install Node.js/npm")
            subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(cache), spec], check=True,
                           stdout=subprocess.DEVNULL)
        got = hashlib.sha256(tgz.read_bytes()).hexdigest()
        if got != sha: tgz.unlink(); sys.exit(f"docs_preview: {spec} has SHA-256 {got}, expected {sha}")
        with tarfile.open(tgz) as tf:
            for m in tf.getmembers():
                for src, dst in members.items():
                    if not m.isfile() or m.name.endswith(".map"): continue
                    if m.name == src or (src.endswith("/") and m.name.startswith(src)):
                        target = static / dst / m.name[len(src):] if src.endswith("/") else static / dst
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(tf.extractfile(m).read())
    # widget libraries' own JS, from the installed Python packages (classic-notebook AMD builds)
    from jupyter_core.paths import jupyter_path
    paths = {}
    for base in map(Path, jupyter_path("nbextensions")):
        for ext in sorted(base.glob("*/extension.js")):
            for mod, rel in re.findall(r"""["']?([\w@/.-]+)["']?\s*:\s*["']nbextensions/([^"']+)["']""", ext.read_text()):
                if mod in paths or mod.startswith("@jupyter-widgets/"): continue
                paths[mod] = "_static/nbextensions/" + rel
            dst = static / "nbextensions" / ext.parent.name
            if not dst.exists():
                shutil.copytree(ext.parent, dst, ignore=shutil.ignore_patterns("*.map"))
    return paths


# ---------------------------------------------------------------- one page
def _directives(cell) -> dict:
    from fastcore.basics import AttrDict
    from nbdev.process import extract_directives
    if cell["cell_type"] != "code": return {}
    return extract_directives(AttrDict(source=cell["source"], cell_type="code"), remove=False)


def skip_flags():
    flags = [f for f in cfg().get("tst_flags", "").split("|") if f]
    forced = os.environ.get("NEWTONIPC_TEST_FLAGS", "").split()
    return set(flags) - set(forced)


def execute(nb_path: Path, timeout: int, keep_links=True):
    "Run `nb_path` in a fresh kernel as nbdev_test would (flagged cells skipped); the executed notebook and the skipped cells."
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(nb_path, as_version=4)
    flags, skipped = skip_flags(), {}
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code": continue
        d = _directives(c)
        why = ("nbdev_export" + "(" in c.source and "nbdev_export") or (d.get("eval:", [""])[0].lower() == "false" and "eval: false") \
            or next(iter(sorted(flags & d.keys())), None)
        if why: skipped[i] = why; c.cell_type = "raw"
    env_before = os.environ.get("IN_TEST")
    os.environ["IN_TEST"] = "1"
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True, store_widget_state=True,
                                resources={"metadata": {"path": str(nb_path.parent)}})
        client.execute()
    finally:
        if env_before is None: os.environ.pop("IN_TEST", None)
        else: os.environ["IN_TEST"] = env_before
    for i, why in skipped.items():
        c = nb.cells[i]; c.cell_type = "code"; c.outputs = []; c.execution_count = None
        if why != "nbdev_export":
            c.outputs = [nbformat.v4.new_output("stream", name="stdout",
                         text=f"(not run in the docs build: a `{why}` cell; run the notebook with a kernel to see its output)\n")]
    prune_widget_state(nb, keep_links)
    errors = [dict(cell=i, ename=o.get("ename"), evalue=str(o.get("evalue"))[:300])
              for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    return nb, skipped, errors


WIDGET_STATE, WIDGET_VIEW = "application/vnd.jupyter.widget-state+json", "application/vnd.jupyter.widget-view+json"


def prune_widget_state(nb, keep_links=True) -> tuple[int, int]:
    "Keep only the widgets a shown view needs (and links between them): a kernel also holds test-only and closed widgets."
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state")
    if not state: return 0, 0
    def refs(o, acc):
        if isinstance(o, str) and o.startswith("IPY_MODEL_"): acc.add(o[len("IPY_MODEL_"):])
        elif isinstance(o, dict): [refs(v, acc) for v in o.values()]
        elif isinstance(o, list): [refs(v, acc) for v in o]
        return acc
    keep, todo = set(), [o["data"][WIDGET_VIEW]["model_id"] for c in nb.cells for o in c.get("outputs", [])
                         if WIDGET_VIEW in o.get("data", {})]
    while todo:
        m = todo.pop()
        if m in keep or m not in state: continue
        keep.add(m); todo.extend(refs(state[m].get("state", {}), set()))
    for m, w in state.items():  # jslink / jsdlink widgets tie two kept widgets together
        if keep_links and m not in keep and w.get("model_name") in ("LinkModel", "DirectionalLinkModel"):
            r = refs(w.get("state", {}), set())
            if r and r <= keep: keep.add(m)
    before = len(state)
    nb.metadata["widgets"][WIDGET_STATE]["state"] = {m: w for m, w in state.items() if m in keep}
    return before, len(keep)


def nbdev_process(nb, nb_path: Path):
    "Apply the processors nbdev_proc_nbs applies (show_doc API docs, hide, front matter); returns an nbformat notebook."
    import nbformat
    from execnb.nbio import read_nb, write_nb
    from nbdev.processors import FilterDefaults
    # the widget state stays out of nbdev's hands: execnb takes any key named "source" for cell source
    # (a jslink's state has one) and fails to write the notebook back
    saved = nb.metadata.pop("widgets", None)
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / nb_path.name
        nbformat.write(nb, f)
        d = read_nb(f)
        d.path_ = str(nb_path)
        FilterDefaults()(d)
        write_nb(d, f)
        out = nbformat.read(f, as_version=4)
    mime = WIDGET_STATE
    if saved and mime in saved:
        new = out.metadata.get("widgets", {}).get(mime, {"state": {}})
        out.metadata["widgets"] = {mime: {**new, **saved[mime], "state": {**new.get("state", {}), **saved[mime]["state"]}}}
    return out


def _quarto_options(nb):
    "Apply the Quarto cell options Quarto would (echo/output/include: false) and drop the `#|` lines from shown code."
    fm, cells = {}, []
    for c in nb.cells:
        if c.cell_type == "raw" and c.source.startswith("---"):
            import yaml
            fm = yaml.safe_load(c.source.strip().strip("-")) or {}; continue
        if c.cell_type == "code":
            lines = c.source.split("\n")
            opts = dict(re.match(r"#\|\s*([\w-]+)\s*:\s*(.*?)\s*$", l).groups() for l in lines if re.match(r"#\|\s*[\w-]+\s*:", l))
            c.source = "\n".join(l for l in lines if not l.startswith("#|")).strip("\n")
            tags = set(c.metadata.get("tags", []))
            if opts.get("include") == "false": continue
            if opts.get("echo") == "false" or not c.source: tags.add("hide-input")
            if opts.get("output") == "false": c.outputs = []
            if not c.source and not c.get("outputs"): continue
            if c.source.startswith("show_doc("): tags.add("showdoc")
            c.metadata["tags"] = sorted(tags)
        cells.append(c)
    nb.cells = cells
    return fm


TEMPLATE = r"""
{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}
<link rel="icon" href="data:,">
<script>
// MathJax 3; the widgets' typeset() calls MathJax 2's MathJax.Hub.Queue, so give it one that typesets with MathJax 3
window.MathJax = {tex: {inlineMath: [['$', '$'], ['\\(', '\\)']], displayMath: [['$$', '$$'], ['\\[', '\\]']],
  processEscapes: true, tags: 'ams'}, options: {enableMenu: false}, svg: {fontCache: 'global'},
  startup: {ready: function () { MathJax.startup.defaultReady();
    MathJax.Hub = {Queue: function (job) { var el = job && job[2]; MathJax.startup.promise.then(function () {
      return MathJax.typesetPromise(el ? [el] : undefined); }); }}; }}};
</script>
<script src="{{ resources.static }}mathjax/tex-svg-full.js"></script>
<script src="{{ resources.static }}require.js"></script>
<script>require.config({baseUrl: "{{ resources.root }}", paths: {{ resources.require_paths }} });</script>
{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}<style>{{ resources.site_css }}</style>{%- endblock html_head_css -%}
{%- block body_header -%}
<body class="jp-Notebook" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
<nav class="site-nav">{{ resources.nav }}</nav>
<main class="site-main">
<header class="page-header"><h1 class="page-title">{{ resources.page_title }}</h1>
{%- if resources.page_description %}<p class="page-description">{{ resources.page_description }}</p>{% endif %}</header>
{%- endblock body_header -%}
{% block body_footer %}
<footer class="page-footer">{{ resources.footer }}</footer>
</main>
</body>
{% endblock body_footer %}
"""

SITE_CSS = """
body.jp-Notebook { padding: 0; margin: 0; }
.site-nav { position: fixed; top: 0; left: 0; bottom: 0; width: 230px; overflow-y: auto; background: #f3f5f8;
  border-right: 1px solid #dde; padding: 16px 12px; box-sizing: border-box; font-family: system-ui, sans-serif; font-size: 14px; }
.site-nav .site-title { font-weight: 700; font-size: 16px; margin-bottom: 12px; display: block; color: #2c3e50; text-decoration: none; }
.site-nav ul { list-style: none; margin: 0; padding: 0; }
.site-nav li a { display: block; padding: 4px 8px; color: #2c3e50; text-decoration: none; border-radius: 4px; }
.site-nav li a:hover { background: #e4e9f0; }
.site-nav li.current a { background: #2780e3; color: white; }
.site-nav .badge { font-size: 11px; color: #b00; }
.site-main { margin-left: 230px; padding: 8px 32px 48px 32px; max-width: 1100px; }
.page-header { margin: 16px 0 8px 0; } .page-title { margin: 0; font-family: system-ui, sans-serif; }
.page-description { color: #555; font-size: 1.1em; margin: 4px 0 0 0; }
.page-footer { margin-top: 32px; padding-top: 8px; border-top: 1px solid #ddd; color: #777; font-size: 12px; font-family: system-ui, sans-serif; }
.jp-Cell.celltag_showdoc .jp-OutputArea-output { border-left: 3px solid #2780e3; padding-left: 10px; }
"""


def nav_html(pages, current, rel):
    items = []
    for p in pages:
        cls = ' class="current"' if p["html"] == current else ""
        items.append(f'<li{cls}><a href="{rel}{p["html"]}">{html.escape(p["title"])}</a></li>')
    title = html.escape(cfg().get("title", "docs"))
    return f'<a class="site-title" href="{rel}index.html">{title}</a><ul>{"".join(items)}</ul>'


def build_page(nb_path: Path, out: Path, pages, require_paths, timeout, key):
    import nbformat, jinja2
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    t0 = time.time()
    html_name = page_name(nb_path)
    rel = "../" * html_name.count("/")
    info = dict(source=str(nb_path.relative_to(ROOT) if nb_path.is_relative_to(ROOT) else nb_path), html=html_name, key=key, errors=[], skipped={}, fatal=None)
    try:
        nb, skipped, errors = execute(nb_path, timeout)
        info.update(skipped={str(k): v for k, v in skipped.items()}, errors=errors)
        nb = nbdev_process(nb, nb_path)
    except Exception as e:  # the page still gets built, from the source notebook, with the failure stated
        import traceback
        info["fatal"] = f"{type(e).__name__}: {e}"[:2000]
        sys.stderr.write(traceback.format_exc())
        nb = nbformat.read(nb_path, as_version=4)
    fm = _quarto_options(nb)
    c = Config()
    c.TagRemovePreprocessor.remove_input_tags = {"hide-input"}
    c.TagRemovePreprocessor.enabled = True
    exp = HTMLExporter(config=c, extra_loaders=[jinja2.DictLoader({"preview.html.j2": TEMPLATE})], template_file="preview.html.j2",
                       embed_images=True, exclude_input_prompt=True, exclude_output_prompt=True, anchor_link_text="",
                       widget_renderer_url=f"{rel}_static/html-manager/embed-amd.js")
    notes = [f"Built offline from <code>{html.escape(info['source'])}</code> on {time.strftime('%Y-%m-%d %H:%M')}."]
    if info["skipped"]: notes.append(f"{len(info['skipped'])} cell(s) not run ({', '.join(sorted(set(info['skipped'].values())))}).")
    if info["errors"]: notes.append(f"<b>{len(info['errors'])} cell(s) raised an error when this page was built.</b>")
    if info["fatal"]: notes.append(f"<b>The build of this page failed: {html.escape(info['fatal'])}</b>")
    # the widget manager's modules find their fonts next to the path require.js gives them
    require_paths = {**require_paths, "@jupyter-widgets": "_static/html-manager", "@jupyter-widgets/html-manager/dist": "_static/html-manager"}
    resources = dict(static=f"{rel}_static/", root=rel or "./", require_paths=json.dumps({k: rel + v for k, v in require_paths.items()}),
                     nav=nav_html(pages, html_name, rel), site_css=SITE_CSS, footer=" ".join(notes),
                     page_title=html.escape(str(fm.get("title", title_of(nb_path)))),
                     page_description=html.escape(str(fm.get("description", ""))), metadata={"name": str(fm.get("title", nb_path.stem))})
    body, _ = exp.from_notebook_node(nb, resources=resources)
    site = cfg().get("doc_host", "").rstrip("/") + cfg().get("doc_baseurl", "").rstrip("/") + "/"
    body = body.replace(site, rel or "./") if site != "/" else body
    # show_doc's "source" link carries Quarto's attribute syntax; give it to the link instead
    body = re.sub(r'<p><a href="([^"]+)">source</a>\{target="_blank" style="([^"]*)"\}</p>',
                  r'<p><a href="\1" target="_blank" style="\2">source</a></p>', body)
    dst = out / html_name
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(body)
    info.update(seconds=round(time.time() - t0, 1), widget_views=body.count('<script type="application/vnd.jupyter.widget-view+json">'),
                showdoc=len(re.findall(r'class="[^"]*celltag_showdoc', body)), bytes=len(body))
    (out / "_pages").mkdir(exist_ok=True)
    (out / "_pages" / (html_name.replace("/", "__") + ".json")).write_text(json.dumps(info, indent=1))
    return info


# ---------------------------------------------------------------- the site
def package_deps(nb: Path) -> list[Path]:
    "The package modules a notebook uses: those it names or exports, and what they import, transitively."
    lib = cfg().get("lib_name", "newtonipc_nb"); pkg = ROOT / cfg().get("lib_path", lib)
    pat = re.compile(rf"(?:\b{lib}\.|from \.|from {lib} import |default_exp\s+)(\w+)")
    found, todo = set(), set(pat.findall(nb.read_text())) | {"__init__"}
    while todo:
        m = todo.pop()
        f = pkg / f"{m}.py"
        if m in found or not f.exists(): continue
        found.add(m); todo |= set(pat.findall(f.read_text()))
    return sorted(pkg / f"{m}.py" for m in found)


def source_key(nb: Path) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes() + nb.read_bytes() + (ROOT / "settings.ini").read_bytes())
    for p in package_deps(nb): h.update(p.name.encode() + p.read_bytes())
    h.update(" ".join(sorted(skip_flags())).encode())
    return h.hexdigest()


def build(out: Path = OUT, only=(), force=False, timeout=900, jobs=1, quiet=False) -> dict:
    "Build the preview into `out`; returns the build report (also written to out/build.json)."
    out.mkdir(parents=True, exist_ok=True)
    require_paths = vendor(out)
    nbs = notebooks()
    pages = [dict(src=str(p.relative_to(NBS)), html=page_name(p), title=title_of(p)) for p in nbs]
    (out / "_site.json").write_text(json.dumps(dict(pages=pages, require_paths=require_paths)))
    todo = []
    for p in nbs:
        if only and p.stem not in only and p.name not in only: continue
        info_f = out / "_pages" / (page_name(p).replace("/", "__") + ".json")
        key = source_key(p)
        if not force and info_f.exists() and (out / page_name(p)).exists() and json.loads(info_f.read_text()).get("key") == key:
            continue
        todo.append((p, key))
    procs, running = list(todo), []
    while procs or running:
        while procs and len(running) < max(1, jobs):
            p, key = procs.pop(0)
            if not quiet: print(f"docs_preview: building {page_name(p)} from nbs/{p.relative_to(NBS)}", flush=True)
            cmd = [sys.executable, __file__, "--page", str(p), "--out", str(out), "--timeout", str(timeout), "--key", key]
            running.append((p, subprocess.Popen(cmd, stdout=None if not quiet else subprocess.DEVNULL,
                                                stderr=None if not quiet else subprocess.DEVNULL)))
        time.sleep(0.2)
        for item in list(running):
            if item[1].poll() is not None: running.remove(item)
    report = dict(pages=[], built=[str(p.relative_to(NBS)) for p, _ in todo])
    for pg in pages:
        f = out / "_pages" / (pg["html"].replace("/", "__") + ".json")
        report["pages"].append(json.loads(f.read_text()) if f.exists() else dict(source="nbs/" + pg["src"], html=pg["html"],
                                                                                   fatal="no page was built"))
    # stale pages of notebooks that are gone
    known = {pg["html"] for pg in pages}
    for f in (out / "_pages").glob("*.json"):
        name = f.stem.replace("__", "/")
        if name not in known: f.unlink(); (out / name).unlink(missing_ok=True)
    (out / "build.json").write_text(json.dumps(report, indent=1))
    if not quiet:
        for r in report["pages"]:
            state = "FAILED: " + r["fatal"] if r.get("fatal") else (f"{len(r['errors'])} cell error(s): " +
                    "; ".join(f"cell {e['cell']} {e['ename']}" for e in r["errors"][:3]) if r.get("errors") else "ok")
            print(f"  {r['html']:<28} {state}  ({len(r.get('skipped', {}))} skipped, {r.get('widget_views', 0)} 3D/widget views, "
                  f"{r.get('showdoc', 0)} API entries, {r.get('seconds', '?')} s)")
        print(f"docs_preview: open {out / 'index.html'} (or run with --serve)")
    return report


def execute_in_place(timeout, only=()):
    "For the deploy job (a throwaway checkout): execute every notebook and write outputs and widget state back into nbs/."
    import nbformat
    bad = 0
    for p in notebooks():
        if only and p.stem not in only and p.name not in only: continue
        print(f"executing nbs/{p.relative_to(NBS)}", flush=True)
        # no jslink state: nbdev_docs (execnb) takes its "source" key for cell source and cannot write the notebook
        nb, skipped, errors = execute(p, timeout, keep_links=False)
        nbformat.write(nb, p)
        for e in errors: print(f"  cell {e['cell']}: {e['ename']}: {e['evalue']}"); bad += 1
    return bad


def serve(out: Path, port: int):
    import functools, http.server
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as srv:
        print(f"docs_preview: serving {out} on http://127.0.0.1:{srv.server_address[1]}/ (Ctrl-C stops)")
        try: srv.serve_forever()
        except KeyboardInterrupt: pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="output folder (default _docs_preview/)")
    ap.add_argument("--only", nargs="*", default=(), help="build only these notebooks (stem or file name)")
    ap.add_argument("--force", action="store_true", help="rebuild pages even if their sources did not change")
    ap.add_argument("--timeout", type=int, default=900, help="seconds one cell may run")
    ap.add_argument("--jobs", type=int, default=1, help="pages built at once (each runs a kernel)")
    ap.add_argument("--serve", nargs="?", const=8000, type=int, metavar="PORT", help="serve the preview on 127.0.0.1 after building")
    ap.add_argument("--no-build", action="store_true", help="with --serve: serve what is there")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any page had a cell error or failed")
    ap.add_argument("--execute-in-place", action="store_true", help="execute nbs/*.ipynb in place (for nbdev_docs in CI)")
    ap.add_argument("--page", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--key", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.page:
        site = json.loads((a.out / "_site.json").read_text())
        build_page(a.page.resolve(), a.out, site["pages"], site["require_paths"], a.timeout, a.key); return 0
    if a.execute_in_place:
        return 1 if execute_in_place(a.timeout, a.only) and a.strict else 0
    if not a.no_build:
        rep = build(a.out.resolve(), a.only, a.force, a.timeout, a.jobs)
        if a.strict and any(r.get("errors") or r.get("fatal") for r in rep["pages"]): return 1
    if a.serve is not None: serve(a.out.resolve(), a.serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
