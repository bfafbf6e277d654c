#!/usr/bin/env bash
# GPU checks of fastensor's CUDA backends (`gds`, `cuda-staged`) on a machine with an NVIDIA
# GPU. That machine needs no Rust toolchain: it runs prebuilt release binaries from the
# git-ignored folder gpu-bundle/, made on a build machine with
#
#     scripts/gpu-check.sh bundle
#
# which runs (and you may run by hand):
#
#     cargo build --release -p fastensor-cli --features gds        # target/release/fastensor
#     cargo test  --release -p fastensor-gds --no-run              # tests/conformance.rs etc.
#     cargo build --release -p fastensor-gds --example gds_bench   # file <-> GPU bandwidth
#
# and copies the executables, stripped, into gpu-bundle/, with a safetensors wheel for the
# anchor (for a GPU machine whose Python lacks it; fetched with pip when this machine can)
# and fastensor's own wheel (`pip wheel ./fastensor-python`, abi3) for the offload section.
# Copy the repository (or just scripts/ and gpu-bundle/) to the GPU machine and run
#
#     scripts/gpu-check.sh [run]          # GPU_BENCH_MIB=256 GPU_BENCH_REPEAT=3 by default
#
# It runs, in order: the GPU inventory (nvidia-smi), `fastensor backends`, the conformance
# suite over GPU memory with FASTENSOR_REQUIRE=gds,cuda-staged (an unavailable backend is a
# failure there), gds_bench (256 MiB reads and writes file <-> GPU through gds,
# cuda-staged, and posix-direct + cuMemcpy as the reference, and the read ceiling
# min(disk, host-to-device copy), each part measured alone), and the anchor:
# safetensors.torch.load_file(device="cuda") of a file that size (scripts/gpu-anchor.py,
# with PyTorch), and the offload section (scripts/gpu-offload.py: a transformer stack's step
# time and largest batch for no offload, checkpointing, save_on_cpu and fastensor offload on
# the staged and the direct path; on the stand-in, the offload store's GPU path round trips,
# logic only). It prints a table of the steps, the conformance results and the bandwidth
# table, and leaves every log in gpu-bundle/results/. Exit status: 0 when every step passed.
#
# Without a GPU the same run goes through the CUDA stand-in (host memory: it checks that
# this script and the bundle work, not GPU speed):
#
#     fastensor-testkit/cuda-stand-in/run scripts/gpu-check.sh run
#
# cuFile: LD_LIBRARY_PATH gets the lib folder of the `nvidia-cufile` Python package
# (pip install nvidia-cufile-cu12) when one is installed, and the CUDA toolkit's lib64;
# FASTENSOR_CUFILE=/path/libcufile.so.0 names the library explicitly. Test files go to
# FASTENSOR_TEST_DIR (default gpu-bundle/tmp: use a local NVMe file system, not tmpfs, or
# O_DIRECT and GDS are refused).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="${GPU_BUNDLE:-$ROOT/gpu-bundle}"

bundle() {
    set -e
    cd "$ROOT"
    cargo build --release -p fastensor-cli --features gds
    cargo build --release -p fastensor-gds --example gds_bench
    local tests
    tests=$(cargo test --release -p fastensor-gds --no-run 2>&1 | tee /dev/stderr |
        sed -n 's/.*Executable .*(\(.*\))$/\1/p')
    mkdir -p "$BUNDLE"
    cp target/release/fastensor "$BUNDLE/fastensor"
    cp target/release/examples/gds_bench "$BUNDLE/gds_bench"
    for t in $tests; do
        local name
        name=$(basename "$t")
        cp "$t" "$BUNDLE/test-${name%-*}"
    done
    if command -v strip >/dev/null; then
        strip "$BUNDLE"/fastensor "$BUNDLE"/gds_bench "$BUNDLE"/test-* || true
    fi
    # The anchor's safetensors, for a GPU machine without it (no network there).
    mkdir -p "$BUNDLE/wheels"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --platform "manylinux2014_$(uname -m)" --dest "$BUNDLE/wheels" safetensors ||
        echo "no safetensors wheel fetched: the anchor needs safetensors on the GPU machine"
    # fastensor's wheel (abi3: any CPython from 3.11), for the offload section.
    rm -f "$BUNDLE"/wheels/fastensor-*.whl
    "${PYTHON:-python3}" -m pip wheel --quiet --no-deps --wheel-dir "$BUNDLE/wheels" ./fastensor-python
    ls -l "$BUNDLE"
    echo "bundle ready: copy scripts/ and gpu-bundle/ to the GPU machine, run scripts/gpu-check.sh"
}

cufile_dirs() {
    # The nvidia-cufile Python package's lib folder, by import or by glob.
    if command -v python3 >/dev/null; then
        python3 - <<'PY' 2>/dev/null
import os
try:
    import nvidia.cufile as m
    for p in list(getattr(m, "__path__", [])) + [os.path.dirname(getattr(m, "__file__", "") or "")]:
        if p and os.path.isdir(os.path.join(p, "lib")):
            print(os.path.join(p, "lib"))
except Exception:
    pass
PY
    fi
    local d
    for d in /usr/local/lib/python3*/*-packages/nvidia/cufile/lib \
        /usr/lib/python3*/*-packages/nvidia/cufile/lib \
        "$HOME"/.local/lib/python3*/site-packages/nvidia/cufile/lib \
        "${VIRTUAL_ENV:-/nonexistent}"/lib/python3*/site-packages/nvidia/cufile/lib \
        "${CONDA_PREFIX:-/nonexistent}"/lib/python3*/site-packages/nvidia/cufile/lib \
        /usr/local/cuda/lib64; do
        [ -d "$d" ] && echo "$d"
    done
}

STEPS=()
step() { # step NAME COMMAND...: runs, logs, records PASS/FAIL and seconds
    local name="$1"
    shift
    local log="$BUNDLE/results/$name.log" start end rc
    start=$(date +%s.%N)
    echo "=== $name: $*" | tee "$log"
    "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    end=$(date +%s.%N)
    STEPS+=("$(printf '%-20s %-9s %8.1f  %s' "$name" "$([ "$rc" = 0 ] && echo PASS || echo "FAIL($rc)")" "$(awk "BEGIN{print $end - $start}")" "$log")")
    return "$rc"
}

run() {
    [ -x "$BUNDLE/fastensor" ] || {
        echo "no $BUNDLE/fastensor: build the bundle first (scripts/gpu-check.sh bundle)" >&2
        exit 2
    }
    local extra
    extra=$(cufile_dirs | awk '!seen[$0]++' | paste -sd: -)
    export LD_LIBRARY_PATH="${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export FASTENSOR_TEST_DIR="${FASTENSOR_TEST_DIR:-$BUNDLE/tmp}"
    mkdir -p "$FASTENSOR_TEST_DIR" "$BUNDLE/results"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "FASTENSOR_TEST_DIR=$FASTENSOR_TEST_DIR ($(stat -f -c %T "$FASTENSOR_TEST_DIR" 2>/dev/null))"
    echo "FASTENSOR_CUFILE=${FASTENSOR_CUFILE:-<unset>}"
    local failed=0
    if command -v nvidia-smi >/dev/null; then
        step gpus nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || failed=1
    fi
    [ -r /proc/driver/nvidia-fs/version ] && echo "nvidia-fs: $(cat /proc/driver/nvidia-fs/version)"
    step backends "$BUNDLE/fastensor" backends || failed=1
    local t
    for t in "$BUNDLE"/test-*; do
        FASTENSOR_REQUIRE=gds,cuda-staged step "$(basename "$t")" "$t" --test-threads=1 --nocapture || failed=1
    done
    step gds_bench "$BUNDLE/gds_bench" "$FASTENSOR_TEST_DIR" "${GPU_BENCH_MIB:-256}" "${GPU_BENCH_REPEAT:-3}" || failed=1
    # The anchor: safetensors' own load to the GPU, against the same ceiling. A bundled wheel
    # stands in for a missing safetensors.
    local ceiling pypath=""
    ceiling=$(sed -n 's/^ceiling_read_gib_s //p' "$BUNDLE/results/gds_bench.log" | tail -1)
    if ! python3 -c 'import safetensors' 2>/dev/null; then
        local whl
        for whl in "$BUNDLE"/wheels/safetensors-*.whl; do
            [ -e "$whl" ] || continue
            mkdir -p "$BUNDLE/py" && python3 -m zipfile -e "$whl" "$BUNDLE/py" && pypath="$BUNDLE/py"
        done
    fi
    PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}" step anchor python3 "$ROOT/scripts/gpu-anchor.py" \
        "$FASTENSOR_TEST_DIR" "${GPU_BENCH_MIB:-256}" "${GPU_BENCH_REPEAT:-3}" "${ceiling:-nan}" || failed=1
    # The offload section, with the bundled fastensor wheel where fastensor is not installed.
    local offpath="$pypath"
    if ! python3 -c 'import fastensor' 2>/dev/null; then
        local fwhl
        for fwhl in "$BUNDLE"/wheels/fastensor-*.whl; do
            [ -e "$fwhl" ] || continue
            python3 -m pip install --quiet --no-deps --target "$BUNDLE/fpy" "$fwhl" &&
                offpath="$BUNDLE/fpy${offpath:+:$offpath}"
        done
    fi
    PYTHONPATH="$offpath${PYTHONPATH:+:$PYTHONPATH}" step offload python3 "$ROOT/scripts/gpu-offload.py" \
        "$FASTENSOR_TEST_DIR" || failed=1
    # Process-group loads over NCCL, one rank per GPU (scripts/gpu-group.py).
    PYTHONPATH="$offpath${PYTHONPATH:+:$PYTHONPATH}" step group python3 "$ROOT/scripts/gpu-group.py" \
        "$FASTENSOR_TEST_DIR" "${GPU_BENCH_MIB:-256}" || failed=1
    echo
    printf '%-20s %-9s %8s  %s\n' step result seconds log
    printf '%s\n' "${STEPS[@]}"
    echo
    grep -h -E "^GPUs: |^gds: |conformance of|SKIPPED|FAILED" "$BUNDLE"/results/*.log 2>/dev/null | awk '!seen[$0]++'
    # gds_bench's tables (from the line naming the size on), then the anchor's row.
    sed -n '/MiB file <-> GPU/,$p' "$BUNDLE/results/gds_bench.log" | grep -v '^ceiling_read_gib_s'
    grep -h 'safetensors load_file' "$BUNDLE/results/anchor.log"
    sed -n '/^offload/,$p' "$BUNDLE/results/offload.log"
    grep -h '^group' "$BUNDLE/results/group.log"
    exit "$failed"
}

case "${1:-run}" in
bundle) bundle ;;
run) run ;;
*)
    echo "usage: scripts/gpu-check.sh [bundle|run]" >&2
    exit 2
    ;;
esac
