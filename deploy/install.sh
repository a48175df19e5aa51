#!/bin/sh
# Install microbatch from a source tree, with the extras the served model needs.
# The Dockerfile runs this script; tests/ops/test_deploy.py runs it too, into a
# fresh virtual environment, so the image's install step is exercised in CI.
#
#   deploy/install.sh [SOURCE_DIR]          (default: the current directory)
#
# Environment:
#   PYTHON               the interpreter whose environment gets it (default: python3)
#   MICROBATCH_EXTRAS    extras to install, e.g. "examples" or "numpy,pydantic"
#   TORCH_INDEX_URL      an extra package index for torch (CPU or CUDA wheels)
#   PIP_INSTALL_OPTIONS  more pip options (the test passes --no-index --no-deps)
set -eu

source_dir="${1:-.}"
python="${PYTHON:-python3}"
requirement="$source_dir"
if [ -n "${MICROBATCH_EXTRAS:-}" ]; then
    requirement="$source_dir[$MICROBATCH_EXTRAS]"
fi

# shellcheck disable=SC2086  # PIP_INSTALL_OPTIONS is a list of words
"$python" -m pip install --no-cache-dir ${PIP_INSTALL_OPTIONS:-} \
    ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "$requirement"

# The command the image's entrypoint runs must be there.
"$python" -m microbatch --version
