"""Checks of the preview .ci/docs_preview.py builds. `check_site` reads the files: failed builds, missing or unreadable
pages, broken links and anchors, Warp's log, cut table cells. `check_pages` opens each page in headless Chromium:
console errors, blank canvases, and for each trajectory view on load, playing, paused, after stop and playing again,
one frame for every object, a time label that names it, and the film at least `SUBJECT` of the canvas at every frame."""
import json, os, re, shutil, time
from io import BytesIO
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
from bs4 import BeautifulSoup

NOISE = re.compile(r"Warp \d[\w.]* initialized|load on device '[^']*' took|CUDA driver not available|Warp CUDA warning")
SUBJECT = 0.15  # the least share of the canvas a trajectory view's film covers (its projected bounding box)
JS = (Path(__file__).parent / "docs_check.js").read_text()

def check_site(out: Path, report=None) -> list:
    "One line per problem of the site built in `out` (`report`: its build.json)."
    report = report or json.loads((out / "build.json").read_text())
    problems, soups = [f"{n}: its build failed: {why}" for n, why in report["failed"].items()], {}
    for n in report["pages"]:
        if not (out / n).is_file(): problems.append(f"{n}: the page is missing")
        elif (mode := (out / n).stat().st_mode & 0o777) & 0o044 != 0o044:
            problems.append(f"{n}: not world-readable (mode {oct(mode)})")
        if (out / n).is_file(): soups[n] = BeautifulSoup((out / n).read_text(), "html.parser")
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

def canvas_coverage(png: bytes):
    "Share of the pixels that differ from the commonest colour (the background), and the number of colours."
    from PIL import Image
    px = np.asarray(Image.open(BytesIO(png)).convert("RGB")).reshape(-1, 3)
    colours, counts = np.unique(px, axis=0, return_counts=True)
    return 1 - counts.max() / counts.sum(), len(colours)

def scene_frame(sc: dict):
    "The weights over the kept frames the drawn film shows, if its wireframe, spheres, bodies and placement agree; else"
    " what disagrees."
    K, w = len(sc["times"]), {}
    T, base = np.reshape(sc["targets"], (K, -1, 3)), np.reshape(sc["base"], (-1, 3))
    for name, wn in sc["weights"].items():
        wn = np.asarray(wn, dtype=float)
        if abs(wn.sum()) < 1e-6:  # weights not yet applied: three.js draws the base positions, which are a kept frame
            wn = np.array([float(np.abs(t - base).max() < 1e-6) for t in T])
        if abs(wn.sum() - 1) > 1e-4: return f"{name}: its morph weights sum to {wn.sum():.4g}"
        w[name] = wn
    if max(np.abs(v - w["film"]).max() for v in w.values()) > 1e-4: return f"the film and its wireframe differ: {w}"
    for name, now in sc["now"].items():
        now, want = np.asarray(now, float), w["film"] @ np.reshape(sc["tracks"][name], (K, 3))
        if np.abs(now - want).max() > 1e-5 * (1 + abs(want).max()):
            return f"{name} is {np.round(now, 4).tolist()}, the film at t = {w['film'] @ sc['times']:.3f} s"
    return w["film"]

def clock_problem(sc: dict, w):
    "What the view's time label (`t = X s`) or slider readout says that the drawn frame (weights `w`) is not: a time"
    " outside the kept frames it blends, or no time label."
    t, shown = w @ np.asarray(sc["times"]), np.asarray(sc["times"])[w > 1e-9]
    said = [*map(float, re.findall(r"t = (-?[\d.]+) s", sc["label"])), *map(float, sc["readouts"])]
    bad = [x for x in said if not shown.min() - 1e-3 <= x <= shown.max() + 1e-3]
    return f"it says t = {bad[0]:g} s and shows t = {t:.3f} s" if bad else None if said else "no time label"

def check_view(js, name: str, k: int, shots: Path) -> list:
    "A trajectory view's problems on load, playing, paused, after stop and playing again; a screenshot of each."
    if not js("!!rec(arguments[0])", k): return [f"{name}: view {k}: its clip never played"]
    problems, seen = [], []
    for when, button in (("load", None), ("playing", 0), ("paused", 1), ("end", 2), ("replay", 0)):
        if button is not None:
            js("views()[arguments[0]].querySelectorAll('.trajectory-play button')[arguments[1]].click()", k, button)
        time.sleep(1.5 if button == 0 else 0.2)
        js("views()[arguments[0]]", k).screenshot(str(shots / f"{name}.view{k}.{when}.png"))
        seen.append(w := scene_frame(sc := js("scene(arguments[0])", k)))
        if why := w if isinstance(w, str) else clock_problem(sc, w): problems.append(f"{name}: view {k} {when}: {why}")
    if not problems and np.abs(seen[0] - seen[3]).max() > 1e-6:
        problems.append(f"{name}: view {k}: after stop another frame than on load")
    if not problems and np.abs(seen[3] - seen[4]).max() < 1e-6:
        problems.append(f"{name}: view {k}: play does nothing after stop")
    if min(fill := js("fills(arguments[0])", k)) < SUBJECT:
        problems.append(f"{name}: view {k}: the film covers {min(fill):.1%} of the canvas at kept frame "
                        f"{int(np.argmin(fill))} (at least {SUBJECT:.0%} wanted)")
    return problems

def check_page(d, url: str, shots: Path) -> list:
    "Open one page; its problems. Screenshots of the page, its canvases and each trajectory view."
    name, js = url.rsplit("/", 1)[1], lambda expr, *a: d.execute_script(f"{JS}\nreturn {expr}", *a)
    errors = lambda: [f"{name}: console error: {e['message']}" for e in d.get_log("browser") if e["level"] == "SEVERE"]
    d.get(url)
    for _ in range(120 if "widget-view+json" in d.page_source else 0):  # the widget manager renders, three.js draws
        if js("canvases().length") and js("views().every((_, k) => rec(k))"): break
        time.sleep(0.5)
    time.sleep(2)
    d.save_screenshot(str(shots / f"{name}.png"))
    problems = errors()
    for i, c in enumerate(js("canvases()")):
        (shots / f"{name}.canvas{i}.png").write_bytes(png := c.screenshot_as_png)
        if (cov := canvas_coverage(png))[0] < 0.01 or cov[1] < 8: problems.append(f"{name}: canvas {i} is blank {cov}")
    return problems + [p for k in range(js("views().length")) for p in check_view(js, name, k, shots)] + errors()

def check_pages(base_url: str, pages: list, shots: Path) -> list:
    "Open every page of a served site in Chromium; one line per problem."
    from selenium import webdriver  # Debian's chromium and chromium-driver; chromedriver makes a fresh profile
    shots.mkdir(parents=True, exist_ok=True)
    o = webdriver.ChromeOptions()
    o.binary_location = shutil.which("chromium")
    for a in ("--headless", "--no-sandbox", "--enable-unsafe-swiftshader", "--window-size=1400,1000"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=o, service=webdriver.ChromeService(shutil.which("chromedriver")))
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": JS})
    try: return [p for n in pages for p in check_page(d, base_url + n, shots)]
    finally: d.quit()
