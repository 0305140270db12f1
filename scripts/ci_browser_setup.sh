#!/usr/bin/env bash
# Install what tests/test_browser.py needs: Debian's chromium and the playwright Python package.
# Idempotent: does nothing when both are present. Never runs `playwright install` (browser
# downloads are blocked in CI; the test drives /usr/bin/chromium through executable_path).
# Usage: scripts/ci_browser_setup.sh [PYTHON]   (default: python3)
set -euo pipefail
PY="${1:-${PYTHON:-python3}}"
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

if [ -x /usr/bin/chromium ]; then
  echo "ci_browser_setup: chromium present ($(/usr/bin/chromium --version 2>/dev/null | head -1))"
else
  echo "ci_browser_setup: installing chromium (apt)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
  [ -x /usr/bin/chromium ] || { echo "ci_browser_setup: chromium did not install" >&2; exit 1; }
fi

if "$PY" -c "import playwright.sync_api" >/dev/null 2>&1; then
  echo "ci_browser_setup: playwright present ($("$PY" -m pip show playwright 2>/dev/null | sed -n 's/^Version: //p'))"
else
  echo "ci_browser_setup: installing the playwright Python package (pip)"
  "$PY" -m pip install -q "playwright>=1.45"
fi

# The notebooks run on the ipykernel "python3" kernelspec; make sure this interpreter has one.
"$PY" - <<'PYEOF'
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
try:
    KernelSpecManager().get_kernel_spec("python3")
    print("ci_browser_setup: kernelspec python3 present")
except NoSuchKernel:
    from ipykernel.kernelspec import install
    print("ci_browser_setup: installed kernelspec python3 at", install(user=True, kernel_name="python3"))
PYEOF
echo "ci_browser_setup: ok"
