#!/usr/bin/env bash
# Every CUDA path of starvecheck in one run, for a lent GPU machine (issue 14).
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh [--suite]
#
# Runs from the repository root with the machine's own CUDA torch: starvecheck comes
# from src/ on PYTHONPATH (nothing is pip-installed over the image's torch). Wheels in
# .whl/ (typer 0.28, msgspec, py-spy: what the image lacks) are unpacked into /tmp/site
# first when present. Writes log.txt and work.tgz (every step's JSON, benchmarks/gpu_loop.py's
# files) to $OUT; each step has its own time limit, and all of them GPU_CHECK_BUDGET s (480).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
LOG=$OUT/log.txt
WORK=$(mktemp -d /tmp/starvecheck-gpu.XXXXXX)  # every step's files; packed into $OUT/work.tgz
: >"$LOG"
export PYTHONUNBUFFERED=1 NO_COLOR=1 COLUMNS=110
BUDGET=${GPU_CHECK_BUDGET:-480}  # seconds for all steps: a lent machine's minutes are few
BEGIN=$SECONDS
say() { printf '\n===== %s (%s)\n' "$*" "$(date +%T)" | tee -a "$LOG"; }
step() {  # step SECONDS CMD...: run it within what is left of BUDGET, log, note the exit
    local limit=$1 left=$((BUDGET - (SECONDS - BEGIN)))
    shift
    if ((left < 20)); then
        say "skipped, out of time: $*"
        return
    fi
    ((limit > left)) && limit=$left
    say "$* (limit ${limit} s)"
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "[exit ${PIPESTATUS[0]}]" | tee -a "$LOG"
}

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || echo "wheel install failed" | tee -a "$LOG"
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH  # py-spy's binary for attach
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec python3 -m starvecheck "$@"\n' >/tmp/bin/starvecheck
chmod +x /tmp/bin/starvecheck
export PATH=/tmp/bin:$PATH
DATA=$(mktemp -d /tmp/starvecheck-data.XXXXXX)
export STARVECHECK_EXAMPLE_DIR=$WORK/images

say "machine"
{
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv
    nvidia-smi topo -m
    python3 -c "import sys, torch, typer; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'typer', typer.__version__)"
    command -v py-spy
    nproc
    free -g
} 2>&1 | tee -a "$LOG"

step 30 starvecheck --version
step 60 starvecheck env --json "$WORK/env.json"
step 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_pcie.py tests/test_doctor.py
step 240 python3 benchmarks/gpu_loop.py "$WORK/loop"
step 60 starvecheck pcie --quick --json "$WORK/pcie-quick.json"
step 120 starvecheck doctor --quick --json "$WORK/doctor.json" "$DATA"
step 150 starvecheck loader --factory examples/jpeg_pipeline.py:imagefolder_uint8 --quick --json "$WORK/loader.json"
step 150 starvecheck pcie --json "$WORK/pcie.json"
step 60 python3 examples/watch_loop.py --sync
if [[ "${1:-}" == "--suite" ]]; then
    step 300 python3 -m pytest -q -x -p no:cacheprovider -n 8 tests
fi
rm -rf "$DATA" "$WORK/images"
tar czf "$OUT/work.tgz" -C "$WORK" . 2>&1 | tee -a "$LOG"
say "done in $((SECONDS - BEGIN)) s"
