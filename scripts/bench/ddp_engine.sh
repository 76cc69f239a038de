#!/usr/bin/env bash
# Training-step throughput on 2 local processes (Gloo), sana-train's engine against
# PyTorch's DistributedDataParallel on the same model and batch, and the share of the
# gradient all-reduce hidden behind backward.
#   bash scripts/bench/ddp_engine.sh [PRESET] [STEPS] [SIDE] [BATCH]   (default SanaMS_small_P2_D8 6 64 4)
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/python_env.sh
build=${SANA_BUILD_DIR:-build}
args=("${1:-SanaMS_small_P2_D8}" "${2:-6}" "${3:-64}" "${4:-4}")
cmake --build "$build" --target sana-train bench_ddp > /dev/null
cpp=$("$build/apps/sana-train" launch --nproc-per-node 2 -- "$PWD/$build/apps/bench_ddp" "${args[@]}" 2>&1 | grep '^\[rank 0\]' | sed 's/^\[rank 0\] //')
echo "$cpp"
py=$(OMP_NUM_THREADS=1 "$SANA_PYTHON" -m torch.distributed.run --redirects 2 --tee 1 --log_dir "$(mktemp -d)" --nproc_per_node 2 --master_port "$("$SANA_PYTHON" -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')" \
  scripts/bench/ddp_engine.py "${args[@]}" 2>&1 | grep -o "python DDP.*")
echo "$py"
ours=$(grep -o '[0-9.]* samples/s' <<<"$cpp" | head -1 | cut -d' ' -f1)
theirs=$(grep -o '[0-9.]* samples/s' <<<"$py" | cut -d' ' -f1)
awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "ratio sana-train / PyTorch DDP: %.2f\n", a / b }'
