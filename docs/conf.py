"""Sphinx configuration of tasklock's documentation site (MyST Markdown, the furo theme).

Build: ``tox -e docs``, or ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
The build is strict (``-W``): a broken link between pages, a reference to a name that does not
exist and a public name without its API entry are errors (see docs/contributing.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE / "_ext"))

# tasklock.django.models and .admin are Django models: they import only in a configured project.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tasklock_docs.django_settings")
import django  # noqa: E402

django.setup()

project = "tasklock"
author = "tasklock developers"
copyright = "tasklock developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "tasklock_docs",  # docs/_ext/tasklock_docs: the CLI reference, the public-API check
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/README.md"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # "[text](page.md#a-heading)" links, checked by the build

html_theme = "furo"
html_title = "tasklock"
# Quotes in the docs are code (option values, error messages): keep them straight.
smartquotes = False
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Celery's own attribute docs use roles of its docs (:setting:) that this site does not have.
autodoc_inherit_docstrings = False
autodoc_default_options: dict[str, object] = {}

# Every cross-reference must resolve ... to tasklock's own names. The site links to no other
# project's inventory (the build runs offline), so names of Python, redis-py, Celery, RQ, Django
# and the typing module in signatures are left as plain text.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!tasklock\b).*")]
