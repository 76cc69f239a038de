#!/usr/bin/env bash
# What scripts/gpu_check.sh (the functional check) and scripts/gpu_perf.sh (the speed
# measurement) share, sourced by both after they set:
#   root out kit py rows (the table's row names; declare -A result seconds figures detail)
#   say (a function), allow_cpu (1: no GPU is a CPU run, else exit 2), allow_cpu_hint
#   deadline_at (optional: epoch seconds no command may run past)
# It gives the table (ok, skip, fail, write_table, run_logged), finds LibTorch and the GPUs
# (torch_source torch_prefix torch_version torch_cuda gpu_names ngpu mode peak environment),
# makes the build's command (build_dir bin tests_bin build_cmd: sana-train and
# sana_torch_tests in $SANA_CHECK_BUILD_DIR, default build-gpu, so the two scripts share one
# incremental build), and reads runs (throughput, model_json, json_get, memory_figure).

# The table is rewritten after every row, so a check cut short still leaves its rows.
skip() { result[$1]=skip detail[$1]=$2; say "$1: skipped: $2"; write_table; }
fail() { result[$1]=FAIL detail[$1]=$2 failed=1; say "$1: FAIL: $2"; write_table; }
write_table() {
  {
    printf '| step | result | seconds | figures | detail |\n|---|---|---|---|---|\n'
    for r in "${rows[@]}"; do
      printf '| %s | %s | %s | %s | %s |\n' "$r" "${result[$r]}" "${seconds[$r]}" "${figures[$r]}" "${detail[$r]//|/\\|}"
    done
  } > "$out/${table_name:-table}.md"
  {
    for r in "${rows[@]}"; do
      printf '%s\t%s\t%s\t%s\t%s\n' "$r" "${result[$r]}" "${seconds[$r]}" "${figures[$r]}" "${detail[$r]}"
    done
  } | "$py" -c '
import json, sys
rows = [dict(zip(("step", "result", "seconds", "figures", "detail"), l.rstrip("\n").split("\t"))) for l in sys.stdin]
for r in rows: r["seconds"] = int(r["seconds"])
json.dump({"environment": sys.argv[1], "rows": rows}, open(sys.argv[2], "w"), indent=1)' "$environment" "$out/${table_name:-table}.json"
}

# Runs ROW LIMIT LOGNAME COMMAND...: output in $out/LOGNAME.log, time in the row; returns its code.
run_logged() {
  local row=$1 limit=$2 name=$3 start rc
  shift 3
  if [ -n "${deadline_at:-}" ]; then  # never past the overall deadline
    local left=$(( deadline_at - $(date +%s) ))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then say "$row: no time left before the deadline"; return 124; fi
  fi
  say "$row: $*" | cut -c1-300
  start=$(date +%s)
  timeout --kill-after=20 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  seconds[$row]=$(( ${seconds[$row]} + $(date +%s) - start ))
  [ "$rc" -eq 124 ] && say "$row: timed out after ${limit}s ($out/$name.log)"
  return "$rc"
}
ok() { result[$1]=ok detail[$1]=$2; say "$1: ok: $2"; write_table; }


# ---- LibTorch and GPUs ----------------------------------------------------------------------
torch_source="" torch_prefix="" torch_version="?" torch_cuda=no
pip_torch() { python3 -c "import torch; $1" 2> /dev/null; }
if [ -n "${TORCH_PREFIX:-}" ]; then
  torch_source=TORCH_PREFIX torch_prefix=$TORCH_PREFIX
  [ -f "$torch_prefix/build-version" ] && torch_version=$(cat "$torch_prefix/build-version")
  [ -e "$torch_prefix/lib/libtorch_cuda.so" ] && torch_cuda=yes
elif cmake_dir=$(pip_torch 'print(torch.utils.cmake_prefix_path)') && [ -f "$cmake_dir/Torch/TorchConfig.cmake" ]; then
  torch_source="pip torch ($(command -v python3))" torch_prefix=$cmake_dir
  torch_version=$(pip_torch 'print(torch.__version__)')
  torch_cuda=$(pip_torch 'print("yes" if torch.version.cuda else "no")')
  if [ "$(pip_torch 'print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')" = 0 ]; then
    say "pip torch $torch_version uses the old C++ ABI: use torch 2.7 or later, or TORCH_PREFIX=DIR"; exit 2
  fi
else
  torch_source=system
  torch_version=$(sed -n 's/^ *"\([0-9.]*\)".*/\1/p' /usr/include/torch/csrc/api/include/torch/version.h 2> /dev/null | head -n 1)
  compgen -G '/usr/lib/*/libtorch_cuda.so*' > /dev/null && torch_cuda=yes
fi
gpu_names=()
command -v nvidia-smi > /dev/null && mapfile -t gpu_names < <(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null)
ngpu=${#gpu_names[@]}
mode=cuda
if [ "$ngpu" -eq 0 ]; then
  if [ "${allow_cpu:-0}" != 1 ]; then
    say "no CUDA device (nvidia-smi shows none): run this on a GPU machine, or ${allow_cpu_hint:-}"; exit 2
  fi
  mode=cpu
fi
peak_for() {
  case "$1" in
    *H100*PCIe*) echo 756e12 ;; *H100*NVL* | *H200*NVL*) echo 835e12 ;; *H100* | *H200*) echo 989e12 ;;
    *A100*) echo 312e12 ;; *L40S*) echo 362e12 ;; *B200*) echo 2250e12 ;; *) echo "" ;;
  esac
}
peak=${SANA_CHECK_PEAK_FLOPS:-}
[ -z "$peak" ] && [ "$mode" = cuda ] && peak=$(peak_for "${gpu_names[0]}")
environment="LibTorch $torch_version ($torch_source), CUDA $torch_cuda; ${ngpu} GPU(s)${gpu_names[0]:+ ${gpu_names[0]}}; mode $mode; $(nproc) cores; kit $( [ -d "$kit/usr" ] && echo "$kit" || echo none)"
say "$environment"
if [ "$mode" = cuda ] && [ "$torch_cuda" != yes ]; then
  say "the LibTorch found ($torch_source) has no CUDA: set TORCH_PREFIX to a CUDA LibTorch"; exit 2
fi


# ---- The build's command ------------------------------------------------------------------
build_dir=${SANA_CHECK_BUILD_DIR:-$root/build-gpu}
bin=$build_dir/apps/sana-train
tests_bin=$build_dir/tests/sana_torch_tests
prefixes=()
[ -d "$kit/usr" ] && prefixes+=("$kit/usr" "$kit/fmt/usr")
[ "$torch_source" != system ] && prefixes+=("$torch_prefix")
# The tests' Python: the machine's python3, whose torch is the LibTorch when that is pip's.
cmake_args=(-DSANA_BUILD_TESTS=ON "-DSANA_PYTHON=$(command -v python3 || echo python3)")
[ "$torch_source" = TORCH_PREFIX ] && cmake_args+=(-DSANA_PYTHON_CHECK=OFF)
[ "${#prefixes[@]}" -gt 0 ] && cmake_args+=("-DCMAKE_PREFIX_PATH=$(IFS=';'; echo "${prefixes[*]}")")
# The kit's protoc and its shared libraries.
[ -d "$kit/usr/bin" ] && export PATH=$kit/usr/bin:$PATH LD_LIBRARY_PATH=$kit/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
keep_going=-k  # every compile error in one build (make: -k; ninja: -k 0)
[ "${#generator[@]}" -gt 0 ] && keep_going=-k0
# Configure (seconds once cached; a configure that failed half-way is redone), then build
# incrementally: sana-train and the torch tests only.
build_cmd=(bash -c 'cmake -S "$2" -B "$1" "${@:5}" &&
                    cmake --build "$1" -j "$3" --target sana-train sana_torch_tests -- "$4"'
           _ "$build_dir" "$root" "${SANA_CHECK_JOBS:-$(nproc)}" "$keep_going" "${generator[@]}" "${cmake_args[@]}")

# Samples/s over the last two thirds of the logged steps (the first third holds the warm-up),
# from the wall-clock times of metrics.jsonl; MFU from FLOPS per sample (sana-train model).
# Prints "samples/s mfu".
throughput() {  # METRICS GLOBAL_BATCH FLOPS_PER_SAMPLE DEVICES
  "$py" - "$@" "${peak:-0}" <<'PY'
import json, sys
path, batch, flops, devices, peak = sys.argv[1], int(sys.argv[2]), float(sys.argv[3] or 0), int(sys.argv[4]), float(sys.argv[5])
rows = [json.loads(l) for l in open(path)]
rows = [r for r in rows if "step" in r and "time_s" in r]
a = rows[len(rows) // 3]
z = rows[-1]
sps = (z["step"] - a["step"]) * batch / (z["time_s"] - a["time_s"])
mfu = f"{100 * sps * flops / (peak * devices):.1f}%" if flops and peak else "n/a"
print(f"{sps:.1f} {mfu}")
PY
}
model_json() {  # LOGNAME ARGS...: sana-train model --json into $out/LOGNAME.json
  local name=$1
  shift
  timeout 120 "$bin" model "$@" --json > "$out/$name.json" 2> "$out/$name.err"
}
json_get() { "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@" 2> /dev/null; }


# Memory measured (memory.json, rank 0) against the estimate (model --json): "measured/estimate GiB".
memory_figure() {  # WORK_DIR MODEL_JSON
  "$py" - "$1/memory.json" "$2" <<'PY' 2> /dev/null || echo "memory n/a"
import json, sys
m = json.load(open(sys.argv[1]))["ranks"][0]
keys = ("parameters", "gradients", "optimizer", "ema", "gathered", "activations_peak")
measured = sum(m[k] for k in keys)
e = json.load(open(sys.argv[2]))["memory_per_process"]
act = e["activations_grad_checkpointing"] if e.get("grad_checkpointing") else e["activations"]
parts = {"parameters": e["weights"], "gradients": e["gradients"], "optimizer": e["optimizer"], "ema": e["ema"],
         "gathered": e["gathered"], "activations_peak": act}
total = sum(parts.values())
g = 1 << 30
print(f"memory {measured / g:.2f} GiB measured / {total / g:.2f} GiB estimated (activations {m['activations_peak'] / g:.2f} / {parts['activations_peak'] / g:.2f})")
PY
}

