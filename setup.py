"""setuptools' entry point: everything but the compiled modules is in
pyproject.toml; build_support/oncelog_build.py says what is compiled, when,
and where the artefacts go."""

from __future__ import annotations

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_support"))
from oncelog_build import setup_options  # noqa: E402 - found through the line above

setup(**setup_options())
