"""Build an offline preview of the docs site: the same pages `nbdev_docs` makes with Quarto, without Quarto.

    python .ci/docs_preview.py                 # build every page into _docs_preview/ (open _docs_preview/index.html)
    python .ci/docs_preview.py --serve         # ... then serve it on http://127.0.0.1:8000/
    python .ci/docs_preview.py --only 00a_viewer index   # rebuild some pages only
    python .ci/docs_preview.py --execute-in-place        # CI's deploy job: execute nbs/*.ipynb in place for nbdev_docs
    python .ci/docs_preview.py --run-flags slow          # also run the `#| slow` cells (hours; never by default)

For each notebook in nbs/ (each in its own process, so that one broken notebook breaks only its page):
1. execute it in a fresh kernel (nbclient), skipping the cells nbdev_test skips (`#| slow`, `#| gpu`, `#| eval: false`)
   -- a page shows the stored results of long runs; only `--run-flags FLAG...` (or NEWTONIPC_DOCS_FLAGS="slow gpu")
   runs flagged cells, NEWTONIPC_TEST_FLAGS (the test suite's) never does -- with Warp's log level at WARNING (no
   banner, no "Module ... load on device" lines), and keep the outputs and the widget state (the notebooks are
   committed without outputs, so a page gets its tables and 3D scenes here);
2. run nbdev's docs processors on it (the ones `nbdev_proc_nbs` runs: show_doc API docs, hidden cells, front matter);
3. render it to HTML (nbconvert, JupyterLab look) with a sidebar of all pages; headings get the ids Quarto (pandoc)
   gives them, which are the anchors nbdev's doc links point at (`inputs.html#ipcmodel`).

Every asset a page loads is local (nothing from a CDN): pythreejs's JS comes from the installed package; the ipywidgets
HTML manager (@jupyter-widgets/html-manager), require.js and MathJax come from their npm packages, fetched once with
`npm pack` (checked against the SHA-256 below) into _docs_preview/_vendor/. Pages whose source and package did not
change since the last build are not rebuilt (--force rebuilds).

A page fails to build when its notebook raises (a cell error, a cell over --timeout, a dead kernel) or rendering
fails. A failed page is never written over the last good one: a page is written to a temporary file and renamed only
on success; the failed render, if any, goes to _docs_preview/_failed/ for a look. Failures are listed (page and
error) in the summary and in _docs_preview/build.json, and the command exits with status 1. `check_site` (used by
tests/test_docs.py) checks a built site: every page built and present, no internal link without its page or anchor,
no Warp log lines in a page.
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


DOCS_FLAGS = "NEWTONIPC_DOCS_FLAGS"  # the flagged cells the docs build runs (--run-flags); empty by default


def skip_flags():
    "The `#| flag` cells the docs build skips: all of settings.ini's tst_flags but those NEWTONIPC_DOCS_FLAGS names."
    flags = [f for f in cfg().get("tst_flags", "").split("|") if f]
    run = os.environ.get(DOCS_FLAGS, "").split()
    unknown = sorted(set(run) - set(flags))
    if unknown: raise ValueError(f"{DOCS_FLAGS} names {unknown}, which are not tst_flags in settings.ini ({flags})")
    return set(flags) - set(run)


# Warp's INFO log (its banner with "CUDA driver not available", "Module ... load on device 'cpu' took ...") is noise on
# a page. Warp 1.19 has no `config.quiet` (setting it does nothing) and no environment variable for its log level, so
# the kernel runs this first; WARP_NOISE strips what gets through anyway (a notebook that lowers the level again).
KERNEL_EXEC_LINES = ["import warp as _wp; _wp.config.log_level = _wp.LOG_WARNING; del _wp"]
WARP_NOISE = re.compile(r"^Warp \d[\w.]* initialized:\n(?:[ \t]+.*\n?)*|^.*\bload on device '[^']*' took .*\n?"
                        r"|^.*CUDA driver not available.*\n?|^Warp CUDA warning: .*\n?",
                        flags=re.M)


def strip_warp_noise(nb) -> int:
    "Remove Warp's log lines from the text outputs of `nb` (streams, and text/plain output that nbdev's show_doc"
    " processor captures) in place; the number of outputs changed."
    n = 0
    for c in nb.cells:
        outs = []
        for o in c.get("outputs", []):
            holder, key = (o, "text") if o.get("output_type") == "stream" else (o.get("data", {}), "text/plain")
            if key in holder and (o.get("output_type") == "stream" or set(holder) == {"text/plain"}):
                text = "".join(holder[key]) if isinstance(holder[key], list) else holder[key]
                new = WARP_NOISE.sub("", text)
                if new != text:
                    n += 1
                    if not new.strip(): continue
                    holder[key] = new
            outs.append(o)
        if c.cell_type == "code": c.outputs = outs
    return n


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
                                resources={"metadata": {"path": str(nb_path.parent)}},
                                extra_arguments=[f"--IPKernelApp.exec_lines={line}" for line in KERNEL_EXEC_LINES])
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
    strip_warp_noise(nb)
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
""" + (Path(__file__).resolve().parents[1] / "nbs" / "styles.css").read_text()


def nav_html(pages, current, rel):
    items = []
    for p in pages:
        cls = ' class="current"' if p["html"] == current else ""
        items.append(f'<li{cls}><a href="{rel}{p["html"]}">{html.escape(p["title"])}</a></li>')
    title = html.escape(cfg().get("title", "docs"))
    return f'<a class="site-title" href="{rel}index.html">{title}</a><ul>{"".join(items)}</ul>'


def pandoc_id(text: str) -> str:
    "The id pandoc (so Quarto) gives a heading with this text, and nbdev's doc links point at: lower case, punctuation"
    " other than `_ - .` dropped, spaces to hyphens, nothing before the first letter."
    s = re.sub(r"[^\w\s.-]", "", text).strip().lower()
    s = re.sub(r"\s+", "-", s)
    while s and not s[0].isalpha(): s = s[1:]
    return s or "section"


HEADING = re.compile(r'<(h[1-6])([^>]*?)\sid="([^"]*)"([^>]*)>(.*?)</\1>', flags=re.S)


def pandoc_heading_ids(body: str) -> str:
    "Give every heading nbconvert wrote (id = its text with spaces as hyphens) pandoc's id, and point the page's own"
    " `#old-id` links at the new ids (duplicates get -1, -2, ... as in pandoc)."
    from urllib.parse import unquote
    seen, renamed = {}, {}
    def new_id(m):
        text = html.unescape(re.sub(r"<[^>]+>", "", re.sub(r'<a class="anchor-link".*?</a>', "", m.group(5), flags=re.S)))
        base = pandoc_id(text); n = seen.get(base, 0); seen[base] = n + 1
        nid = base if n == 0 else f"{base}-{n}"
        renamed.setdefault(unquote(html.unescape(m.group(3))), nid)
        return f'<{m.group(1)}{m.group(2)} id="{nid}"{m.group(4)}>{m.group(5)}</{m.group(1)}>'
    body = HEADING.sub(new_id, body)
    return re.sub(r'href="#([^"]*)"', lambda m: f'href="#{renamed.get(unquote(html.unescape(m.group(1))), m.group(1))}"', body)


def build_page(nb_path: Path, out: Path, pages, require_paths, timeout, key):
    import nbformat, jinja2
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    t0 = time.time()
    html_name = page_name(nb_path)
    rel = "../" * html_name.count("/")
    info = dict(source=str(nb_path.relative_to(ROOT) if nb_path.is_relative_to(ROOT) else nb_path), html=html_name, key=key,
                errors=[], skipped={}, fatal=None, ok=False)
    info_f = out / "_pages" / (html_name.replace("/", "__") + ".json")
    info_f.parent.mkdir(parents=True, exist_ok=True)
    def record(): info_f.write_text(json.dumps(info, indent=1))
    try:
        nb, skipped, errors = execute(nb_path, timeout)
        info.update(skipped={str(k): v for k, v in skipped.items()}, errors=errors)
        try:  # nbdev's show_doc processor runs the exported cells here, in this process: Warp quiet here too
            import warp; warp.config.log_level = warp.LOG_WARNING
        except ImportError: pass
        nb = nbdev_process(nb, nb_path)
        strip_warp_noise(nb)
    except Exception as e:  # the page is not built; the last good one stays
        import traceback
        info["fatal"] = f"{type(e).__name__}: {e}"[:2000]
        sys.stderr.write(traceback.format_exc())
        info.update(seconds=round(time.time() - t0, 1)); record()
        return info
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
    body = pandoc_heading_ids(body)
    info.update(seconds=round(time.time() - t0, 1), widget_views=body.count('<script type="application/vnd.jupyter.widget-view+json">'),
                showdoc=len(re.findall(r'class="[^"]*celltag_showdoc', body)), bytes=len(body))
    if info["errors"]:  # a notebook that raised is a failed build: its render goes to _failed/, the last good page stays
        failed = out / "_failed" / html_name
        failed.parent.mkdir(parents=True, exist_ok=True); failed.write_text(body)
        info["fatal"] = (f"{len(info['errors'])} cell(s) raised, first: cell {info['errors'][0]['cell']} "
                         f"{info['errors'][0]['ename']}: {info['errors'][0]['evalue'][:300]} (its render: {failed})")
        record(); return info
    write_atomic(out / html_name, body)
    (out / "_failed" / html_name).unlink(missing_ok=True)
    info["ok"] = True; record()
    return info


def write_atomic(dst: Path, text: str):
    "Write `dst` whole or not at all: a temporary file next to it, renamed over it."
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + dst.name + ".", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "w") as f: f.write(text)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True); raise


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


def build(out: Path = OUT, only=(), force=False, timeout=900, jobs=1, quiet=False, run_flags=None) -> dict:
    "Build the preview into `out`; returns the build report (also written to out/build.json): `pages` (one record each,"
    " `ok` or `fatal`) and `failed` (the pages whose build failed, with the error)."
    if run_flags is not None: os.environ[DOCS_FLAGS] = " ".join(run_flags)  # the page processes inherit it
    skip_flags()  # an unknown flag stops here
    out.mkdir(parents=True, exist_ok=True)
    require_paths = vendor(out)
    if (NBS / "images").is_dir():   # pictures the pages' prose shows (e.g. the index's), served beside the pages
        shutil.copytree(NBS / "images", out / "images", dirs_exist_ok=True)
    nbs = notebooks()
    rel = lambda p: str(p.relative_to(NBS) if p.is_relative_to(NBS) else p.name)
    pages = [dict(src=rel(p), html=page_name(p), title=title_of(p)) for p in nbs]
    (out / "_site.json").write_text(json.dumps(dict(pages=pages, require_paths=require_paths)))
    todo = []
    for p in nbs:
        if only and p.stem not in only and p.name not in only: continue
        info_f = out / "_pages" / (page_name(p).replace("/", "__") + ".json")
        key = source_key(p)
        if not force and info_f.exists() and (out / page_name(p)).exists():
            old = json.loads(info_f.read_text())
            if old.get("key") == key and old.get("ok"): continue
        todo.append((p, key))
    procs, running = list(todo), []
    while procs or running:
        while procs and len(running) < max(1, jobs):
            p, key = procs.pop(0)
            if not quiet: print(f"docs_preview: building {page_name(p)} from nbs/{rel(p)}", flush=True)
            info_f = out / "_pages" / (page_name(p).replace("/", "__") + ".json")
            info_f.unlink(missing_ok=True)  # the page process writes it; none afterwards means the process died
            cmd = [sys.executable, __file__, "--page", str(p), "--out", str(out), "--timeout", str(timeout), "--key", key]
            log = out / "_pages" / (page_name(p).replace("/", "__") + ".log"); log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "w") as err:
                proc = subprocess.Popen(cmd, stdout=None if not quiet else subprocess.DEVNULL, stderr=None if not quiet else err)
            running.append((p, info_f, proc))
        time.sleep(0.2)
        for item in list(running):
            p, info_f, proc = item
            if proc.poll() is None: continue
            running.remove(item)
            log = out / "_pages" / (page_name(p).replace("/", "__") + ".log")
            err = log.read_text(errors="replace") if log.exists() else ""
            if not info_f.exists() or proc.returncode:
                tail = " ".join(err.strip().splitlines()[-3:])[-600:]
                info = json.loads(info_f.read_text()) if info_f.exists() else dict(
                    source="nbs/" + rel(p), html=page_name(p), errors=[], skipped={})
                info.update(ok=False, fatal=info.get("fatal") or f"the page's build process exited with status {proc.returncode}"
                            + (f": {tail}" if tail else ""))
                info_f.parent.mkdir(parents=True, exist_ok=True); info_f.write_text(json.dumps(info, indent=1))
    report = dict(pages=[], built=[rel(p) for p, _ in todo])
    for pg in pages:
        f = out / "_pages" / (pg["html"].replace("/", "__") + ".json")
        rec = json.loads(f.read_text()) if f.exists() else dict(source="nbs/" + pg["src"], html=pg["html"], errors=[],
                                                                 skipped={}, fatal="no page was built", ok=False)
        if rec.get("ok") and not (out / pg["html"]).exists(): rec.update(ok=False, fatal="the page file is missing")
        report["pages"].append(rec)
    chosen = {page_name(p) for p in nbs if not only or p.stem in only or p.name in only}
    report["failed"] = {r["html"]: r.get("fatal") or "failed" for r in report["pages"] if not r.get("ok") and r["html"] in chosen}
    # stale pages of notebooks that are gone
    known = {pg["html"] for pg in pages}
    for f in (out / "_pages").glob("*.json"):
        name = f.stem.replace("__", "/")
        if name not in known: f.unlink(); (out / name).unlink(missing_ok=True)
    (out / "build.json").write_text(json.dumps(report, indent=1))
    if not quiet:
        for r in report["pages"]:
            if r["html"] not in chosen: continue
            state = "ok" if r.get("ok") else "FAILED: " + str(r.get("fatal"))[:300]
            print(f"  {r['html']:<28} {state}  ({len(r.get('skipped', {}))} skipped, {r.get('widget_views', 0)} 3D/widget views, "
                  f"{r.get('showdoc', 0)} API entries, {r.get('seconds', '?')} s)")
        print(f"docs_preview: open {out / 'index.html'} (or run with --serve)")
    for name, why in report["failed"].items():
        print(f"docs_preview: FAILED {name}: {why}", file=sys.stderr)
    return report


# ---------------------------------------------------------------- checking a built site
WARP_NOISE_ON_PAGE = re.compile(r"Warp \d[\w.]* initialized:|load on device '[^']*' took|CUDA driver not available"
                                r"|Warp CUDA warning:")


def page_links(body: str):
    "The ids (and a names) a page defines, and the href of every <a> on it."
    ids = set(map(html.unescape, re.findall(r'\sid="([^"]*)"', body))) | set(map(html.unescape, re.findall(r'<a\s[^>]*\bname="([^"]*)"', body)))
    hrefs = [html.unescape(h) for h in re.findall(r'<a\s[^>]*?\bhref="([^"]*)"', body, flags=re.S)]
    return ids, hrefs


def internal_target(page: str, href: str):
    "(site path, anchor) an href on `page` points at, or None for an outside link (scheme, //host, data:)."
    from urllib.parse import unquote, urlsplit
    u = urlsplit(href)
    if u.scheme or u.netloc or href.startswith("//"): return None
    path = unquote(u.path)
    if not path: target = page
    else:
        parts = page.split("/")[:-1]
        for seg in path.split("/"):
            if seg in ("", "."): continue
            if seg == "..":
                if not parts: return ("../" + path, unquote(u.fragment))  # above the site root: broken
                parts.pop()
            else: parts.append(seg)
        target = "/".join(parts)
    return target, unquote(u.fragment)


def check_site(out: Path, report: dict | None = None) -> list[str]:
    "What is wrong with the site built in `out`: pages whose build failed (from `report`, else out/build.json), pages"
    " missing, internal links whose page or anchor does not exist, Warp log lines on a page. One line per problem."
    problems = []
    site = json.loads((out / "_site.json").read_text()) if (out / "_site.json").exists() else None
    if site is None: return [f"{out}: no _site.json (nothing was built)"]
    if report is None:
        report = json.loads((out / "build.json").read_text()) if (out / "build.json").exists() else dict(pages=[])
    recs = {r["html"]: r for r in report.get("pages", [])}
    names = [pg["html"] for pg in site["pages"]]
    for n in names:
        r = recs.get(n)
        if r is None: problems.append(f"{n}: not in the build report (never built)")
        elif not r.get("ok"): problems.append(f"{n}: its build failed: {str(r.get('fatal'))[:500]}")
    bodies = {}
    for n in names:
        f = out / n
        if not f.exists(): problems.append(f"{n}: the page is missing"); continue
        bodies[n] = f.read_text(errors="replace")
    ids = {n: page_links(b)[0] for n, b in bodies.items()}
    for n, body in bodies.items():
        seen = set()
        for href in page_links(body)[1]:
            t = internal_target(n, href)
            if t is None or (n, href) in seen: continue
            seen.add((n, href)); path, anchor = t
            if path.endswith("/") or path == "": path += "index.html"
            if path in ids:
                if anchor and anchor not in ids[path]:
                    problems.append(f"{n}: link {href!r}: {path} has no anchor #{anchor}")
            elif not (out / path).is_file() or path.startswith("../"):
                problems.append(f"{n}: link {href!r}: no page {path}")
        m = WARP_NOISE_ON_PAGE.search(html.unescape(re.sub(r"<[^>]+>", "", body)))
        if m: problems.append(f"{n}: Warp's log on the page ({m.group(0)!r})")
    return problems


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
    ap.add_argument("--strict", action="store_true", help="with --execute-in-place: exit 1 if a cell raised (a page build"
                    " always exits 1 when a page failed)")
    ap.add_argument("--run-flags", nargs="*", default=None, metavar="FLAG", help="also run the cells flagged with these "
                    f"tst_flags (slow, gpu); default: none, or {DOCS_FLAGS}")
    ap.add_argument("--execute-in-place", action="store_true", help="execute nbs/*.ipynb in place (for nbdev_docs in CI)")
    ap.add_argument("--page", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--key", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    if a.page:
        site = json.loads((a.out / "_site.json").read_text())
        build_page(a.page.resolve(), a.out, site["pages"], site["require_paths"], a.timeout, a.key); return 0
    if a.run_flags is not None: os.environ[DOCS_FLAGS] = " ".join(a.run_flags)
    if a.execute_in_place:
        return 1 if execute_in_place(a.timeout, a.only) and a.strict else 0
    if not a.no_build:
        rep = build(a.out.resolve(), a.only, a.force, a.timeout, a.jobs, run_flags=a.run_flags)
        if rep["failed"]: return 1
    if a.serve is not None: serve(a.out.resolve(), a.serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
