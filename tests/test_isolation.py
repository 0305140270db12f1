"""The suite runs apart from the user's files: its own store cache, and plain ``pytest`` works."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import ISOLATED, SANDBOX
from workbench.fsutil import cache_dir
from workbench.store.cache import stores_dir

REPO = Path(__file__).resolve().parent.parent


def test_the_store_cache_is_the_sessions_own():
    assert SANDBOX.parent == Path(tempfile.gettempdir())
    assert cache_dir() == ISOLATED["WORKBENCH_CACHE"] and stores_dir().is_relative_to(SANDBOX)
    assert not cache_dir().is_relative_to(Path.home() / ".cache")
    for name, path in ISOLATED.items():
        assert os.environ[name] == str(path)


def test_plain_pytest_imports_this_checkout(tmp_path):
    """The ``pytest`` script (not ``python -m pytest``) puts no folder on sys.path by itself;
    pyproject's ``pythonpath`` makes ``tests.*`` and this checkout's ``workbench`` importable."""
    script = Path(sys.executable).parent / "pytest"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(script), "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_hostile_config.py"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "No module named" not in r.stdout + r.stderr
