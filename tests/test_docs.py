"""The docs site: the Quarto/nbdev settings `nbdev_docs` needs, the deploy workflow, the checks of a built site (on
small made-up sites and notebooks, in the default suite), the stored scene of a trajectory view, and (flag `browser`)
the offline preview built and opened page by page in headless Chromium.

The browser check builds the preview with the contributing page's command (`python .ci/docs_preview.py`, which
executes the notebooks but never their `slow`/`gpu` cells: pages show stored results) and needs Debian's `chromium`
(`apt-get install -y chromium`). Run it with
    NEWTONIPC_TEST_FLAGS=browser python -m pytest tests/test_docs.py
It fails when a page fails to build or is missing, has a console error, a broken internal link, missing API docs,
untypeset math, a blank 3D canvas, Warp log lines, or a scene whose objects show different frames. Screenshots of
every page and of every 3D canvas land in _docs_preview/_check/.
"""
import base64, contextlib, functools, http.server, importlib.util, json, os, re, shutil, struct, subprocess, tempfile, threading, time, zlib
from configparser import ConfigParser
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_preview", ROOT / ".ci" / "docs_preview.py")
docs_preview = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(docs_preview)
CFG = ConfigParser(delimiters=["="]); CFG.read(ROOT / "settings.ini"); CFG = CFG["DEFAULT"]
BROWSER_FLAG = "browser"  # NEWTONIPC_TEST_FLAGS=browser runs the browser check (and switches on no notebook cell)
CONTRIBUTING = ROOT / "nbs" / "contributing.ipynb"
BROWSER_CMD = f"NEWTONIPC_TEST_FLAGS={BROWSER_FLAG} .venv/bin/python -m pytest tests/test_docs.py"


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
    assert "viewer.html" in names and "contributing.html" in names and all(not n[0].isdigit() for n in names)
    assert names[-1] == "contributing.html", "the contributing page comes last in the sidebar"


def test_contributing_page_gives_the_commands():
    "The docs-building instructions live on the contributing page: the preview, the browser check, tests, flags, nbdev."
    md = "".join("".join(c["source"]) for c in json.loads(CONTRIBUTING.read_text())["cells"] if c["cell_type"] == "markdown")
    for what in (".venv/bin/python .ci/docs_preview.py", BROWSER_CMD, "--run-flags slow", "python -m pytest tests",
                 "`slow`", "`gpu`", f"`{BROWSER_FLAG}`", "nbdev_export", "nbdev_clean", "nbdev_update", ".ci/readme.py",
                 "deploy.yaml", "Quarto", "_docs_preview/_check/"):
        assert what in md, f"the contributing page does not mention {what!r}"


@contextlib.contextmanager
def env(**kw):
    old = {k: os.environ.get(k) for k in kw}
    for k, v in kw.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v
    try: yield
    finally:
        for k, v in old.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v


def test_skipped_cells_follow_docs_flags_not_test_flags():
    "The docs build skips flagged cells whatever NEWTONIPC_TEST_FLAGS says; only --run-flags (NEWTONIPC_DOCS_FLAGS) runs them."
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("#| slow\nprint('slow ran')"),
                                         nbformat.v4.new_code_cell("#| eval: false\nraise RuntimeError('eval false ran')"),
                                         nbformat.v4.new_code_cell("x = 6 * 7\nprint(x)")])
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.ipynb"; nbformat.write(nb, p)
        with env(NEWTONIPC_TEST_FLAGS="slow gpu browser", NEWTONIPC_DOCS_FLAGS=None):
            ran, skipped, errors = docs_preview.execute(p, timeout=60)
        with env(NEWTONIPC_DOCS_FLAGS="slow"):
            ran_slow, skipped_slow, _ = docs_preview.execute(p, timeout=60)
        with env(NEWTONIPC_DOCS_FLAGS="browser"), pytest.raises(ValueError, match="not tst_flags"):
            docs_preview.skip_flags()
    assert skipped == {0: "slow", 1: "eval: false"} and errors == []
    assert ran.cells[2].outputs[0]["text"] == "42\n" and "not run in the docs build" in ran.cells[0].outputs[0]["text"]
    assert ran.cells[0].source.startswith("#| slow")
    assert skipped_slow == {1: "eval: false"} and ran_slow.cells[0].outputs[0]["text"] == "slow ran\n"


def test_warp_is_quiet_in_the_docs_build():
    "The kernel runs with Warp's log level at WARNING; what gets through anyway is stripped from the outputs."
    import nbformat
    noisy = ("Warp 1.19.0 initialized:\n   Git commit: abc\n   CUDA Toolkit 12.9, CUDA driver not available (NVRTC compilation available)\n"
             "   Devices:\n     \"cpu\"      : \"x86_64\"\n   Kernel cache:\n     /tmp/wc\n"
             "Module newtonipc_nb.barrier 1a2b3c4 load on device 'cpu' took 12.34 ms  (cached)\nresult 7\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import warp as wp; print(wp.config.log_level == wp.LOG_WARNING)"),
                                         nbformat.v4.new_code_cell(f"import sys; sys.stdout.write({noisy!r}); "
                                                                   "sys.stderr.write('Warp CUDA warning: Could not find or load the NVIDIA CUDA driver.\\n');")])
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.ipynb"; nbformat.write(nb, p)
        ran, _, errors = docs_preview.execute(p, timeout=120)
    assert errors == [] and ran.cells[0].outputs[0]["text"] == "True\n"
    texts = [o["text"] for o in ran.cells[1].outputs]
    assert texts == ["result 7\n"], texts
    # nbdev's show_doc processor runs exported cells in the build process and keeps what they print as text/plain
    shown = nbformat.v4.new_code_cell("show_doc(f)", outputs=[nbformat.v4.new_output("display_data", data={"text/plain": noisy}),
                                                              nbformat.v4.new_output("display_data", data={"text/plain": "Warp 1.19.0 initialized:\n   Devices:\n"})])
    nb2 = nbformat.v4.new_notebook(cells=[shown])
    assert docs_preview.strip_warp_noise(nb2) == 2 and [o["data"]["text/plain"] for o in nb2.cells[0].outputs] == ["result 7\n"]


# ------------------------------------------------------------------ the checks of a built site, on made-up sites
def fake_site(tmp: Path, pages: dict, report=None):
    "A built site in `tmp`: `pages` maps a page name to its HTML body (None: listed but not written)."
    (tmp / "_site.json").write_text(json.dumps(dict(pages=[dict(src=n.replace(".html", ".ipynb"), html=n, title=n) for n in pages],
                                                    require_paths={})))
    (tmp / "_static").mkdir(exist_ok=True); (tmp / "_static" / "x.css").write_text("")
    for n, body in pages.items():
        if body is not None: (tmp / n).parent.mkdir(parents=True, exist_ok=True); (tmp / n).write_text(body)
    report = report or dict(pages=[dict(html=n, ok=True) for n in pages])
    (tmp / "build.json").write_text(json.dumps(report))
    return tmp


GOOD = {"index.html": '<h1 id="home">Home</h1><a href="./api.html#ipcmodel">IPCModel</a> <a href="api.html">API</a> '
                      '<a href="#home">top</a> <a href="https://example.org/x.html#nope">out</a> <a href="_static/x.css">css</a>',
        "api.html": '<h3 id="ipcmodel">IPCModel</h3><h3 id="ipcmodel.from_newton">IPCModel.from_newton</h3>'
                    '<a href="./index.html">home</a> <a href="#ipcmodel.from_newton">m</a>',
        "sub/deep.html": '<h2 id="deep">Deep</h2><a href="../api.html#ipcmodel">up</a> <a href="../index.html#home">home</a>'}


def test_check_site_passes_a_good_site(tmp_path):
    assert docs_preview.check_site(fake_site(tmp_path, GOOD)) == []


@pytest.mark.parametrize("defect, expect", [
    ("missing page", "api.html: the page is missing"),
    ("failed build", "api.html: its build failed: CellTimeoutError: cell 3 ran past 900 s"),
    ("never built", "api.html: not in the build report"),
    ("missing anchor", "index.html: link './api.html#ipcmodel.to_newton': api.html has no anchor #ipcmodel.to_newton"),
    ("capitalised anchor", "index.html: link './api.html#IPCModel': api.html has no anchor #IPCModel"),
    ("missing page link", "index.html: link 'gone.html#x': no page gone.html"),
    ("above the root", "sub/deep.html: link '../../api.html': no page ../"),
    ("missing same-page anchor", "api.html: link '#nowhere': api.html has no anchor #nowhere"),
    ("warp log", "api.html: Warp's log on the page"),
])
def test_check_site_finds_each_defect(tmp_path, defect, expect):
    "Every failure the browser check reports from the built files is found on a small made-up site."
    pages, report = dict(GOOD), None
    if defect == "missing page": pages["api.html"] = None
    elif defect == "failed build":
        report = dict(pages=[dict(html=n, ok=n != "api.html", fatal=None if n != "api.html" else "CellTimeoutError: cell 3 ran past 900 s")
                             for n in pages])
    elif defect == "never built": report = dict(pages=[dict(html=n, ok=True) for n in pages if n != "api.html"])
    elif defect == "missing anchor": pages["index.html"] += '<a href="./api.html#ipcmodel.to_newton">x</a>'
    elif defect == "capitalised anchor": pages["index.html"] += '<a href="./api.html#IPCModel">x</a>'
    elif defect == "missing page link": pages["index.html"] += '<a href="gone.html#x">x</a>'
    elif defect == "above the root": pages["sub/deep.html"] += '<a href="../../api.html">x</a>'
    elif defect == "missing same-page anchor": pages["api.html"] += '<a href="#nowhere">x</a>'
    elif defect == "warp log": pages["api.html"] += "<pre>Module newtonipc_nb.ccd 1a2b3c4 load on device &#x27;cpu&#x27; took 3.10 ms</pre>"
    problems = docs_preview.check_site(fake_site(tmp_path, pages, report))
    if defect == "missing page":  # and every link to it
        assert problems[0] == expect and all("no page api.html" in p for p in problems[1:]) and len(problems) == 4, problems
    else: assert len(problems) == 1 and problems[0].startswith(expect), problems


def test_heading_ids_are_the_anchors_nbdev_links_to():
    "Headings get pandoc's ids (what Quarto gives them and nbdev's doc links point at); the page's own links follow."
    assert docs_preview.pandoc_id("IPCModel") == "ipcmodel"
    assert docs_preview.pandoc_id("IPCModel.from_newton") == "ipcmodel.from_newton"
    assert docs_preview.pandoc_id("IPCModel: the solver's view of a Newton model") == "ipcmodel-the-solvers-view-of-a-newton-model"
    assert docs_preview.pandoc_id("1. Vertex–triangle (§6)") == "vertextriangle-6"
    body = ('<h3 id="IPCModel">IPCModel<a class="anchor-link" href="#IPCModel">¶</a></h3>'
            '<h2 id="Vertex–triangle">Vertex–triangle<a class="anchor-link" href="#Vertex%E2%80%93triangle">¶</a></h2>'
            '<h2 id="Notes">Notes</h2><h2 id="Notes">Notes</h2><a href="#IPCModel">see</a>')
    out = docs_preview.pandoc_heading_ids(body)
    ids, hrefs = docs_preview.page_links(out)
    assert ids == {"ipcmodel", "vertextriangle", "notes", "notes-1"} and set(hrefs) == {"#ipcmodel", "#vertextriangle"}
    from nbdev.doclinks import NbdevLookup  # nbdev's own link for a class of the package: the id the page gives it
    link = NbdevLookup().doc("IPCModel")
    assert link.endswith("inputs.html#ipcmodel"), link


def test_failed_page_build_keeps_the_last_good_page_and_exits_1(tmp_path, monkeypatch):
    "A notebook that raises, or runs past the cell timeout, fails its page: named in the report with its error, the"
    " page before it left untouched, exit status 1; a good notebook's page is (re)written whole."
    import nbformat
    src = tmp_path / "nbs"; src.mkdir()
    books = {"good": ["print('fine')"], "raises": ["raise ValueError('broken on purpose')"],
             "slowcell": ["import time; time.sleep(60)"]}
    for name, cells in books.items():
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}")] +
                                                [nbformat.v4.new_code_cell(c) for c in cells]), src / f"{name}.ipynb")
    out = tmp_path / "site"; out.mkdir()
    for name in books: (out / f"{name}.html").write_text(f"last good {name}")
    (out / "_static" / "html-manager").mkdir(parents=True)
    monkeypatch.setattr(docs_preview, "notebooks", lambda: sorted(src.glob("*.ipynb")))
    monkeypatch.setattr(docs_preview, "vendor", lambda out: {})
    rc = docs_preview.main(["--out", str(out), "--timeout", "5"])
    report = json.loads((out / "build.json").read_text())
    assert rc == 1 and set(report["failed"]) == {"raises.html", "slowcell.html"}, report["failed"]
    assert "ValueError: broken on purpose" in report["failed"]["raises.html"]
    assert "Timeout" in report["failed"]["slowcell.html"] or "timed out" in report["failed"]["slowcell.html"]
    assert (out / "raises.html").read_text() == "last good raises" and (out / "slowcell.html").read_text() == "last good slowcell"
    assert "broken on purpose" in (out / "_failed" / "raises.html").read_text()
    assert "fine" in (out / "good.html").read_text() and not list(out.glob(".*.tmp"))
    problems = docs_preview.check_site(out)
    assert any(p.startswith("raises.html: its build failed") for p in problems)
    assert any(p.startswith("slowcell.html: its build failed") for p in problems)


# ------------------------------------------------------------------ the scene a trajectory view stores
def shown_frame(drawn: dict, film_targets, sphere_tracks, tol=1e-5):
    "The kept frame k at which every object of a scene is drawn: the film (base + Σ w (target − base)), each sphere"
    " centre; None if no single frame fits them all. `drawn`: {'film': (N, 3), 'film_wire': ..., 'sphere0': (3,), ...}."
    targets = np.asarray(film_targets, dtype=np.float64)
    scale = max(float(np.ptp(targets.reshape(-1, 3), axis=0).max()), 1e-12)
    fits = []
    for k in range(len(targets)):
        ok = all(np.abs(np.asarray(v, dtype=np.float64) - (targets[k] if n.startswith("film") else sphere_tracks[n][k])).max()
                 <= tol * scale for n, v in drawn.items())
        if ok: fits.append(k)
    return fits[0] if fits else None


def drawn_film(base, targets, weights):
    "Where three.js draws morph-targeted positions (absolute targets, as in pythreejs's three.js r97)."
    base = np.asarray(base, dtype=np.float64)
    return base + sum(w * (np.asarray(t, dtype=np.float64) - base) for w, t in zip(weights, targets) if w)


def test_shown_frame_tells_mixed_frames():
    targets = np.arange(4 * 5 * 3, dtype=float).reshape(4, 5, 3); balls = {"sphere0": np.arange(12.0).reshape(4, 3)}
    assert shown_frame({"film": targets[2], "sphere0": balls["sphere0"][2]}, targets, balls) == 2
    assert shown_frame({"film": targets[0], "sphere0": balls["sphere0"][3]}, targets, balls) is None   # the reported bug
    assert shown_frame({"film": targets[3], "film_wire": targets[1]}, targets, balls) is None
    assert np.allclose(drawn_film(targets[0], targets, [0, 0, 1, 0]), targets[2])
    assert np.allclose(drawn_film(targets[2], targets, [0, 0, 0, 0]), targets[2])


def test_trajectory_view_stores_one_frame_for_every_object():
    "On load (the stored state) and after the slider moves, the film (weights and base positions), the spheres, the"
    " slider and the label show the same frame; the base positions alone show it too (weights not yet applied)."
    from newtonipc_nb.viewer import trajectory_view, waving_sheet, close_widgets
    wf, wF, wball = waving_sheet(T=90)
    frames = np.concatenate([wf, wf[::-1] + 0.01]); balls = np.concatenate([wball, wball[::-1]])  # 180 frames
    tv = trajectory_view(frames, wF, spheres=balls, radii=[0.05], fps=30, max_frames=40)
    try:
        content = tv.renderer.scene.children[0]
        film, wire = [o for o in content.children if o.name in ("film", "film_wire")]
        ball = next(o for o in content.children if o.name == "sphere0")
        keep = tv.kept; targets = frames[keep]; tracks = {"sphere0": balls[keep, 0]}
        slider, label = tv.slider, tv.children[2].children[3]
        def check(k):
            base = np.asarray(film.geometry.attributes["position"].array)
            drawn = {"film": drawn_film(base, targets, film.morphTargetInfluences),
                     "film_wire": drawn_film(base, targets, wire.morphTargetInfluences), "sphere0": ball.position}
            assert shown_frame(drawn, targets, tracks, tol=1e-6) == k
            assert slider.value == keep[k] and f"frame {keep[k]} of 0–{len(frames) - 1}" in label.value
            assert tv.shown == k and tv.play.value == k
        assert len(keep) == 40 and keep[-1] == 179
        check(39)                                                     # on load: the last frame
        base = np.asarray(film.geometry.attributes["position"].array)  # the film's base positions are the shown frame
        assert shown_frame({"film": base, "sphere0": ball.position}, targets, tracks, tol=1e-6) == 39
        slider.value = 100; check(int(np.argmin(abs(keep - 100))))  # snapped to the nearest kept frame
        tv.play.value = 5; check(5)
        tv2 = trajectory_view(frames, wF, spheres=balls, radii=[0.05], fps=30, max_frames=40, frame=0)
        c2 = tv2.renderer.scene.children[0].children
        assert np.allclose(c2[0].geometry.attributes["position"].array, frames[0], atol=1e-6)
        assert np.allclose(c2[2].position, balls[0, 0]) and tv2.slider.value == 0
        close_widgets(tv2)
    finally:
        close_widgets(tv)


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


# Before any script of a page runs: when require.js has the path of three.js, load it and wrap
# AnimationMixer.clipAction (pythreejs makes each clip's action with `mixer.clipAction(clip, root)`) so that every
# trajectory scene, its clip and its action can be read back from the page.
HOOK_JS = r"""
window.__clips = [];
(function wait() {
  const r = window.requirejs, ctx = r && r.s && r.s.contexts && r.s.contexts._;
  if (ctx && ctx.config && ctx.config.paths && ctx.config.paths.three) {
    r(['three'], function (T) {
      const clipAction = T.AnimationMixer.prototype.clipAction;
      T.AnimationMixer.prototype.clipAction = function (clip, root) {
        const a = clipAction.call(this, clip, root);
        if (a && !window.__clips.some(c => c.action === a)) window.__clips.push({root: root || this.getRoot(), clip: a.getClip(), action: a});
        return a;
      };
      window.__threeHooked = true;
    });
  } else if (document.readyState !== 'complete') setTimeout(wait, 2);
})();
"""

# Every trajectory scene: the film's base positions and morph targets (one per kept frame), the weights of the film and
# its wireframe, each sphere's position, the clip's sphere tracks and kept times, the action's time, and the texts of
# the widget box around it (its clip line, slider readout and frame label), in the page's order of play buttons.
SCENES_JS = r"""
(() => {
  const arr = a => Array.from(a || []);
  const out = [];
  for (const rec of window.__clips) {
    const s = {time: rec.action.time, objects: {}, tracks: {}, times: [], targets: null, base: null};
    rec.root.traverse(o => {
      if (o.isMesh && (o.name === 'film' || o.name === 'film_wire')) {
        const g = o.geometry;
        if (!s.targets) { s.targets = (g.morphAttributes.position || []).map(t => arr(t.array)); s.base = arr(g.attributes.position.array); }
        s.objects[o.name] = {weights: arr(o.morphTargetInfluences)};
      } else if (/^sphere\d+$/.test(o.name)) s.objects[o.name] = {position: o.position.toArray()};
    });
    for (const t of rec.clip.tracks) {
      let m = /^(sphere\d+)\.position$/.exec(t.name);
      if (m) s.tracks[m[1]] = arr(t.values);
      m = /^film\.morphTargetInfluences\[(\d+)\]$/.exec(t.name);
      if (m) s.times[+m[1]] = t.times[arr(t.values).indexOf(1)];
    }
    out.push(s);
  }
  const boxes = [...document.querySelectorAll('.trajectory-play')].map(el => {
    const box = el.closest('.widget-vbox');
    const ro = box && box.querySelector('.widget-readout');
    return {text: box ? box.innerText : '', readout: ro ? ro.innerText : null};
  });
  return {scenes: out, boxes: boxes, hooked: !!window.__threeHooked};
})()
"""


def scene_blend(sc: dict):
    "The weights over the kept frames that the drawn film shows, or a string saying why it shows no one blend."
    K, N = len(sc["targets"]), len(sc["base"]) // 3
    targets, base = np.asarray(sc["targets"], dtype=np.float64).reshape(K, N, 3), np.asarray(sc["base"], dtype=np.float64).reshape(N, 3)
    scale = max(float(np.ptp(targets.reshape(-1, 3), axis=0).max()), 1e-9)
    blends = {}
    for name in ("film", "film_wire"):
        w = np.zeros(K); got = sc["objects"].get(name, {}).get("weights", [])
        w[:len(got)] = got
        drawn = drawn_film(base, targets, w)
        if abs(w.sum() - 1) < 1e-4: blends[name] = w
        elif abs(w.sum()) < 1e-6:  # weights not applied: the base positions are drawn
            k = shown_frame({"film": drawn}, targets, {}, tol=1e-4)
            if k is None: return f"{name}: its base positions are no kept frame"
            blends[name] = np.eye(K)[k]
        else: return f"{name}: morph weights sum to {w.sum():.4g}"
        if np.abs(drawn - np.tensordot(blends[name], targets, 1)).max() > 1e-4 * scale:
            return f"{name}: drawn positions are not the blend of frames its weights say"
    if "film_wire" in blends and np.abs(blends["film"] - blends["film_wire"]).max() > 1e-4:
        return f"film at frame(s) {np.flatnonzero(blends['film'])}, its wireframe at {np.flatnonzero(blends['film_wire'])}"
    return blends["film"]


def scene_problems(sc: dict) -> list[str]:
    "Objects of one trajectory scene that show a different frame (or blend of frames) from the film's."
    w = scene_blend(sc)
    if isinstance(w, str): return [w]
    K = len(sc["targets"]); out = []
    for name, o in sc["objects"].items():
        if "position" not in o: continue
        vals = np.asarray(sc["tracks"].get(name, []), dtype=np.float64).reshape(-1, 3)
        if len(vals) != K: out.append(f"{name}: {len(vals)} keyframes for {K} film frames"); continue
        want = w @ vals; span = max(float(np.ptp(vals, axis=0).max()), 1e-6)
        if np.abs(np.asarray(o["position"]) - want).max() > 1e-3 * span + 1e-6:
            ks = [int(k) for k in np.flatnonzero(np.abs(vals - np.asarray(o["position"])).max(1) < 1e-6 + 1e-3 * span)]
            out.append(f"{name} is at {o['position']} (kept frame(s) {ks}), the film at kept frame(s) "
                       f"{[int(k) for k in np.flatnonzero(w > 1e-6)]} (weights {np.round(w[w > 1e-6], 3).tolist()})")
    return out


def box_frame(box: dict, sc: dict):
    "The kept frame the widget box's slider and label name (it prints the trajectory frame and the fps), or a problem."
    m = re.search(r"at ([\d.]+) fps", box["text"]); f = re.search(r"frame (\d+) of 0–(\d+)", box["text"])
    if not (m and f and box["readout"]): return f"the box names no frame (text {box['text'][:200]!r})"
    fps, shown = float(m.group(1)), int(f.group(1))
    if int(box["readout"]) != shown: return f"the slider shows frame {box['readout']}, the label frame {shown}"
    kept = [int(round(t * fps)) for t in sc["times"]]
    return kept.index(shown) if shown in kept else f"frame {shown} is not a kept frame {kept[:5]}..."


def test_scene_checks_tell_mixed_frames():
    "The checks of a trajectory scene read from a page: one frame for all (on load, mid-play), and the bug reported."
    T = np.arange(3 * 4 * 3, dtype=float).reshape(3, 4, 3); S = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0.]])
    sc = lambda base, w, wire, ball: dict(targets=T.reshape(3, -1).tolist(), base=T[base].ravel().tolist(), tracks={"sphere0": S.ravel().tolist()},
                                          times=[0, .5, 1], objects={"film": {"weights": w}, "film_wire": {"weights": wire},
                                                                     "sphere0": {"position": ball}})
    assert scene_problems(sc(2, [0, 0, 1], [0, 0, 1], [2, 0, 0])) == []
    assert scene_problems(sc(2, [0, 0, 0], [0, 0, 0], [2, 0, 0])) == []                # weights not applied: base = frame 2
    assert scene_problems(sc(0, [0, .25, .75], [0, .25, .75], [1.75, 0, 0])) == []     # mid-play
    assert "sphere0 is at [2, 0, 0] (kept frame(s) [2]), the film at kept frame(s) [0]" in scene_problems(sc(0, [0, 0, 0], [0, 0, 0], [2, 0, 0]))[0]
    assert "wireframe" in scene_problems(sc(0, [0, 0, 1], [1, 0, 0], [2, 0, 0]))[0]
    assert "sum to" in scene_problems(sc(0, [0, 1, 1], [0, 1, 1], [2, 0, 0]))[0]
    box = {"text": "a clip of 3 of the 21 frames, 1 s at 20 fps frame 20 of 0–20, t = 1 s", "readout": "20"}
    assert box_frame(box, dict(times=[0, .5, 1])) == 2
    assert "slider shows frame 19" in box_frame(dict(box, readout="19"), dict(times=[0, .5, 1]))


def check_page(browser, base, name, page, check) -> list[str]:
    "Open one built page and return its problems (console errors, math, API docs, canvases, scenes)."
    problems = []
    try: browser.goto(base + name)
    except Exception as e: return [f"{name}: could not be opened ({type(e).__name__}: {e})"]
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
    if docs_preview.source_key(src) == page.get("key"):  # else someone edited it while the check ran: API docs not checked
        want, warp_funcs = documented_names(src)
        got = set(browser.js("[...document.querySelectorAll('.celltag_showdoc h2[id], .celltag_showdoc h3[id], "
                             ".celltag_showdoc h4[id]')].map(h => h.textContent.trim())"))
        shown = lambda n: n in got or any(g.endswith("." + n) for g in got)  # a @patch-ed method shows as Class.name
        missing = [n for n in want if not shown(n)]
        if missing: problems.append(f"{name}: API docs missing for {missing}")
        if [n for n in warp_funcs if not shown(n)]:
            problems.append(f"{name}: no API docs for the Warp functions {[n for n in warp_funcs if not shown(n)]} (nbdev's "
                            "show_doc skips them; an explicit `show_doc(f.func, name='f')` cell in the notebook documents one)")
    else: print(f"NOTE {name}: its notebook or module changed after the page was built; API docs not checked")
    if not views: return problems
    rects = browser.js("[...document.querySelectorAll('canvas')].map(c => {const r = c.getBoundingClientRect();"
                       "return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};})"
                       ".filter(r => r.width > 50 && r.height > 50)")
    if not rects: problems.append(f"{name}: {views} widget view(s) but no 3D canvas rendered")
    for i, r in enumerate(rects):
        png = browser.screenshot(clip=r)
        (check / f"{name.replace('/', '__')}.canvas{i}.png").write_bytes(png)
        cover, colours, bg = canvas_coverage(png)
        if cover < 0.01 or colours < 8:
            problems.append(f"{name}: canvas {i} is blank ({cover:.1%} non-background pixels, {colours} colours, bg {bg})")
    # trajectory scenes: every object at one frame on load (the frame the slider and label name), while playing, after stop
    n_play = browser.js("document.querySelectorAll('.trajectory-play').length")
    state = browser.js(SCENES_JS)
    if n_play and (not state["hooked"] or len(state["scenes"]) != n_play):
        problems.append(f"{name}: {n_play} trajectory view(s) but {len(state['scenes'])} scene(s) read from the page "
                        f"(three.js hooked: {state['hooked']})")
        return problems
    loaded = []
    for k, (sc, box) in enumerate(zip(state["scenes"], state["boxes"])):
        loaded.append(scene_blend(sc))
        problems += [f"{name}: trajectory {k} on load: {p}" for p in scene_problems(sc)]
        kb = box_frame(box, sc)
        if isinstance(kb, str): problems.append(f"{name}: trajectory {k} on load: {kb}")
        elif not isinstance(loaded[-1], str) and loaded[-1][kb] < 1 - 1e-6:
            problems.append(f"{name}: trajectory {k} on load: the slider and label name kept frame {kb}, the scene shows "
                            f"{np.flatnonzero(loaded[-1] > 1e-6).tolist()}")
    for k in range(n_play):  # play in the browser (no kernel): the scene moves, every object follows the same frame
        r = browser.js(f"(() => {{const el = document.querySelectorAll('.trajectory-play')[{k}];"
                       "const c = el.closest('.widget-vbox').querySelector('canvas'); c.scrollIntoView();"
                       "const r = c.getBoundingClientRect();"
                       "return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};})()")
        before = browser.screenshot(clip=r)
        buttons = f"document.querySelectorAll('.trajectory-play')[{k}].querySelectorAll('button')"
        browser.js(f"{buttons}[0].click(), 1")
        shots = []
        for _ in range(3): time.sleep(0.4); shots.append(browser.screenshot(clip=r))
        (check / f"{name.replace('/', '__')}.play{k}.png").write_bytes(shots[-1])
        if len({before, *shots}) < 3: problems.append(f"{name}: trajectory {k} does not move when played")
        browser.js(f"{buttons}[1].click(), 1"); time.sleep(0.3)  # pause: mid-clip, between two kept frames
        sc = browser.js(SCENES_JS)["scenes"][k]
        problems += [f"{name}: trajectory {k} paused at t = {sc['time']:.3f} s: {p}" for p in scene_problems(sc)]
        browser.js(f"{buttons}[2].click(), 1"); time.sleep(0.5)  # stop: back to the frame shown on load
        sc = browser.js(SCENES_JS)["scenes"][k]
        problems += [f"{name}: trajectory {k} after stop: {p}" for p in scene_problems(sc)]
        after = scene_blend(sc)
        if not isinstance(after, str) and not isinstance(loaded[k], str) and np.abs(after - loaded[k]).max() > 1e-6:
            problems.append(f"{name}: trajectory {k} after stop shows kept frame(s) {np.flatnonzero(after > 1e-6).tolist()}, "
                            f"on load {np.flatnonzero(loaded[k] > 1e-6).tolist()}")
    errs = browser.errors()
    if errs: problems.append(f"{name}: console errors while playing: {errs[:5]}")
    return problems


@pytest.mark.skipif(BROWSER_FLAG not in os.environ.get("NEWTONIPC_TEST_FLAGS", "").split(),
                    reason=f"the browser check; set NEWTONIPC_TEST_FLAGS={BROWSER_FLAG} to run it")
def test_preview_pages_in_headless_chromium():
    "Build the preview (stored results only: no flagged cell runs) and open every page: see the module docstring."
    assert CHROMIUM, "chromium is not installed (apt-get install -y chromium)"
    assert shutil.which("npm") or (docs_preview.OUT / "_vendor").exists(), \
        "npm is not installed and the page assets were never fetched (python .ci/docs_preview.py fetches them once)"
    out, t_start = docs_preview.OUT, time.time()
    with env(NEWTONIPC_DOCS_FLAGS=None):
        report = docs_preview.build(out, quiet=True, run_flags=[])
    t_built = time.time()
    problems = docs_preview.check_site(out, report)  # failed or missing pages, broken links, Warp's log
    check = out / "_check"; shutil.rmtree(check, ignore_errors=True); check.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}/"
    browser, opened, canvases = Browser(), [], 0
    try:
        browser.call("Page.addScriptToEvaluateOnNewDocument", session=True, source=HOOK_JS)
        for page in report["pages"]:
            if not (out / page["html"]).exists(): continue  # check_site said so
            problems += check_page(browser, base, page["html"], page, check)
            opened.append(page["html"])
            canvases += len(list(check.glob(page["html"].replace("/", "__") + ".canvas*.png")))
    finally:
        browser.close(); srv.shutdown()
    site = [pg["html"] for pg in json.loads((out / "_site.json").read_text())["pages"]]
    problems += [f"{n}: not opened" for n in site if n not in opened]
    print(f"browser check: {len(report['built'])} page(s) built in {t_built - t_start:.0f} s, {len(opened)} opened in "
          f"{time.time() - t_built:.0f} s, {canvases} canvases; screenshots in {check}")
    assert not problems, "\n".join(problems)
    assert canvases >= 1, "no page showed a 3D canvas (the viewer page has two)"


def test_page_subtitles_are_plain_text():
    "A page's subtitle (the `>` line under its title) is rendered as plain text: backticks would show literally."
    import nbformat
    bad = {}
    for p in docs_preview.notebooks():
        first = nbformat.read(p, as_version=4).cells[0].source
        subs = [l for l in first.splitlines() if l.startswith(">")]
        if subs and "`" in subs[0]: bad[p.name] = subs[0]
    assert not bad, bad
