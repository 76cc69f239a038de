#!/usr/bin/env bash
# Random faults against multi-process training runs for a set time, then a summary
# (scripts/chaos.py says what it does and checks). Not a test: it prints figures.
#   bash scripts/chaos.sh [--minutes 60] [--dir /tmp/sana-chaos] [--seed N] [--steps 600] [--no-nodes]
#   bash scripts/chaos.sh --summary-of DIR/results.json
# Needs the built sana-train (scripts/build.sh); as root its work_dir is a tmpfs of its
# own, for the full-disk and read-only faults.
. "$(dirname "$0")/python_env.sh"
exec "$SANA_PYTHON" "$(dirname "$0")/chaos.py" "$@"
