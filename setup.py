"""Package discovery for the build: every package under ``evalkit/``, and ``tasks/`` (which sits
beside it at the top of the repository) installed as ``evalkit.tasks``. Found, never listed, so a
new subpackage cannot be left out of the wheel; ``tests/test_packaging.py`` checks the built
wheel against the tree. Everything else about the project is in ``pyproject.toml``."""

from setuptools import find_namespace_packages, setup

# Namespace discovery: a folder of data files (evalkit/data/meta) is a package too, and a new
# subpackage that forgot its __init__.py is still shipped.
CACHES = ["__pycache__", "*.__pycache__"]

TASK_PACKAGES = [
    "evalkit.tasks",
    *(f"evalkit.tasks.{name}" for name in find_namespace_packages("tasks", exclude=CACHES)),
]

setup(
    packages=[
        *find_namespace_packages(include=["evalkit", "evalkit.*"], exclude=CACHES),
        *TASK_PACKAGES,
    ],
    package_dir={"evalkit.tasks": "tasks"},
)
