"""MkDocs hook: publish the committed benchmark plots (``benchmarks/results/*.png``) under ``results/``.

The plots stay where ``polydist bench --plot`` wrote them; the site serves
them without a second copy in ``docs/``.
"""

from __future__ import annotations

import glob
import os

from mkdocs.structure.files import File

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results")


def on_files(files, config):
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.png"))):
        files.append(File.generated(config, f"results/{os.path.basename(path)}", abs_src_path=path))
    return files
