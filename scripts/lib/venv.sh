# The project's Python environment, shared by scripts/test and scripts/bench (sourced, not
# run): a virtual environment (default `.venv` at the repository root, git-ignored;
# FASTENSOR_VENV=DIR picks another; PYTHON=python3.x the interpreter that makes it), made
# on first use and reused after. It holds torch, numpy, safetensors, pytest, ruff, mypy,
# hypothesis and the frameworks the integrations are tested with (lightning, transformers),
# from the package registry: torch for Linux is a CUDA build of about 4 GB that runs on the
# CPU, so the first use takes a few minutes. Then this checkout's wheel is built
# (scripts/wheel: abi3, manylinux_2_28) and installed into it as a user installs it, with no
# Rust toolchain on PATH, so that what runs is what users get.
#
# After `project_venv`, `$py` is the environment's python, and `$path_without_rust` is PATH
# less every directory that holds cargo or rustc (what the tests of the wheel run with).

project_venv() {
    local venv
    venv=$(realpath -m "${FASTENSOR_VENV:-.venv}")
    echo "== Python environment ($venv)"
    if [ ! -x "$venv/bin/python" ]; then
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    py="$venv/bin/python"
    "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$py" -m pip install --quiet --disable-pip-version-check \
        torch numpy safetensors pytest ruff mypy hypothesis lightning transformers boto3
    scripts/wheel
    path_without_rust=$(without_rust "$PATH")
    echo "== pip install dist/fastensor-*.whl (no cargo or rustc on PATH)"
    PATH="$path_without_rust" "$py" -m pip install --quiet --disable-pip-version-check \
        --force-reinstall --no-deps dist/fastensor-*.whl
}

# $1 (a PATH) less every directory that holds cargo or rustc.
without_rust() {
    local out="" dir
    local IFS=:
    for dir in $1; do
        if [ -n "$dir" ] && [ ! -e "$dir/cargo" ] && [ ! -e "$dir/rustc" ]; then
            out="${out:+$out:}$dir"
        fi
    done
    echo "$out"
}

# Azurite, Azure's blob emulator (from npm; needs Node.js), installed once under
# .test-tools/ (git-ignored; FASTENSOR_AZURITE_DIR=DIR picks another): exports
# FASTENSOR_AZURITE, its azurite-blob, for the az:// tests and benchmark.
azurite() {
    local dir=${FASTENSOR_AZURITE_DIR:-$PWD/.test-tools/azurite}
    if [ ! -x "$dir/node_modules/.bin/azurite-blob" ]; then
        echo "== npm install azurite ($dir)"
        npm install --silent --no-audit --no-fund --prefix "$dir" azurite@3.35
    fi
    export FASTENSOR_AZURITE="$dir/node_modules/.bin/azurite-blob"
}
