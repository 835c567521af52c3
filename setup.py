"""Package list derived from the tree, so a new subpackage can never be left out of a wheel.

The repository folders map onto the ``localchat`` namespace (``app/`` -> ``localchat.app``,
...); every folder below them with an ``__init__.py`` is a subpackage. Everything else about
the project (metadata, dependencies, package data) lives in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

ROOTS = {"app": "localchat.app", "engine": "localchat.engine", "kernels": "localchat.kernels",
         "themes": "localchat.themes"}

package_dir = {}
packages = []
for folder, name in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(where=folder)]

setup(packages=packages, package_dir=package_dir)
