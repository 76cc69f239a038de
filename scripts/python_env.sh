# Sourced by the scripts and shell tests: exports SANA_PYTHON, the project's Python (the
# virtual environment scripts/install_deps.sh makes, with pip's torch: the same LibTorch the
# C++ build links, and the packages the tests use as judges). ctest passes the build's own
# (-DSANA_PYTHON); SANA_VENV names another environment.
if [ -z "${SANA_PYTHON:-}" ]; then
  SANA_PYTHON=${SANA_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv}/bin/python
fi
export SANA_PYTHON
