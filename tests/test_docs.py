"""The docs site: the Quarto/nbdev settings `nbdev_docs` needs, the deploy workflow, and (slow) the offline preview
opened page by page in headless Chromium.

The browser test builds the preview with the README's command (`python .ci/docs_preview.py`, which executes the
notebooks) and needs Debian's `chromium` (`apt-get install -y chromium`); it is skipped, saying why, when chromium
is absent. Run it with
    NEWTONIPC_TEST_FLAGS=slow python -m pytest tests/test_docs.py
Screenshots of every page and of every 3D canvas land in _docs_preview/_check/.
"""
import base64, functools, http.server, importlib.util, json, os, re, shutil, struct, subprocess, tempfile, threading, time, zlib
from configparser import ConfigParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_preview", ROOT / ".ci" / "docs_preview.py")
docs_preview = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(docs_preview)
CFG = ConfigParser(delimiters=["="]); CFG.read(ROOT / "settings.ini"); CFG = CFG["DEFAULT"]


# ------------------------------------------------------------------ fast checks (default suite)
def test_quarto_settings_make_the_whole_site():
    q = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    assert (ROOT / "nbs" / "_quarto.yml").resolve().read_text() == (ROOT / "_quarto.yml").read_text(), \
        "nbs/_quarto.yml (what nbdev_docs renders with) must be the top-level _quarto.yml"
    assert q["project"]["type"] == "website"
    # nbdev_docs writes nbdev.yml (title, site-url, output-dir from settings.ini) and sidebar.yml (one entry per notebook)
    assert set(q["metadata-files"]) >= {"nbdev.yml", "sidebar.yml"}
    css = q["format"]["html"]["css"]
    assert (ROOT / "nbs" / css).exists(), f"css {css} must be a path inside nbs/ (Quarto renders from nbdev's _proc/ copy of nbs/)"
    assert CFG["doc_path"] == "_docs" and CFG.get("custom_sidebar", "False") == "False"


def test_deploy_workflow_executes_then_publishes():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yaml").read_text())
    steps = [s for job in wf["jobs"].values() for s in job["steps"]]
    text = json.dumps(steps)
    publish = "actions/deploy-pages" if "actions/deploy-pages" in text else "peaceiris/actions-gh-pages"
    order = [text.find(k) for k in ("quarto-dev/quarto-actions/setup", "docs_preview.py --execute-in-place", "nbdev_docs", publish)]
    assert all(i >= 0 for i in order) and order == sorted(order), order


def test_every_notebook_gets_a_page():
    nbs = docs_preview.notebooks()
    names = [docs_preview.page_name(p) for p in nbs]
    assert names[0] == "index.html" and len(set(names)) == len(names)
    assert "viewer.html" in names and all(not n[0].isdigit() for n in names)
    readme = (ROOT / "README.md").read_text()
    assert "python .ci/docs_preview.py" in readme, "the README gives the one preview command"


def test_skipped_cells_follow_tst_flags():
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("#| slow\nraise RuntimeError('slow ran')"),
                                         nbformat.v4.new_code_cell("#| eval: false\nraise RuntimeError('eval false ran')"),
                                         nbformat.v4.new_code_cell("x = 6 * 7\nprint(x)")])
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.ipynb"; nbformat.write(nb, p)
        old = os.environ.pop("NEWTONIPC_TEST_FLAGS", None)
        try: ran, skipped, errors = docs_preview.execute(p, timeout=60)
        finally:
            if old is not None: os.environ["NEWTONIPC_TEST_FLAGS"] = old
    assert skipped == {0: "slow", 1: "eval: false"} and errors == []
    assert ran.cells[2].outputs[0]["text"] == "42\n" and "not run in the docs build" in ran.cells[0].outputs[0]["text"]
    assert ran.cells[0].source.startswith("#| slow")


# ------------------------------------------------------------------ headless Chromium through the DevTools protocol
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--enable-unsafe-swiftshader",
         "--use-angle=swiftshader", "--window-size=1280,1000", "--hide-scrollbars"]


class Browser:
    "Chromium started with a fresh profile, driven over its DevTools websocket (one page, flat session)."
    def __init__(self):
        import websocket
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and len(port_file.read_text().split()) == 2: break
            time.sleep(0.1)
        else: self.close(); raise RuntimeError("chromium did not open its DevTools port")
        port, path = port_file.read_text().split()
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=60, suppress_origin=True)
        self.n, self.events = 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"): self.call(f"{domain}.enable", session=True)

    def call(self, method, session=False, **params):
        self.n += 1; msg = dict(id=self.n, method=method, params=params)
        if session: msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            r = json.loads(self.ws.recv())
            if r.get("id") == self.n:
                if "error" in r: raise RuntimeError(f"{method}: {r['error']}")
                return r.get("result", {})
            self.events.append(r)

    def js(self, expr):
        r = self.call("Runtime.evaluate", session=True, expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r: raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def goto(self, url, timeout=60):
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.js("document.readyState") == "complete": return
            time.sleep(0.2)
        raise TimeoutError(url)

    def errors(self):
        "Console errors, uncaught exceptions and failed loads since the last navigation or the last call."
        self.call("Runtime.evaluate", session=True, expression="0")  # drain
        out, events, self.events = [], self.events, []
        for e in events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]; out.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
            elif m == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
        return out

    def screenshot(self, clip=None):
        kw = dict(format="png", captureBeyondViewport=True)
        if clip: kw["clip"] = dict(clip, scale=1)
        return base64.b64decode(self.call("Page.captureScreenshot", session=True, **kw)["data"])

    def close(self):
        try: self.ws.close()
        except Exception: pass
        self.proc.terminate()
        try: self.proc.wait(10)
        except subprocess.TimeoutExpired: self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def png_pixels(data: bytes):
    "Decode an 8-bit RGB(A) non-interlaced PNG (what Chromium writes) into (width, height, rows of (r, g, b) tuples)."
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8]); body = data[pos + 8:pos + 8 + n]; pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT": idat += body
    raw, rows, prev, stride = zlib.decompress(idat), [], bytearray(w * bpp), w * bpp
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0; b = prev[i]; c = prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)]); prev = line
    return w, h, rows


def canvas_coverage(png: bytes):
    "Fraction of pixels that differ from the most common colour (the background), and the number of distinct colours."
    from collections import Counter
    _, _, rows = png_pixels(png)
    cnt = Counter(p for r in rows for p in r)
    bg, nbg = cnt.most_common(1)[0]
    return 1 - nbg / sum(cnt.values()), len(cnt), bg


def test_canvas_coverage_tells_blank_from_drawn():
    def png(rows):
        raw = b"".join(b"\x00" + bytes(c for p in r for c in p) for r in rows)
        chunk = lambda k, b: struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b))
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", len(rows[0]), len(rows), 8, 2, 0, 0, 0)) + \
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    blank = [[(247, 247, 247)] * 10 for _ in range(10)]
    drawn = [r[:] for r in blank]; drawn[4][2:8] = [(30, 90, 200)] * 6
    assert canvas_coverage(png(blank))[:2] == (0, 1)
    cover, colours, bg = canvas_coverage(png(drawn))
    assert abs(cover - 0.06) < 1e-12 and colours == 2 and bg == (247, 247, 247)


def documented_names(nb: Path):
    "The names nbdev gives show_doc entries (top-level defs and classes of exported cells), split into (python, warp):"
    " nbdev's show_doc skips Warp's @wp.func objects (it skips any type named 'Function'): their notebooks document them"
    " with explicit `show_doc(f.func, name='f')` cells."
    import ast, importlib
    cells = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    m = re.search(r"^#\|\s*default_exp\s+([\w.]+)", "\n".join(cells), flags=re.M)
    if not m: return [], []
    mod = importlib.import_module(f"{CFG['lib_name']}.{m.group(1)}")
    names = []
    for src in cells:
        if not re.search(r"^#\|\s*exports?\b", src, flags=re.M): continue
        try: tree = ast.parse("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!"))))
        except SyntaxError: continue
        names += [o.name for o in tree.body if isinstance(o, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and not o.name.startswith("_")]
    is_warp = lambda n: type(getattr(mod, n, None)).__name__ == "Function" and type(getattr(mod, n)).__module__.startswith("warp")
    return [n for n in names if not is_warp(n)], [n for n in names if is_warp(n)]


def test_warp_functions_get_api_docs():
    """nbdev's show_doc renders nothing for a Warp @wp.func object, so every public Warp function of an exported notebook
    has an explicit `show_doc(f.func, name="f")` cell, which renders its name, Warp-typed signature and docstring."""
    from nbdev.showdoc import show_doc
    from newtonipc_nb import barrier as mod
    covered = set()
    for nb in docs_preview.notebooks():
        _, warp_funcs = documented_names(nb)
        code = [re.sub(r"\s+", "", "".join(c["source"])) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
        missing = [n for n in warp_funcs if f'show_doc({n}.func,name="{n}")' not in code]
        assert not missing, f"{nb.name}: no show_doc cell for the Warp functions {missing}"
        covered |= set(warp_funcs)
    assert {"point_triangle_weights", "edge_edge_weights", "candidate_weights", "barrier", "barrier_d1", "barrier_d2"} <= covered
    assert show_doc(mod.barrier) is None                     # what nbdev does with the Warp object itself: nothing
    md = show_doc(mod.barrier.func, name="barrier")._repr_markdown_()
    assert "### barrier\n" in md and "g:wp.float64, dhat:wp.float64, k:wp.float64" in md and ")->wp.float64" in md
    assert mod.barrier.func.__doc__ and mod.barrier.func.__doc__ in md
    md = show_doc(mod.point_triangle_weights.func, name="point_triangle_weights")._repr_markdown_()
    assert "### point_triangle_weights" in md and "p:wp.vec3d" in md and ")->wp.vec4d" in md


@pytest.mark.slow
def test_preview_pages_in_headless_chromium():
    if CHROMIUM is None: pytest.skip("chromium is not installed (apt-get install -y chromium)")
    if not (shutil.which("npm") or (docs_preview.OUT / "_static" / "html-manager" / "embed-amd.js").exists()):
        pytest.skip("npm is not installed and the page assets were never fetched (python .ci/docs_preview.py fetches them once)")
    out = docs_preview.OUT
    report = docs_preview.build(out, quiet=True)
    check = out / "_check"; shutil.rmtree(check, ignore_errors=True); check.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}/"
    browser, problems, notes, canvases_seen = Browser(), [], [], 0
    try:
        for page in report["pages"]:
            name = page["html"]
            if page.get("fatal"): notes.append(f"{name}: its build failed ({page['fatal'][:200]})"); continue
            if page.get("errors"): notes.append(f"{name}: {len(page['errors'])} cell error(s) in the notebook, first: "
                                                f"{page['errors'][0]['ename']}: {page['errors'][0]['evalue'][:120]}")
            browser.goto(base + name)
            views = page.get("widget_views", 0)
            t0, last, stable = time.time(), -1, 0
            while views and time.time() - t0 < 60 and stable < 3:  # the widget manager renders every view, then stops
                n = browser.js("document.querySelectorAll('canvas').length")
                stable, last = (stable + 1 if n == last and n > 0 else 0), n
                time.sleep(0.5)
            time.sleep(3 if views else 0.5)  # let three.js draw and MathJax typeset
            (check / (name.replace("/", "__") + ".png")).write_bytes(browser.screenshot())
            errs = browser.errors()
            if errs: problems.append(f"{name}: console errors: {errs[:5]}")
            src = docs_preview.NBS / page["source"].split("nbs/", 1)[1]
            md = "".join("".join(c["source"]) for c in json.loads(src.read_text())["cells"] if c["cell_type"] == "markdown")
            if "$$" in md or re.search(r"\$[^$\s][^$]*\$", md):  # the page has math: MathJax (local) typeset it
                typeset = browser.js("document.querySelectorAll('mjx-container').length")
                if not typeset or browser.js("document.querySelector('main').innerText.includes('$$')"):
                    problems.append(f"{name}: its math is not typeset ({typeset} formulas rendered)")
            fresh = docs_preview.source_key(src) == page.get("key")  # else someone edited it while the check ran
            if not fresh: notes.append(f"{name}: its notebook or module changed after the page was built; API docs not checked")
            want, warp_funcs = documented_names(src) if fresh else ([], [])
            got = set(browser.js("[...document.querySelectorAll('.celltag_showdoc h2[id], .celltag_showdoc h3[id], "
                                 ".celltag_showdoc h4[id]')].map(h => h.textContent.trim())"))
            shown = lambda n: n in got or any(g.endswith("." + n) for g in got)  # a @patch-ed method shows as Class.name
            missing = [n for n in want if not shown(n)]
            if missing: problems.append(f"{name}: API docs missing for {missing}")
            if [n for n in warp_funcs if not shown(n)]:
                problems.append(f"{name}: no API docs for the Warp functions {[n for n in warp_funcs if not shown(n)]} (nbdev's "
                                "show_doc skips them; an explicit `show_doc(f.func, name='f')` cell in the notebook documents one)")
            if views:
                rects = browser.js("[...document.querySelectorAll('canvas')].map(c => {const r = c.getBoundingClientRect();"
                                   "return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};})"
                                   ".filter(r => r.width > 50 && r.height > 50)")
                if not rects: problems.append(f"{name}: {views} widget view(s) but no 3D canvas rendered")
                for i, r in enumerate(rects):
                    png = browser.screenshot(clip=r)
                    (check / f"{name.replace('/', '__')}.canvas{i}.png").write_bytes(png)
                    cover, colours, bg = canvas_coverage(png)
                    canvases_seen += 1
                    if cover < 0.01 or colours < 8:
                        problems.append(f"{name}: canvas {i} is blank ({cover:.1%} non-background pixels, {colours} colours, bg {bg})")
                # trajectory playback without a kernel: press the clip's play button, the scene must move
                for k in range(browser.js("document.querySelectorAll('.trajectory-play').length")):
                    r = browser.js(f"(() => {{const el = document.querySelectorAll('.trajectory-play')[{k}];"
                                   "const c = el.closest('.widget-vbox').querySelector('canvas'); c.scrollIntoView();"
                                   "const r = c.getBoundingClientRect();"
                                   "return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};})()")
                    before = browser.screenshot(clip=r)
                    browser.js(f"document.querySelectorAll('.trajectory-play')[{k}].querySelector('button').click(), 1")
                    shots = []
                    for _ in range(3): time.sleep(0.4); shots.append(browser.screenshot(clip=r))
                    (check / f"{name.replace('/', '__')}.play{k}.png").write_bytes(shots[-1])
                    if len({before, *shots}) < 3: problems.append(f"{name}: trajectory {k} does not move when played")
                    browser.js(f"document.querySelectorAll('.trajectory-play')[{k}].querySelectorAll('button')[2].click(), 1")
                errs = browser.errors()
                if errs: problems.append(f"{name}: console errors while playing: {errs[:5]}")
    finally:
        browser.close(); srv.shutdown()
    for n in notes: print("NOTE", n)
    assert not problems, "\n".join(problems)
    assert canvases_seen >= 1, "no page showed a 3D canvas (the viewer page has two)"
