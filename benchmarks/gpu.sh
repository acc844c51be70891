#!/usr/bin/env bash
# The GPU checks in one call, for a lent GPU machine (run from the repository root; results under $OUT):
# both engines and `auto`'s choice on the two paper-scale presets of benchmarks/engine.py, then a preflight sample
# (every engine and model family) on CUDA. A machine without this project's environment but with PyTorch gets
# the missing pure-Python packages from .whl/ (jsonschema and its needs), where present.
set -uo pipefail
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
for preset in feddisco-cifar10 feddle-cnn; do
  timeout 150 python3 benchmarks/engine.py --preset "$preset" --device cuda --repeats 3 2>&1 | tee "$OUT/engine-$preset.txt"
done
timeout "${PREFLIGHT_SECONDS:-240}" python3 -m fedrepro.preflight --sample 12 --device cuda --jobs 4 \
  --out "$OUT/preflight-cuda.md" > "$OUT/preflight.log" 2>&1
echo "preflight rc=$?"; tail -40 "$OUT/preflight.log"
