# The project's Python environment, shared by scripts/test and scripts/bench (sourced, not
# run): a virtual environment (default `.venv` at the repository root, git-ignored;
# FASTENSOR_VENV=DIR picks another; PYTHON=python3.x the interpreter that makes it), made
# on first use and reused after. It holds torch, numpy, safetensors, pytest, ruff, mypy,
# hypothesis and the frameworks the integrations are tested with (lightning, transformers),
# from the package registry: torch for Linux is a CUDA build of about 4 GB that runs on the
# CPU, so the first use takes a few minutes. Then `./fastensor-python` is built (a Rust
# toolchain is needed) and installed into it as `pip install` installs it, so that what
# runs is this checkout.
#
# After `project_venv`, `$py` is the environment's python.

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
    echo "== pip install ./fastensor-python"
    "$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
        ./fastensor-python
}
