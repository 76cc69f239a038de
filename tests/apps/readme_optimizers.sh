#!/usr/bin/env bash
# The README's optimizer lines (between <!-- optimizer-lines:begin --> and
# <!-- optimizer-lines:end -->, under "Fine-tune released Sana weights with LoRA"): each,
# added to a command on configs/Sana_1600M_img1024_lora.yaml (what the README's my_lora.yaml
# is based on), makes a config that loads (--print-config exits 0) and runs the optimizer the
# line names, with that optimizer's own betas and eps where the line clears them.
. "$(dirname "$0")/../dist/lib.sh"
root=$LIB_ROOT
cd "$SCRATCH" || exit 1
readme_commands optimizer-lines 4
while read -r line; do
  read -r -a words <<< "${line%%  #*}"
  type=$(sed -n 's/.*--train.optimizer.type=\([A-Za-z0-9]*\).*/\1/p' <<< "$line")
  timeout 60 "$BIN" --config "$root/configs/Sana_1600M_img1024_lora.yaml" "--data.data_dir=[.]" "${words[@]}" \
    --print-config > "$type.yaml" 2> "$type.err"
  assert_code $? 0 "the README's $type line makes a config that loads"
  assert_contains "$type.yaml" "type: \"$type\"" "and trains with $type"
done < commands.txt
finish
