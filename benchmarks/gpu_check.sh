#!/usr/bin/env bash
# The GPU check on a machine where kindling is not installed and nothing can be downloaded:
# the wheels `python benchmarks/gpu_wheels.py` put in .whl/ go beside the machine's own packages,
# kindling runs from src/, then every step of benchmarks/gpu_check.py (arguments passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  site=${TMPDIR:-/tmp}/kindling-wheels
  "$python" -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src:$PYTHONPATH"
exec "$python" benchmarks/gpu_check.py "$@"
