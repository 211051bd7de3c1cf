"""Write README.md from nbs/index.ipynb (nbdev_readme needs Quarto, which this machine cannot install).

`python .ci/readme.py` writes it; `python .ci/readme.py --check` exits 1 if README.md is stale.
"""
import sys
from pathlib import Path

import nbformat
from nbconvert import MarkdownExporter

root = Path(__file__).resolve().parents[1]
nb = nbformat.read(root / "nbs" / "index.ipynb", as_version=4)
nb.cells = [c for c in nb.cells if not c.source.lstrip().startswith("#| hide")]
body, _ = MarkdownExporter(exclude_output=True).from_notebook_node(nb)
text = ("# newtonipc_nb\n\n<!-- generated from nbs/index.ipynb by .ci/readme.py: edit the notebook, not this file "
           "-->\n") + body.split("\n", 1)[1].lstrip("\n")
text = text.replace("](images/", "](nbs/images/").rstrip() + "\n"   # README sits beside nbs/, the index inside it
if "--check" in sys.argv:
    if (root / "README.md").read_text() != text:
        sys.exit("FAIL: README.md is not what nbs/index.ipynb gives; run `python .ci/readme.py` and commit")
else:
    (root / "README.md").write_text(text)
