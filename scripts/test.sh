#!/usr/bin/env bash
# Set up from scratch (virtual environment, package, test extras, Chromium for the browser
# test) and run the whole test suite. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[test]"
# optional cross-check against libCacheSim (GPL; not every platform has a wheel)
python -m pip install -q libcachesim || echo "libcachesim unavailable here: the cross-check test will say it was skipped"
bash scripts/ci_browser_setup.sh python
python -m pytest "$@"
