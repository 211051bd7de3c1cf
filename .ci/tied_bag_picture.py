"""Write nbs/images/tied_bag.png, the index page's picture: the bag page's 3D view of the tied bag at 10.50 s (the
acceptance run's last frame), drawn by three.js in headless Chromium from the built docs preview.

python .ci/tied_bag_picture.py        # builds the bag page if needed (python .ci/docs_preview.py --only bag_scenario)

"""
import functools, http.server, importlib.util, sys, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
spec = importlib.util.spec_from_file_location("docs_preview", ROOT / ".ci" / "docs_preview.py")
docs_preview = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs_preview)
from test_docs import Browser  # the browser check's DevTools driver

CAPTION = "tied, with its seven spheres"          # the paragraph above the view on the bag page


def main() -> int:
    out = docs_preview.OUT
    report = docs_preview.build(out, only=["bag_scenario"], quiet=True, run_flags=[])
    if report.get("failed"): sys.exit(f"the bag page failed to build: {report['failed']}")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args): pass
    handler = functools.partial(Quiet, directory=str(out))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    b = Browser()
    try:
        b.goto(f"http://127.0.0.1:{srv.server_port}/bag_scenario.html")
        find = ("(() => {const p = [...document.querySelectorAll('p')].find(e => e.textContent.includes(%r));"
                " if (!p) return null; const c = [...document.querySelectorAll('canvas')].find(c => "
                "p.compareDocumentPosition(c) & 4);"
                " if (!c) return null; c.scrollIntoView(); const r = c.getBoundingClientRect();"
                " return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height};})()"
                ) % CAPTION
        for _ in range(100):                      # the widget manager draws the canvases after load
            rect = b.js(find)
            if rect and rect["width"] > 0: break
            time.sleep(0.3)
        else: sys.exit(f"no 3D view after the paragraph {CAPTION!r} on bag_scenario.html")
        time.sleep(2.0)
        png = b.screenshot(clip=rect)
    finally:
        b.close()
        srv.shutdown()
    dst = ROOT / "nbs" / "images" / "tied_bag.png"
    dst.parent.mkdir(exist_ok=True)
    dst.write_bytes(png)
    print(f"wrote {dst.relative_to(ROOT)} ({len(png):,} bytes, {rect['width']:.0f} × {rect['height']:.0f} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
