#!/usr/bin/env bash
# Proves scripts/check_layout.sh can fail: on a small temporary tree that follows every rule
# it must pass (exit 0), then with one violation of each kind added it must exit 1 and name
# each one, and with no universal-ctags it must say so and exit 77. Run by ctest as
# build.layout_selftest (skipped, exit 77, where universal-ctags is missing).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
check="$repo/scripts/check_layout.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree="$tmp/tree"
fail() { echo "layout_selftest: FAIL: $*" >&2; exit 1; }
# The clean and violating trees need the function-length check; without universal-ctags
# (the LibTorch 2.6 chroot) the whole self-test is skipped, as build.layout is.
if ! { command -v ctags > /dev/null && ctags --version 2>/dev/null | grep -q 'Universal Ctags'; }; then
  echo "layout_selftest: skipped: universal-ctags is missing (scripts/install_deps.sh installs it)"
  exit 77
fi

# A clean tree: every allowed kind of include, a reference into docs/, a URL.
mkdir -p "$tree"/{src/sana/{util,config,model,data,ckpt,train/loop},apps/commands,tests,scripts,docs}
printf '# Design\n\n[layers](layers.md)\n' > "$tree/docs/design.md"
echo "# Layers" > "$tree/docs/layers.md"
printf '# t\n\n```sh\nbash scripts/quickstart.sh\nbash scripts/test.sh\n```\n\napps/ src/sana/ tests/ docs/\n' \
  > "$tree/README.md"
printf '#pragma once\n' > "$tree/src/sana/torch_compat.h"
printf '#pragma once\n#include "sana/torch_compat.h"\n' > "$tree/src/sana/util/log.h"
printf '#pragma once\n#include "sana/util/log.h"\n' > "$tree/src/sana/config/config.h"
printf '#pragma once\n#include "sana/util/log.h"\n' > "$tree/src/sana/model/spec.h"
printf '#include "sana/model/spec.h"\n// docs/design.md, "Layers"; https://example.org/NOTES.md\nint f() { return 1; }\n' \
  > "$tree/src/sana/model/spec.cpp"
printf '#pragma once\n#include "sana/util/log.h"\n' > "$tree/src/sana/data/dataset.h"
printf '#pragma once\n#include "sana/config/config.h"\n#include "sana/model/spec.h"\n#include "sana/data/dataset.h"\n' \
  > "$tree/src/sana/train/loop/trainer.h"
printf '#include "sana/train/loop/trainer.h"\nint main() { return 0; }\n' > "$tree/apps/main.cpp"
printf '#include "sana/train/loop/trainer.h"\n' > "$tree/apps/commands/train.cpp"
printf '#!/usr/bin/env bash\n# see docs/design.md\necho ok\n' > "$tree/scripts/run.sh"
printf '# see ../docs/design.md\n' > "$tree/tests/CMakeLists.txt"
# Bounded waits: timeout, start_bounded and code_of, a marked line, a heredoc body.
cat > "$tree/tests/bounded.sh" <<'SH'
timeout 60 "$BIN" launch -- x > out.log 2>&1 &
start_bounded 60 out.log "$BIN" launch -- y
code_of "$BG" 30; echo "done"  # the word wait in a string, and in: wait_for_exit
X=1 timeout 30 "$SANA_PYTHON" - <<'PY'
wait
PY
wait "$pid"  # bounded: it has exited
SH

out=$(SANA_LAYOUT_ROOT="$tree" bash "$check" 2>&1) || fail "clean tree: exit $?: $out"
echo "$out"
grep -q 'check_layout: clean' <<< "$out" || fail "clean tree: no summary"

# Without universal-ctags: function lengths skipped, said so, exit 77.
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "Exuberant Ctags 5.8"\n' > "$tmp/bin/ctags"
chmod +x "$tmp/bin/ctags"
rc=0
out=$(PATH="$tmp/bin:$PATH" SANA_LAYOUT_ROOT="$tree" bash "$check" 2>&1) || rc=$?
[ "$rc" = 77 ] || fail "no ctags: exit $rc, expected 77: $out"
grep -q 'function lengths NOT checked' <<< "$out" || fail "no ctags: not said: $out"

# One violation of each kind (the paths are built from pieces so that this file's own
# lines do not hold them).
printf '#pragma once\n#include "sana/train/loop/trainer.h"\n' > "$tree/src/sana/util/upward.h"
printf '#include "sana/data/dataset.h"\n' > "$tree/src/sana/model/sideways.cpp"
printf '#pragma once\n#include "sana/config/config.h"\n' > "$tree/src/sana/data/options.h"
mkdir -p "$tree/src/sana/train/features"
printf '#pragma once\n#include "sana/train/loop/trainer.h"\n' > "$tree/src/sana/train/features/prepare.h"
printf '#include "sana/train/features/prepare.h"\n' > "$tree/src/sana/train/uses_features.cpp"
seq 501 | sed 's|^|// line |' > "$tree/src/sana/data/long_file.cpp"
{ echo 'int long_function() {'; for i in $(seq 79); do echo "  int v$i = $i;"; done; echo '  return 0;'; echo '}'; } \
  > "$tree/src/sana/ckpt/long_function.cpp"   # 82 lines
outside="../shared/DESIGN"
printf '// The plan (%s.md)\n' "$outside" > "$tree/src/sana/data/plan.h"
bare="DESIGN"
printf 'x=1  %s as in %s.md\n' '#' "$bare" > "$tree/scripts/bare.sh"
zero=zero_stage test_var=SANA_TEST_
printf 'int stage(int %s) { return 0; }\n' "$zero" > "$tree/src/sana/model/knows_zero.cpp"
printf 'const char* v = "%sX";\n' "$test_var" > "$tree/src/sana/data/reads_test.cpp"
echo "# Orphan" > "$tree/docs/orphan.md"
{ for i in $(seq 40); do echo "line $i"; done; cat "$tree/README.md"; } > "$tree/README.new"
mv "$tree/README.new" "$tree/README.md"
zero_call=gather_parameters
printf 'void f(Z& z) {\n  // %s in a comment is fine\n  log("%s");\n  z.%s();\n}\n' "$zero_call" "$zero_call" "$zero_call" \
  > "$tree/src/sana/train/drives_zero.cpp"
hooks_global=TestHooks::from_environment
printf 'auto h = %s();\n' "$hooks_global" > "$tree/src/sana/train/global_hooks.cpp"
printf '#pragma once\n#include "sana/config/config.h"\n' > "$tree/src/sana/train/reads_config.h"
w=wait m=mpirun py='"$SANA_PYTHON"'
printf '"$BIN" train &\n%s $!\nif ! X=1 env %s -np 2 a \\\n  b; then :; fi\nout=$(%s -c 1)\n' "$w" "$m" "$py" \
  > "$tree/tests/unbounded.sh"
{ echo 'class Trainer {'; for i in $(seq 16); do echo "  int part${i}_;"; done; echo '  struct Nested { int field; };'; echo '};'; } \
  >> "$tree/src/sana/train/loop/trainer.h"
kind=SprintStep
printf 'void Trainer::f() {\n  // %s and regroup() in a comment are fine\n  %s s;\n  if (!elastic_.regroup("%s")) return;\n  rt_.regroup(1);\n}\n' \
  "$kind" "$kind" "$kind" > "$tree/src/sana/train/loop/trainer_kind.cpp"
mkdir -p "$tree/src/sana/train/options"
{ for part in a b; do  # 2 x 38 copies, through an alias and a config-typed parameter; constants do not count
    echo "O ${part}_for(const config::Config& cfg, const config::TrainConfig& t) {"
    echo '  const auto& d = cfg.data;'
    for i in $(seq 19); do echo '  o.field = d.key;'; echo '  o.other.field = t.key;'; done
    echo '  o.constant = 3;'
    echo '}'
  done; } > "$tree/src/sana/train/options/mapping.cpp"

rc=0
out=$(SANA_LAYOUT_ROOT="$tree" bash "$check" 2>&1) || rc=$?
echo "$out"
[ "$rc" = 1 ] || fail "violations: exit $rc, expected 1"
expect() { grep -qF -- "$1" <<< "$out" || fail "violations: no line with '$1'"; }
expect 'src/sana/util/upward.h:2: includes sana/train/loop/trainer.h (util -> train: upward'
expect 'src/sana/model/sideways.cpp:1: includes sana/data/dataset.h (model -> data: sideways'
expect 'src/sana/train/uses_features.cpp:1: includes sana/train/features/prepare.h (train -> train/features: rule a'
expect 'src/sana/data/options.h:2: includes sana/config/config.h (data -> config: sideways; rule a: a component takes its own options'
expect 'src/sana/data/long_file.cpp:1: 501 lines (rule b'
expect 'src/sana/ckpt/long_function.cpp:1: function long_function is 82 lines (rule c'
expect "src/sana/data/plan.h:1: comment points at '${outside}.md'"
expect "scripts/bare.sh:1: comment points at 'DESIGN.md'"
expect 'tests/unbounded.sh:1: "$BIN" started without a time limit (rule e'
expect 'tests/unbounded.sh:2: a bare wait (rule e'
expect 'tests/unbounded.sh:3: mpirun started without a time limit (rule e'
expect 'tests/unbounded.sh:5: "$SANA_PYTHON" started without a time limit (rule e'
expect 'src/sana/model/knows_zero.cpp:1: names ZeRO in the model (rule f'
expect 'src/sana/data/reads_test.cpp:1: reads or names a SANA_TEST_ variable (rule g'
expect 'src/sana/train/global_hooks.cpp:1: reads the test hooks from the environment (rule g'
expect 'src/sana/train/drives_zero.cpp:4: gather_parameters in the loop (rule i'
expect "README.md:1: 'bash scripts/quickstart.sh' is not in the first 40 lines (rule j"
expect 'docs/design.md:1: does not link orphan.md (rule j'
expect 'src/sana/train/reads_config.h:2: includes the config (rule h'
expect 'src/sana/train/loop/trainer.h:1: class Trainer has 16 members, over 15 (rule k'
expect 'src/sana/train/loop/trainer_kind.cpp:3: a kind of training named in the trainer (rule k'
expect 'src/sana/train/loop/trainer_kind.cpp:5: regroup code in the trainer (rule k'
expect 'src/sana/train/options/:1: 76 hand-written config-to-options lines, over 75 (rule l'
n=$(grep -c ': rule\|(rule\|: upward\|: sideways' <<< "$out" || true)
[ "$n" = 28 ] || fail "violations: $n lines, expected 28"
echo "layout_selftest: ok"
