#!/usr/bin/env bash
# Set up the machine (system + Python packages, fast-transformers included) and run the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` for the slow suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --fast
py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
"$py" -m ruff check .            # lint (pyproject.toml [tool.ruff])
"$py" -m ruff format --check .   # and the one code format
exec "$py" -m pytest -n 2 -q "$@"
