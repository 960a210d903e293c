"""The packages, and a build step.

Packages: every ``dsim*`` folder, plus the repository's top-level ``device_profiles/`` mapped in as
``dsim.device_profiles`` (package_dir), so a wheel carries it inside the package and an editable
install's import hook points at the checkout's folder; the repository keeps one copy and dsim reads
it with importlib.resources either way.

Build step: the wheel carries the repository's examples (scenarios/, luts/, examples/real/) under
dsim/_examples/, copied at build time so the repository keeps one copy of each file.  Everything
else about the package is in pyproject.toml."""
import shutil
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

# the folders `dsim examples` copies out; the same list as dsim.shipped.SHIPPED (not imported: the
# build must not import the package it builds)
SHIPPED = ("scenarios", "luts", "examples/real")
HERE = Path(__file__).resolve().parent


class build_py_with_examples(build_py):
    def run(self):
        super().run()
        if self.editable_mode:          # an editable install reads them from the checkout
            return
        dest = Path(self.build_lib) / "dsim" / "_examples"
        for rel in SHIPPED:
            src = HERE / rel
            if not src.is_dir():
                raise SystemExit(f"dsim build: {src} is missing (the wheel ships it for `dsim examples`)")
            if (dest / rel).exists():
                shutil.rmtree(dest / rel)
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


# folders at the top of the repository installed as packages inside dsim (their data: pyproject's package-data)
MAPPED = {"dsim.device_profiles": "device_profiles"}

setup(packages=find_namespace_packages(where=str(HERE), include=["dsim", "dsim.*"]) + sorted(MAPPED), package_dir=MAPPED,
      cmdclass={"build_py": build_py_with_examples})
