#!/usr/bin/env bash
# One device run: `nest bench device` on CUDA (both embedded LMs, float16 and bfloat16), bounded
# to 8 minutes, then its table. Needs the repository's .venv carried over with a CUDA build of
# torch (the machine has no internet: nothing is installed here). Results in $OUT/device-bench.
set -u
cd "$(dirname "$0")/.."
out="${OUT:-runs}/device-bench"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # fail fast instead of waiting on a hub that cannot answer
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# python -m rather than .venv/bin/nest: the entry point's shebang holds the absolute path the venv was made at.
timeout 480 .venv/bin/python -m nest_integrations.cli bench device --device cuda --out "$out"
status=$?
[ "$status" -eq 124 ] && echo "nest bench device passed its 480 s bound; the rows it finished:"
cat "$out/device_bench.md" 2>/dev/null || echo "no table written to $out"
exit "$status"
