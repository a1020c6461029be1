"""Where the non-Python parts of tlmpack live (templates/, runtime_c/).

In a checkout (or an editable install) they are the repository's top-level folders; in an installed
package (pip install ., a wheel) they are package data under tlmpack/_data/, copied there by the
package-dir mapping in setup.py. Nothing here looks outside the package once it is installed.
"""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent
IN_CHECKOUT = (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "runtime_c" / "tlmrt.h").is_file()

REPO_ROOT = _CHECKOUT  # the checkout's root; meaningful only when IN_CHECKOUT (data/, the records)
_DATA = _CHECKOUT if IN_CHECKOUT else _PACKAGE / "_data"
TEMPLATES_DIR = _DATA / "templates"
RUNTIME_C_DIR = _DATA / "runtime_c"
