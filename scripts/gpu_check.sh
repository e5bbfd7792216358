#!/usr/bin/env bash
# The GPU lane and the GPU benches in one run (about 5-10 minutes on one GPU): an environment that keeps the
# machine's CUDA torch, `pytest -m gpu`, then bench/gpu.py and bench/host_pipeline.py. Logs and figures go to $OUT
# (default runs/gpu_check/).
#
#   scripts/gpu_check.sh                          # PYTHON: an interpreter whose torch sees the GPU (default python3)
#   UPSTREAM=/path/to/KERMT scripts/gpu_check.sh  # also measure upstream's model in the bench
#
# Why not scripts/bootstrap.sh: it pins the CPU torch wheel, which would replace a CUDA build. Here a venv in
# $GPU_VENV sees the interpreter's own site-packages (so its torch, whatever CUDA build it is) and pip installs only
# what is missing; torch>=2.6 is already satisfied, so pip keeps it (checked below). On a machine without network,
# put wheels of the missing packages in .whl/ and they are installed from there without an index: the library
# needs rdkit==2025.9.1 (+ descriptastorus, pandas-flavor), the Ray tests also pydantic (+ pydantic-core,
# annotated-types, typing-inspection), ray==2.60.0 and optuna; without ray or pydantic they skip and say so.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
GPU_VENV=${GPU_VENV:-/tmp/kermt-gpu-venv}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1

"$PYTHON" - <<'EOF' || { echo "gpu_check: $PYTHON's torch sees no CUDA device: install a CUDA build of torch first"; exit 3; }
import sys, torch
print(f"machine torch {torch.__version__} (CUDA {torch.version.cuda}), cuda available: {torch.cuda.is_available()}")
sys.exit(0 if torch.cuda.is_available() else 1)
EOF

# 1. the environment: a venv over the interpreter's site-packages (a .pth file also covers an interpreter that is
#    itself a venv, whose packages --system-site-packages would not see)
if [ ! -x "$GPU_VENV/bin/python" ]; then
  "$PYTHON" -m venv "$GPU_VENV"
  "$PYTHON" -c "import site; print('\n'.join(site.getsitepackages()))" \
    > "$("$GPU_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine_site.pth"
fi
PY="$GPU_VENV/bin/python"
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps .whl/*.whl || echo "gpu_check: some wheels in .whl/ did not install"
fi
"$PY" -m pip install -q --no-build-isolation --retries 0 --timeout 10 -e ".[test]" \
  || "$PY" -m pip install -q --no-build-isolation --no-index --no-deps -e . \
  || echo "gpu_check: could not install the project; running from the checkout (PYTHONPATH)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'EOF' || { echo "gpu_check: pip replaced the CUDA torch with a CPU build; reinstall the CUDA one"; exit 3; }
import importlib.util, sys, torch
print(f"venv torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(0)}")
missing = [m for m in ("rdkit", "descriptastorus", "pydantic", "ray") if importlib.util.find_spec(m) is None]
print("missing packages (their tests skip):", ", ".join(missing) or "none")
sys.exit(0 if torch.cuda.is_available() else 1)
EOF

# 2. the GPU lane (-rA: the tests print the distances they measured)
PYTHONUNBUFFERED=1 "$PY" -m pytest -m gpu -p no:cacheprovider -rA tests/gpu --junitxml="$OUT/gpu_lane.xml"
lane=$?

# 3. the bench (release size; ours and, with $UPSTREAM, upstream's on the same GPU)
bench_args=(--device cuda --json "$OUT/bench_gpu.json")
if [ -n "${UPSTREAM:-}" ]; then bench_args+=(--upstream "$UPSTREAM"); fi
PYTHONUNBUFFERED=1 "$PY" bench/gpu.py "${bench_args[@]}"
bench=$?

# 4. what feeding the device ahead is worth there (pretraining and screening, batches built inline vs prefetched)
PYTHONUNBUFFERED=1 "$PY" bench/host_pipeline.py --device cuda --hidden 800 --threads 4
pipeline=$?

echo "gpu_check: lane exit $lane, bench exit $bench, host pipeline exit $pipeline; logs in $OUT"
[ "$lane" -eq 0 ] && [ "$bench" -eq 0 ] && [ "$pipeline" -eq 0 ]
