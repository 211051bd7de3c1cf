"""The docs site: the Quarto/nbdev settings `nbdev_docs` needs, the deploy workflow, the offline preview and its checks
(.ci/docs_preview.py, with .ci/docs_check.js in the page): each failure mode the checks catch is shown on a small
made-up site, page or scene, and (flag `browser`) the whole preview is built and opened page by page in Chromium.

The browser tests need Debian's `chromium` and `chromium-driver` (`apt-get install -y chromium chromium-driver`):
    NEWTONIPC_TEST_FLAGS=browser .venv/bin/python -m pytest tests/test_docs.py
Screenshots of every page, canvas and trajectory view (on load, playing, at the end) land in _docs_preview/_check/.
"""
import functools, http.server, importlib.util, io, json, os, re, shutil, threading
from configparser import ConfigParser
from pathlib import Path

import nbformat
import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / ".ci" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


docs_preview = _load("docs_preview")
CFG = ConfigParser(delimiters=["="])
CFG.read(ROOT / "settings.ini")
CFG = CFG["DEFAULT"]
BROWSER_FLAG = "browser"  # NEWTONIPC_TEST_FLAGS=browser runs the browser tests (and switches on no notebook cell)
BROWSER_CMD = f"NEWTONIPC_TEST_FLAGS={BROWSER_FLAG} .venv/bin/python -m pytest tests/test_docs.py"
browser = pytest.mark.skipif(BROWSER_FLAG not in os.environ.get("NEWTONIPC_TEST_FLAGS", "").split(),
                             reason=f"a browser test; set NEWTONIPC_TEST_FLAGS={BROWSER_FLAG} to run it")


def test_quarto_settings_make_the_whole_site():
    q = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    assert (ROOT / "nbs" / "_quarto.yml").resolve().read_text() == (ROOT / "_quarto.yml").read_text(), \
        "nbs/_quarto.yml (what nbdev_docs renders with) must be the top-level _quarto.yml"
    assert q["project"]["type"] == "website"
    # nbdev_docs writes nbdev.yml (title, site-url, output-dir from settings.ini) and sidebar.yml (a page per notebook)
    assert set(q["metadata-files"]) >= {"nbdev.yml", "sidebar.yml"}
    css = q["format"]["html"]["css"]
    assert (ROOT / "nbs" / css).exists(), f"css {css} must be inside nbs/ (Quarto renders nbdev's _proc/ copy)"
    assert CFG["doc_path"] == "_docs" and CFG.get("custom_sidebar", "False") == "False"


def test_deploy_workflow_executes_then_publishes():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yaml").read_text())
    steps = [s for job in wf["jobs"].values() for s in job["steps"]]
    text = json.dumps(steps)
    publish = "actions/deploy-pages" if "actions/deploy-pages" in text else "peaceiris/actions-gh-pages"
    keys = ("quarto-dev/quarto-actions/setup", "docs_preview.py --execute_in_place", "nbdev_docs", publish)
    order = [text.find(k) for k in keys]
    assert all(i >= 0 for i in order) and order == sorted(order), order


def test_every_notebook_gets_a_page():
    names = list(docs_preview.notebooks().values())
    assert names[0] == "index.html" and len(set(names)) == len(names)
    assert "viewer.html" in names and "contributing.html" in names and all(not n[0].isdigit() for n in names)
    assert names[-1] == "contributing.html", "the contributing page comes last in the sidebar"


def test_contributing_page_gives_the_extension_points_and_the_commands():
    "The contributing page explains how to extend the method, then the commands: preview, browser check, tests, nbdev."
    cells = nbformat.read(ROOT / "nbs" / "contributing.ipynb", 4).cells
    md = "".join(c.source for c in cells if c.cell_type == "markdown")
    for what in ("energy term", "contact kind", "obstacle", ".venv/bin/python .ci/docs_preview.py", BROWSER_CMD,
                 "`slow`", "`gpu`", f"`{BROWSER_FLAG}`", "nbdev_export", "nbdev_clean", "_docs_preview/_check/"):
        assert what in md, f"the contributing page does not mention {what!r}"


# ------------------------------------------------------------------ building pages
def fake_notebooks(tmp_path, monkeypatch, books: dict):
    "Notebooks of made-up cells in tmp_path/nbs, which the preview then takes for the site's."
    src = tmp_path / "nbs"
    src.mkdir()
    for name, cells in books.items():
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}\n\n> a made-up page")] +
                                      [nbformat.v4.new_code_cell(c) for c in cells])
        nbformat.write(nb, src / f"{name}.ipynb")
    monkeypatch.setattr(docs_preview, "notebooks", lambda: {p: f"{p.stem}.html" for p in sorted(src.glob("*.ipynb"))})
    return tmp_path / "site"


def test_flagged_cells_are_skipped_and_warp_is_quiet(tmp_path, monkeypatch):
    "Cells flagged `slow` (unless --run-flags names it) and `eval: false` are not run; Warp logs nothing on a page."
    fake_notebooks(tmp_path, monkeypatch, {"t": [
        "#| slow\nprint('slow ran')", "#| eval: false\nraise RuntimeError('ran')",
        "import warp as wp\nwp.init()\nprint(wp.config.log_level == wp.LOG_WARNING)"]})
    p = tmp_path / "nbs" / "t.ipynb"
    nb, errors = docs_preview.execute(p, timeout=120)
    assert errors == [] and "not run for the docs: a `slow` cell" in nb.cells[1].outputs[0]["text"]
    assert [o["text"] for o in nb.cells[3].outputs] == ["True\n"], nb.cells[3].outputs   # no banner either
    nb, errors = docs_preview.execute(p, timeout=120, run_flags=["slow"])
    assert nb.cells[1].outputs[0]["text"] == "slow ran\n"


def test_failed_page_keeps_the_last_good_page_and_exits_1(tmp_path, monkeypatch):
    "Failure mode: a failed page. A notebook that raises, or runs past the cell timeout, fails its page: named in"
    " build.json with its error, the page before it untouched, exit status 1, and check_site reports it."
    out = fake_notebooks(tmp_path, monkeypatch, {
        "good": ["print('fine')"], "raises": ["raise ValueError('on purpose')"],
        "slowcell": ["import time\ntime.sleep(60)"]})
    out.mkdir()
    for name in ("raises", "slowcell"):  # built before the notebooks changed
        (out / f"{name}.html").write_text(f"last good {name}")
        os.utime(out / f"{name}.html", (0, 0))
    monkeypatch.setattr(docs_preview, "OUT", out)
    with pytest.raises(SystemExit) as exit_status:
        docs_preview.main(timeout=5)
    assert exit_status.value.code == 1
    report = json.loads((out / "build.json").read_text())
    assert set(report["failed"]) == {"raises.html", "slowcell.html"}
    assert "ValueError: on purpose" in report["failed"]["raises.html"]
    assert "Timeout" in report["failed"]["slowcell.html"] or "timed out" in report["failed"]["slowcell.html"]
    assert (out / "raises.html").read_text() == "last good raises"
    assert "on purpose" in (out / "_failed" / "raises.html").read_text()
    assert "fine" in (out / "good.html").read_text() and oct((out / "good.html").stat().st_mode & 0o777) == "0o644"
    problems = docs_preview.check_site(out)
    assert [p.split(":")[0] for p in problems] == ["raises.html", "slowcell.html"], problems


def test_heading_ids_are_the_anchors_nbdev_links_to():
    "Headings get pandoc's ids (what Quarto gives them and nbdev's doc links point at)."
    assert docs_preview.pandoc_id("IPCModel.from_newton") == "ipcmodel.from_newton"
    assert docs_preview.pandoc_id("IPCModel: the solver's view") == "ipcmodel-the-solvers-view"
    assert docs_preview.pandoc_id("1. Vertex–triangle (§6)") == "vertextriangle-6"
    from nbdev.doclinks import NbdevLookup
    assert NbdevLookup().doc("IPCModel").endswith("inputs.html#ipcmodel")


# ------------------------------------------------------------------ the checks of a built site, on made-up sites
GOOD = {"index.html": '<h1 id="home">Home</h1><a href="./api.html#ipcmodel">IPCModel</a> <a href="api.html">API</a> '
                      '<a href="#home">top</a> <a href="https://example.org/x.html#nope">out</a> '
                      '<a href="s.css">css</a>'
                      '<table><tr><th>wall time (s)</th><td>SolverError: invalid start</td><td>703</td></tr></table>',
        "api.html": '<h3 id="ipcmodel">IPCModel</h3><a href="./index.html">home</a> <a href="#ipcmodel">m</a>',
        "sub/deep.html": '<h2 id="deep">Deep</h2><a href="../api.html#ipcmodel">up</a>'}


def fake_site(tmp: Path, pages: dict, failed=None):
    for n, body in pages.items():
        if body is not None:
            (tmp / n).parent.mkdir(parents=True, exist_ok=True)
            (tmp / n).write_text(body)
            (tmp / n).chmod(0o644)
    (tmp / "s.css").write_text("")
    (tmp / "build.json").write_text(json.dumps(dict(pages=list(pages), failed=failed or {})))
    return tmp


@pytest.mark.parametrize("defect, expect", [
    (None, None),
    ("missing page", "api.html: the page is missing"),
    ("failed build", "api.html: its build failed: CellTimeoutError"),
    ("missing anchor", "index.html: link './api.html#ipcmodel.to_newton': api.html has no anchor #ipcmodel.to_newton"),
    ("missing page link", "index.html: link 'gone.html#x': no page gone.html"),
    ("above the root", "sub/deep.html: link '../../api.html': no page ../api.html"),
    ("missing same-page anchor", "api.html: link '#nowhere': api.html has no anchor #nowhere"),
    ("warp log", "api.html: Warp's log on the page"),
    ("cut cell …", "index.html: 1 table cell(s) cut short"),
    ("cut cell ...", "index.html: 1 table cell(s) cut short"),
    ("not world-readable", "api.html: not world-readable (mode 0o600)"),
])
def test_check_site_finds_each_defect(tmp_path, defect, expect):
    "Failure modes: a failed or missing page, a broken link or anchor, log noise, a cut table cell, a page the web"
    " server may not read."
    pages, failed = dict(GOOD), {}
    if defect == "missing page": pages["api.html"] = None
    elif defect == "failed build": failed = {"api.html": "CellTimeoutError: cell 3 ran past 900 s"}
    elif defect == "missing anchor": pages["index.html"] += '<a href="./api.html#ipcmodel.to_newton">x</a>'
    elif defect == "missing page link": pages["index.html"] += '<a href="gone.html#x">x</a>'
    elif defect == "above the root": pages["sub/deep.html"] += '<a href="../../api.html">x</a>'
    elif defect == "missing same-page anchor": pages["api.html"] += '<a href="#nowhere">x</a>'
    elif defect == "warp log":
        pages["api.html"] += "<pre>Module newtonipc_nb.ccd 1a2b3c4 load on device 'cpu' took 3.10 ms</pre>"
    elif defect and defect.startswith("cut cell"):
        cut = "invalid start; state_in/state_ou" + defect[-3:].strip()
        pages["index.html"] = pages["index.html"].replace("invalid start", cut)
    site = fake_site(tmp_path, pages, failed)
    if defect == "not world-readable": (site / "api.html").chmod(0o600)
    problems = docs_preview.check_site(site)
    if expect is None: assert problems == []
    elif defect == "missing page":  # and the three links to it
        assert problems[0] == expect and len(problems) == 4, problems
        assert all("no page api.html" in p for p in problems[1:]), problems
    else: assert len(problems) == 1 and problems[0].startswith(expect), problems


def png(rows) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(np.asarray(rows, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


class FakePage:
    "A driver on a page without widgets whose one canvas, `w` × `h`, chromedriver shoots as `rows`."
    def __init__(self, rows, w=64, h=48):
        self.rows, self.size = np.asarray(rows), [w, h]

    def get(self, url): pass
    def get_log(self, kind): return []
    def save_screenshot(self, path): pass

    def execute_script(self, src, *args):
        expr = src.removeprefix("return ")
        if expr == "canvases()": return [self]
        if expr == "inView(arguments[0])": return self.size
        if expr == "views().length": return 0
        return None

    @property
    def screenshot_as_png(self): return png(self.rows)


def test_check_page_wants_the_whole_canvas_drawn(tmp_path):
    "Failure modes: a blank canvas, and a screenshot of part of a canvas (chromedriver, not scrolling to a canvas the"
    " viewport's edge cuts, shot reference_scenes' first as its top strip of background: a false 'blank')."
    drawn = np.full((48, 64, 3), 247)
    drawn[30:40, 10:50] = np.arange(40)[None, :, None] * 5        # 40 colours below the top strip, 13 % of the pixels
    assert docs_preview.check_page(FakePage(drawn), "http://x/p.html", tmp_path) == []
    assert docs_preview.check_page(FakePage(np.full((48, 64, 3), 247)), "http://x/p.html", tmp_path) == \
        ["p.html: canvas 0 is blank (0.0, 1)"]
    assert docs_preview.check_page(FakePage(drawn[:17]), "http://x/p.html", tmp_path) == \
        ["p.html: canvas 0: its screenshot is (64, 17), not the whole canvas [64, 48]"]


# ------------------------------------------------------------------ a trajectory view, as the page's script reads it
T3 = np.arange(3 * 4 * 3, dtype=float).reshape(3, 4, 3)
S3 = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0.]])


def scene(base, w, wire, ball, label="0.00–1.00 s simulated\nt = 1.0 s", readouts=(), body=None):
    "A view as docs_preview.js reads it: three kept frames, a sphere and a body (at frame `body`, else as the film)."
    tracks = {"sphere0.position": S3.ravel().tolist(), "body0.position": (S3 + [0, 5, 0]).ravel().tolist()}
    at = np.asarray(w, float) @ S3 if sum(w) else S3[base]
    return dict(targets=T3.reshape(3, -1).tolist(), base=T3[base].ravel().tolist(), tracks=tracks, times=[0, .5, 1],
                weights={"film": w, "film_wire": wire}, label=label, readouts=list(readouts),
                now={"sphere0.position": ball, "body0.position": (S3[body] if body is not None else at) + [0, 5, 0]})


def test_scene_frame_tells_mixed_frames():
    "Failure mode: mixed trajectory frames (the film, its wireframe, the spheres and the bodies at different frames)."
    f = docs_preview.scene_frame
    assert f(scene(2, [0, 0, 1], [0, 0, 1], [2, 0, 0])).tolist() == [0, 0, 1]
    assert f(scene(2, [0, 0, 0], [0, 0, 0], [2, 0, 0])).tolist() == [0, 0, 1]  # weights not applied: base = frame 2
    assert f(scene(0, [0, .25, .75], [0, .25, .75], [1.75, 0, 0])).tolist() == [0, .25, .75]  # mid-play
    off = f(scene(0, [0, 0, 0], [0, 0, 0], [2, 0, 0]))
    assert off == "sphere0.position is [2.0, 0.0, 0.0], the film at t = 0.000 s"
    assert f(scene(2, [0, 0, 1], [0, 0, 1], [2, 0, 0], body=0)).startswith("body0.position is [0.0, 5.0, 0.0]")
    assert "wireframe" in f(scene(0, [0, 0, 1], [1, 0, 0], [2, 0, 0]))
    assert "sum to 2" in f(scene(0, [0, 1, 1], [0, 1, 1], [2, 0, 0]))


def test_clock_problem_tells_a_label_or_slider_off_the_picture():
    "Failure mode: a label or slider that disagrees with the drawn frame (the bag page's 't = 10.5 s' while playing),"
    " or a view without a time label."
    w = np.array([0, .5, .5])                                                      # the picture at t = 0.75 s
    c = docs_preview.clock_problem
    assert c(scene(0, w, w, [1.5, 0, 0], label="frame 9 of 0–20, t = 0.75 s"), w) is None
    assert c(scene(0, w, w, [1.5, 0, 0], label="t = 0.5 s"), w) is None          # the label of a frame it blends
    assert c(scene(0, w, w, [1.5, 0, 0], label="", readouts=["0.8"]), w) is None
    assert c(scene(0, w, w, [1.5, 0, 0], label="t = 0.2 s"), w) == "it says t = 0.2 s and shows t = 0.750 s"
    assert c(scene(0, w, w, [1.5, 0, 0], readouts=["0.1"]), w) == "it says t = 0.1 s and shows t = 0.750 s"
    assert c(scene(0, w, w, [1.5, 0, 0], label="0.00–1.00 s simulated"), w) == "no time label"


def projection(fill, pts):
    "A model-view-projection (three.js's column-major `elements`) that shows the box of `pts` as `fill` of the canvas."
    lo, hi = pts.min(0), pts.max(0)
    m = np.eye(4)
    m[[0, 1], [0, 1]] = scale = 2 * np.sqrt(fill) / (hi - lo)[:2]
    m[:2, 3] = -scale * (lo + hi)[:2] / 2
    return m.T.ravel().tolist()


class FakeView:
    "What check_view asks of a page, scripted: the scene after each of load, play, pause, stop, play (`frames`), and"
    " the frame its canvas shows then (`drawn`, default: the same); at step `lie` its time label (or with `slider`, the"
    " slider's readout) says t = 9 s."
    def __init__(self, frames, fills=(0.5, 0.5, 0.5), drawn=None, lie=None, slider=False):
        self.frames, self.fills, self.clicks = list(frames), list(fills), 0
        self.drawn, self.lie, self.slider = list(frames if drawn is None else drawn), lie, slider

    def __call__(self, expr, *args):
        if expr.startswith("!!rec"): return True
        if expr.startswith("projections"): return [projection(f, T3[k]) for k, f in enumerate(self.fills)]
        if expr.endswith(".click()"): self.clicks += 1
        if expr.startswith("scene"):
            w, said = np.eye(3)[self.frames[self.clicks]], [9.0] * (self.clicks == self.lie)
            label = f"t = {w @ [0, .5, 1]} s" + "".join(f"\nt = {t} s" for t in said if not self.slider)
            return scene(0, w, w, S3[self.frames[self.clicks]].tolist(), label=label, readouts=said * self.slider)
        return self

    @property
    def screenshot_as_png(self): return png(np.full((2, 2, 3), 100 * self.drawn[self.clicks]))


@pytest.mark.parametrize("frames, fills, drawn, expect", [
    ([2, 1, 1, 2, 0], (0.5, 0.5, 0.5), None, None),
    ([2, 1, 1, 0, 1], (0.5, 0.5, 0.5), None, "v.html: view 0: after stop another frame than on load"),
    ([2, 1, 1, 2, 0], (0.5, 0.5, 0.5), [2, 1, 1, 1, 0], "v.html: view 0: after stop the canvas is not redrawn"),
    ([2, 1, 1, 2, 2], (0.5, 0.5, 0.5), None, "v.html: view 0: play does nothing after stop"),
    ([2, 1, 1, 2, 0], (0.5, 0.1, 0.5), None, "v.html: view 0: the film covers 10.0% of the canvas at kept frame 1"),
])
def test_check_view_follows_the_clip_through_its_buttons(tmp_path, monkeypatch, frames, fills, drawn, expect):
    "Failure modes: a view that shows another frame after stop than on load, a canvas not redrawn after stop (it keeps"
    " the paused frame while the label and the objects are back at the frame of load), a play button that does nothing"
    " after stop, and a film that covers less than 15 % of the canvas at a kept frame (its projected box, from the"
    " page)."
    monkeypatch.setattr(docs_preview.time, "sleep", lambda seconds: None)  # nothing plays: no waiting for the clip
    problems = docs_preview.check_view(FakeView(frames, fills, drawn), "v.html", 0, tmp_path)
    assert problems == ([] if expect is None else [problems[0]]) and (expect is None or problems[0].startswith(expect))


@pytest.mark.parametrize("step, when", [(0, "load"), (1, "playing"), (2, "paused"), (3, "end")])
@pytest.mark.parametrize("slider", [False, True])
def test_check_view_finds_a_label_or_slider_off_the_picture(tmp_path, monkeypatch, step, when, slider):
    "Failure mode: a time label, or a slider readout, that disagrees with the drawn frame on load, while playing,"
    " paused or after stop."
    monkeypatch.setattr(docs_preview.time, "sleep", lambda seconds: None)
    frames = [2, 1, 1, 2, 0]
    problems = docs_preview.check_view(FakeView(frames, lie=step, slider=slider), "v.html", 0, tmp_path)
    shown = [0, .5, 1][frames[step]]
    assert problems == [f"v.html: view 0 {when}: it says t = 9 s and shows t = {shown:.3f} s"], problems


def test_trajectory_view_keeps_one_frame_for_every_object():
    "With a kernel: on load and after the slider moves, the film, the spheres, the content's placement (the camera that"
    " follows), the slider and the label show one frame; the clip runs on the frames' simulated times."
    from newtonipc_nb.viewer import close_widgets, trajectory_view, waving_sheet
    wf, wF, wball = waving_sheet(T=90)
    times = 0.02 * np.arange(90) + 1.0
    tv = trajectory_view(wf, wF, spheres=wball, radii=[0.05], times=times, speed=0.5, max_frames=40)
    try:
        content = tv.renderer.scene.children[0]
        film, ball = content.children[0], content.children[2]
        tracks = {t.name: np.asarray(t.values) for t in tv.action.clip.tracks}
        def check(k):
            f = tv.kept[k]
            assert film.morphTargetInfluences == [float(j == k) for j in range(40)] and tv.shown == k == tv.play.value
            np.testing.assert_allclose(ball.position, wball[f, 0], rtol=1e-6)
            np.testing.assert_allclose(content.scale, tracks["content.scale"].reshape(-1, 3)[k], rtol=1e-6)
            np.testing.assert_allclose(content.position, tracks["content.position"].reshape(-1, 3)[k], atol=1e-7)
            assert tv.slider.value == f
            assert [label.position[2] < 0 for label in tv.labels] == [j == k for j in range(40)]  # time label
            assert f"frame {f} of 0–89, t = {times[f]:.3f} s" in tv.children[2].children[3].value
        check(39)
        np.testing.assert_allclose(film.geometry.attributes["position"].array, wf[-1], atol=1e-6)  # base: on-load frame
        tv.slider.value = 50
        check(int(np.argmin(abs(tv.kept - 50))))                      # snapped to the nearest kept frame
        tv.play.value = 5
        check(5)
        assert tv.action.timeScale == 0.5 and tv.action.paused and tv.action.clip.duration == pytest.approx(times[-1])
        assert "1.00–2.78 s simulated (40 of 90 frames), played at 0.5× real time" in tv.children[1].children[1].value
        assert "needs-kernel" in tv.children[2]._dom_classes                      # hidden on the docs site
    finally:
        close_widgets(tv)


def test_styles_hide_kernel_controls_and_wrap_code():
    css = (ROOT / "nbs" / "styles.css").read_text()
    assert re.search(r"\.needs-kernel\s*\{\s*display:\s*none", css) and "pre-wrap" in css


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass


def serve_and_check(out: Path, pages) -> list:
    "Serve `out` on a free local port and open `pages` in Chromium; the problems found."
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try: return docs_preview.check_pages(f"http://127.0.0.1:{srv.server_address[1]}/", pages, out / "_check")
    finally: srv.shutdown()


@browser
def test_browser_check_finds_console_errors_and_a_small_subject(tmp_path, monkeypatch):
    "Failure modes: a console error, and a trajectory view whose film covers under 15 % of the canvas at a frame: an"
    " overview of a sheet that slides away, beside the same run with the camera following it (which passes)."
    out = fake_notebooks(tmp_path, monkeypatch, {"views": [
        "import numpy as np\nfrom newtonipc_nb.viewer import trajectory_view, waving_sheet\n"
        "f, F, b = waving_sheet(n=6, T=20)\nslide = f + np.linspace(0, 4, 20)[:, None, None] * np.array([1.0, 0, 0])",
        "trajectory_view(slide, F, fps=10)", "trajectory_view(slide, F, fps=10, follow=None)",
        "from IPython.display import Javascript\nJavascript(\"console.error('a made-up error')\")"]})
    assert docs_preview.build(out)["failed"] == {}
    problems = serve_and_check(out, ["views.html"])
    assert any("console error" in p and "a made-up error" in p for p in problems), problems
    small = [p for p in problems if "covers" in p]
    assert len(small) == 1 and small[0].startswith("views.html: view 1: the film covers"), problems
    assert len(problems) == 2, problems


@browser
def test_browser_check_shoots_whole_canvases_and_finds_a_blank_one(tmp_path, monkeypatch):
    "Failure mode: a blank canvas (a renderer of an empty scene), on a page whose first canvas, drawn, is cut by the"
    " viewport's bottom edge on load (its top about 610 px down an 857 px viewport, as reference_scenes' first): that"
    " one is shot whole (640 × 480) and passes."
    from PIL import Image
    out = fake_notebooks(tmp_path, monkeypatch, {"canvases": [
        "from IPython.display import HTML\nHTML('<div style=\"height: 330px\"></div>')",
        "from newtonipc_nb.viewer import grid_mesh, mesh_view\nmesh_view(*grid_mesh(4, 4))",
        "import pythreejs as p3\np3.Renderer(camera=p3.PerspectiveCamera(), scene=p3.Scene(background='#f7f7f7'))"]})
    assert docs_preview.build(out)["failed"] == {}
    problems = serve_and_check(out, ["canvases.html"])
    assert problems == ["canvases.html: canvas 1 is blank (0.0, 1)"], problems
    assert Image.open(out / "_check" / "canvases.html.canvas0.png").size == (640, 480)


@browser
def test_preview_pages_in_headless_chromium():
    "Build the preview (the changed pages; stored results only) and check every page, by its files and in Chromium."
    assert shutil.which("chromium") and shutil.which("chromedriver"), "apt-get install -y chromium chromium-driver"
    report = docs_preview.build()
    problems = docs_preview.check_site(docs_preview.OUT, report)
    problems += serve_and_check(docs_preview.OUT, [p for p in report["pages"] if (docs_preview.OUT / p).exists()])
    assert not problems, "\n".join(problems)
    assert list((docs_preview.OUT / "_check").glob("bag_scenario.html.view*.playing.png"))


def documented_names(nb: Path):
    "The names nbdev gives show_doc entries (top-level defs and classes of exported cells), split into (python, warp):"
    " nbdev's show_doc skips Warp's @wp.func objects (any type named 'Function'): their notebooks document them"
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
    is_warp = lambda n: (type(getattr(mod, n, None)).__name__ == "Function"
                         and type(getattr(mod, n)).__module__.startswith("warp"))
    return [n for n in names if not is_warp(n)], [n for n in names if is_warp(n)]


def test_warp_functions_get_api_docs():
    """nbdev's show_doc renders nothing for a Warp @wp.func object, so every public Warp function of an exported
    notebook has an explicit `show_doc(f.func, name="f")` cell, which renders its name, Warp-typed signature and
    docstring."""
    from nbdev.showdoc import show_doc
    from newtonipc_nb import barrier as mod
    covered = set()
    for nb in docs_preview.notebooks():
        _, warp_funcs = documented_names(nb)
        cells = json.loads(nb.read_text())["cells"]
        code = [re.sub(r"\s+", "", "".join(c["source"])) for c in cells if c["cell_type"] == "code"]
        missing = [n for n in warp_funcs if f'show_doc({n}.func,name="{n}")' not in code]
        assert not missing, f"{nb.name}: no show_doc cell for the Warp functions {missing}"
        covered |= set(warp_funcs)
    want = {"point_triangle_weights", "edge_edge_weights", "candidate_weights", "barrier", "barrier_d1", "barrier_d2"}
    assert want <= covered
    assert show_doc(mod.barrier) is None                     # what nbdev does with the Warp object itself: nothing
    md = show_doc(mod.barrier.func, name="barrier")._repr_markdown_()
    assert "### barrier\n" in md and "g:wp.float64, dhat:wp.float64, k:wp.float64" in md and ")->wp.float64" in md
    assert mod.barrier.func.__doc__ and mod.barrier.func.__doc__ in md
    from newtonipc_nb.distances import point_triangle_weights
    md = show_doc(point_triangle_weights.func, name="point_triangle_weights")._repr_markdown_()
    assert "### point_triangle_weights" in md and "p:wp.vec3d" in md and ")->wp.vec4d" in md


def test_page_subtitles_are_plain_text():
    "A page's subtitle (the `>` line under its title) is rendered as plain text: backticks would show literally."
    import nbformat
    bad = {}
    for p in docs_preview.notebooks():
        first = nbformat.read(p, as_version=4).cells[0].source
        subs = [l for l in first.splitlines() if l.startswith(">")]
        if subs and "`" in subs[0]: bad[p.name] = subs[0]
    assert not bad, bad
