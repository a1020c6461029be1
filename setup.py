"""Packaging steps pyproject.toml cannot express: the C runtime compiled at install, and package data.

`pip install .` (or building a wheel) compiles runtime_c/ with its own build.sh into
tlmpack/runtime/libtlmrt.so, for the platform it installs on; an editable install compiles it in
place. templates/ and runtime_c/ (the sources every artifact carries) are mapped into the package
as tlmpack/_data/, so an installed tlmpack builds artifacts without a checkout.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
RUNTIME_EXT = "tlmpack.runtime.libtlmrt"


try:  # setuptools >= 70.1; older ones take their bdist_wheel from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: the C runtime is loaded by ctypes, so one wheel serves every Python 3."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


class BuildRuntime(build_ext):
    """Builds the C runtime with runtime_c/build.sh (one compiler line, the flags every artifact uses)."""

    def get_ext_filename(self, fullname: str) -> str:
        if fullname == RUNTIME_EXT:
            return str(Path("tlmpack", "runtime", "libtlmrt.so"))  # loaded by ctypes: no Python tag
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        if ext.name != RUNTIME_EXT:
            super().build_extension(ext)
            return
        out = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(["bash", str(HERE / "runtime_c" / "build.sh"), str(out)], check=True, cwd=HERE)


setup(
    packages=[*find_packages(include=["tlmpack", "tlmpack.*"]), "tlmpack._data.templates", "tlmpack._data.runtime_c"],
    package_dir={"tlmpack._data.templates": "templates", "tlmpack._data.runtime_c": "runtime_c"},
    package_data={"tlmpack._data.templates": ["*.j2"], "tlmpack._data.runtime_c": ["*.c", "*.h", "*.sh"],
                  "tlmpack.tlm": ["weights/*.safetensors"]},
    ext_modules=[Extension(RUNTIME_EXT, sources=sorted(str(p.relative_to(HERE)) for p in (HERE / "runtime_c").glob("*.c")))],
    cmdclass={"build_ext": BuildRuntime, "bdist_wheel": PlatformWheel},
)
