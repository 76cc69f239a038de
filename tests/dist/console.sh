#!/usr/bin/env bash
# What a user reads on the terminal of a 2-process run, under sana-train launch (the
# quickstart's command and config on the example data, previews and the closing report
# included), mpirun and torchrun: one progress line per log interval (rank 0's), no
# library warning (each example PNG gets a text chunk with a wrong CRC, which every libpng
# warns about: it is said once, as ours), every line ours; rank 1's progress is in its own
# log file. Then a resume that changes keys names each, old -> new.
#   bash tests/dist/console.sh [launch | mpirun | torchrun]
# Each part is a ctest entry of its own (dist.console, dist.console_mpirun,
# dist.console_torchrun); mpirun's and torchrun's skip (exit 77) where they cannot start.
. "$(dirname "$0")/lib.sh"
part=${1:-launch}
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
data=${SANA_EXAMPLE_DATA:-/usr/share/backgrounds/mate}
steps=20 interval=5
common=(--config "$config" --data.data_dir="[$data]" "--train.max_steps=$steps" "--train.log_interval=$interval"
        --train.visualize=false --dist.timeout_s=60 --train.save_model_steps=10)
expected=$((steps / interval))
log_line='^\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+ r[01]/2 [DIWE]\] '

check_terminal() {  # NAME OUTPUT WORK_DIR STRICT (1: every line must be ours)
  local name=$1 out=$2 dir=$3 strict=$4
  local progress others foreign
  progress=$(grep -cE " step [0-9]+/$steps loss " "$out")
  others=$(grep -E " step [0-9]+/$steps loss " "$out" | grep -cvE ' r0/2 I\] ')
  if [ "$progress" -eq "$expected" ] && [ "$others" -eq 0 ]; then
    pass "$name: $progress progress lines for $steps steps at log_interval $interval, all rank 0's"
  else
    fail "$name: $progress progress lines ($others not rank 0's), expected $expected"; cat "$out"
  fi
  if grep -i "libpng" "$out" | grep -qv "libpng warns '"; then
    fail "$name: libpng printed to the terminal"; grep -i libpng "$out" | head -3
  else
    pass "$name: no libpng output but ours"
  fi
  n1=$(grep -cE " step [0-9]+/$steps loss " "$dir/train.rank1.log")
  if [ "$n1" -eq "$expected" ]; then pass "$name: rank 1's $n1 progress lines are in train.rank1.log"; else fail "$name: train.rank1.log has $n1 progress lines"; fi
  if [ "$strict" = 1 ]; then
    foreign=$(grep -vE "$log_line|^\[launcher\] " "$out" || true)
    if [ -z "$foreign" ]; then pass "$name: every terminal line is sana-train's ($(wc -l < "$out") lines)"; else fail "$name: lines not ours: $(echo "$foreign" | head -5)"; fi
  fi
}

# 2. mpirun: the same terminal (mpirun adds nothing of its own on success).
if [ "$part" = mpirun ]; then
  command -v mpirun > /dev/null || skip "no mpirun on PATH (Debian: openmpi-bin)"
  out=$SCRATCH/mpirun.log
  timeout 240 mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT="$(free_port)" \
    "$BIN" "${common[@]}" "--work_dir=$SCRATCH/mpirun-$TOKEN" > "$out" 2>&1
  assert_code $? 0 "$steps steps under mpirun"
  check_terminal mpirun "$out" "$SCRATCH/mpirun-$TOKEN" 1
  assert_no_leftovers
  finish
fi

# 3. torchrun (Debian's 1.13; trixie's cannot start a process here: see check_dist.sh).
if [ "$part" = torchrun ]; then
  port=$(free_port)
  timeout 60 "$SANA_PYTHON" -m torch.distributed.run --nnodes 1 --nproc_per_node 1 --master_port "$port" \
    --redirects 2 --tee 2 --log_dir "$SCRATCH/probe" --no_python /bin/true > "$SCRATCH/probe.log" 2>&1 ||
    { tail -3 "$SCRATCH/probe.log"; skip "this torchrun cannot start /bin/true (above)"; }
  out=$SCRATCH/torchrun.log
  # Debian's torchrun crashes without --redirects (its default 0 hits an enum bug); 2 + tee 2: stderr to the terminal.
  timeout 240 "$SANA_PYTHON" -m torch.distributed.run --nnodes 1 --nproc_per_node 2 --master_port "$port" \
    --redirects 2 --tee 2 --log_dir "$SCRATCH/torchrun-logs" --no_python "$BIN" "${common[@]}" "--work_dir=$SCRATCH/torchrun-$TOKEN" > "$out" 2>&1
  assert_code $? 0 "$steps steps under torchrun"
  check_terminal torchrun "$out" "$SCRATCH/torchrun-$TOKEN" 0  # torchrun prints its own notices
  assert_no_leftovers
  finish
fi
[ "$part" = launch ] || { echo "console.sh: unknown part '$part' (launch, mpirun or torchrun)"; exit 2; }

# 1. The quickstart: its launch command and config on the example data (previews at the
# end, the report), only shorter.
bash "$(dirname "$0")/../../scripts/prepare_example_data.sh" "$SCRATCH/example" > /dev/null || fail "no example data"
# A tEXt chunk with a wrong CRC after each PNG's header (Debian 12's libpng also warns about
# the photos' sRGB profiles, trixie's does not; this warning every libpng 1.6 gives).
timeout 60 "$SANA_PYTHON" - "$SCRATCH/example" <<'PY' || fail "damaging the example PNGs' text chunks"
import pathlib, struct, sys
for p in pathlib.Path(sys.argv[1]).rglob("*.png"):
    b = p.read_bytes()
    data = b"Comment\0damaged on purpose"
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + b"\0\0\0\0"
    p.write_bytes(b[:33] + chunk + b[33:])  # signature (8) + IHDR (25), then the chunk
PY
quick=(--config "$config" "--data.data_dir=[$SCRATCH/example]" "--train.max_steps=$steps" "--train.log_interval=$interval"
       --train.save_model_steps=10)
out=$SCRATCH/launch.log
timeout 240 "$BIN" launch --nproc-per-node 2 -- "${quick[@]}" "--work_dir=$SCRATCH/launch-$TOKEN" > "$out" 2>&1
assert_code $? 0 "$steps steps under sana-train launch"
check_terminal launch "$out" "$SCRATCH/launch-$TOKEN" 1
said=$(grep -c "libpng warns 'tEXt: CRC error'" "$out")
if [ "$said" -eq 1 ]; then pass "libpng's CRC warning is said once"; else fail "the CRC warning is said $said times"; fi
assert_contains "$out" "image decoder warnings on this rank (the images decoded): " "the run's end counts the decoder warnings"
assert_contains "$out" "preview: " "the quickstart's previews were drawn"
assert_contains "$out" "report/loss.png" "the closing report was written"

# 4. A resume that changes keys says which, old -> new.
out=$SCRATCH/resume.log
timeout 240 "$BIN" launch --nproc-per-node 2 -- "${quick[@]}" "--work_dir=$SCRATCH/launch-$TOKEN" \
  --resume_from="$SCRATCH/launch-$TOKEN/checkpoints/step_00000010" --train.max_steps=25 \
  --train.optimizer.lr=5e-4 --train.gradient_clip=0.5 > "$out" 2>&1
assert_code $? 0 "resumed with a new learning rate, clip and max_steps"
assert_contains "$out" "the config differs from the checkpoint's in 3 keys:" "the resume counts the changed keys"
for change in "train.gradient_clip: 1.0 -> 0.5" "train.max_steps: 20 -> 25" "train.optimizer.lr: 0.001 -> 0.0005"; do
  assert_contains "$out" "$change" "the resume names '$change'"
done
assert_no_leftovers
finish
