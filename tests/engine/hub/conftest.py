"""The resolver tests' fake snapshot Hub (``fake_snapshots.py``) as a fixture of this folder."""

from .fake_snapshots import fake_hub  # noqa: F401 - the fixture
