#!/usr/bin/env bash
# Every CUDA path of starvecheck in one run, for a lent GPU machine (issue 14).
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh [--suite]
#
# Runs from the repository root with the machine's own CUDA torch: starvecheck comes
# from src/ on PYTHONPATH (nothing is pip-installed over the image's torch). Wheels in
# .whl/ (mosaicml-streaming and the compressors it imports, typer 0.28) are unpacked
# into /tmp/site first when present. Writes log.txt and one JSON per command to $OUT;
# every step has its own time limit so the whole run ends inside ten minutes.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: >"$LOG"
export PYTHONUNBUFFERED=1 NO_COLOR=1 COLUMNS=110
say() { printf '\n===== %s (%s)\n' "$*" "$(date +%T)" | tee -a "$LOG"; }
step() {  # step SECONDS CMD...: run it, log stdout+stderr, note the exit code
    local limit=$1
    shift
    say "$*"
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "[exit ${PIPESTATUS[0]}]" | tee -a "$LOG"
}

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || echo "wheel install failed" | tee -a "$LOG"
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec python3 -m starvecheck "$@"\n' >/tmp/bin/starvecheck
chmod +x /tmp/bin/starvecheck
export PATH=/tmp/bin:$PATH
DATA=$(mktemp -d /tmp/starvecheck-data.XXXXXX)

say "machine"
{
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv
    nvidia-smi topo -m
    python3 -c "import sys, torch, typer, rich; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'typer', typer.__version__, 'rich', rich.__version__ if hasattr(rich, '__version__') else '?')"
    nproc
    free -g
} 2>&1 | tee -a "$LOG"

step 60 starvecheck --version
step 60 starvecheck env
step 60 starvecheck env --json "$OUT/env.json"
step 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests
step 200 starvecheck pcie --json "$OUT/pcie.json" --markdown "$OUT/pcie.md"
step 60 starvecheck pcie --quick
step 200 starvecheck profile --quick --json "$OUT/profile.json" "$DATA"
step 60 python3 examples/watch_loop.py --sync
step 60 python3 examples/watch_loop.py --sync --workers 4
step 300 starvecheck doctor --quick --json "$OUT/doctor.json" "$DATA"
if [[ "${1:-}" == "--suite" ]]; then
    step 300 python3 -m pytest -q -x -p no:cacheprovider -n 8 tests
fi
rm -rf "$DATA"
say "done"
