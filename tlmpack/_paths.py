"""Where the non-Python parts of tlmpack live (templates/, runtime_c/): next to the package in a checkout."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
RUNTIME_C_DIR = REPO_ROOT / "runtime_c"
