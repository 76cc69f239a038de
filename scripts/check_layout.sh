#!/usr/bin/env bash
# Checks the source layout (docs/layers.md); run by ctest as build.layout.
#   a. every #include "sana/..." in src/ and apps/ follows the layer rules:
#        util (src/sana/util/, src/sana/torch_compat.h)
#          <- {config, data, model, diffusion, distributed, ckpt} <- parallel <- train
#          <- apps (apps/, apps/commands/)
#      a file may include its own folder and any lower layer; never a higher one, and never
#      sideways among config, data, model, diffusion, distributed and ckpt: the components
#      take options structs of their own, which train/options/core_options.h fills from the
#      config, so none of them includes config/; and train/features/ (a command of its own
#      built on the loop's parts) is included by nothing in src/ outside it; parallel/
#      (gradient reduction, ZeRO's shard plans, gathered parameters and sharded parts and
#      checkpoints) wraps the model and the runtime from outside and knows no config;
#   b. no file in src/ or apps/ over 500 lines;
#   c. no function in src/ or apps/ over 80 lines (universal-ctags' line: and end: fields);
#      b and c are backstops, not targets: files over 400 lines and functions over 60 are
#      listed as warnings (no failure), so a part is split by concept before it piles up
#      at a cap;
#   d. no comment in src/, apps/, tests/ or scripts/ names a Markdown file that is not in
#      the repository, or a ../ path that leaves it (design notes live under docs/).
#   e. every wait in a test script is bounded: in tests/**/*.sh, no bare `wait` and no
#      process start (sana-train, its launchers, mpirun, srun, python3, ip netns exec,
#      setsid) that is not under `timeout` or start_bounded (tests/dist/lib.sh: the pid goes
#      to code_of, which waits until a deadline). A line that must differ says why in a
#      comment "# bounded: ..." (counted in the summary).
#   f. the model knows nothing of how it is trained: no ZeRO name (ZeRO, zero_stage, Zero,
#      gather, ShardPlan, shard_plan) in src/sana/model/ (parallel/zero.h wraps it from outside,
#      through model::BlockHooks);
#   g. fault injection in one place: no SANA_TEST_ in src/ or apps/ outside
#      src/sana/train/test_hooks.{h,cpp} (production code reads no test variable), and the
#      hooks read from the environment (TestHooks::from_environment) only by main() in
#      apps/sana_train.cpp: everything else is handed them (no global for test behaviour).
#   h. the config read in one place: under src/sana/train/ and src/sana/parallel/ only the
#      mapping (train/options/), the entry point and the loop (train/train.{h,cpp},
#      train/loop/trainer*) and train/features/ (the
#      prepare-features command) include
#      config/ or the mapping headers.
#   i. ZeRO applied from outside the loop: under src/sana/train/, but for options/ (the
#      config mapping reads the key) and report/ (the memory estimate models each stage),
#      code (comments and string literals aside) names no zero_stage and calls none of
#      ZeRO's own steps (gather_parameters, gather_to_writer, step_done, sort_by_parameter):
#      parallel::Zero installs its block hooks, its post-backward and its post-step itself,
#      and the loop holds the whole model through one guard.
#   j. the front door: README.md's first 40 lines hold the two commands (bash
#      scripts/quickstart.sh, bash scripts/test.sh) and the map of the repository (a line
#      naming each of apps/, src/sana/, tests/ and docs/), and docs/design.md links every
#      page in docs/ (checked where the tree has README.md and docs/design.md).
#   k. the trainer holds parts, not features: class Trainer (train/loop/trainer.h) has at
#      most 15 data members, and train/loop/trainer*.{h,cpp} (comments and string literals
#      aside) name no kind of training (Sprint...: a TrainingStep of its own) and hold no
#      regroup code (the group changes in train/elastic/continuation.h; the trainer only
#      calls elastic_.regroup).
#   l. the config mapping is a table: src/sana/train/options/*.cpp hold at most 75
#      hand-written config-to-options lines ("x.field = ..." reading the config, through
#      cfg, a config-typed parameter or an alias of either); a key taken as it is is a row
#      of a fill_from_keys table (train/options/from_keys.h), and what stays code derives
#      or chooses.
# Prints one line per violation (file:line: what, which rule) and exits 1; prints a summary
# table and exits 0 when clean. Without universal-ctags, check c is skipped, saying so, and
# the exit is 77 (ctest: skipped) when the other checks pass.
#   bash scripts/check_layout.sh          checks this repository
#   SANA_LAYOUT_ROOT=DIR bash scripts/check_layout.sh   checks the tree at DIR instead
set -euo pipefail
export LC_ALL=C
root=${SANA_LAYOUT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
root=$(cd "$root" && pwd -P)
cd "$root"
max_file_lines=500
max_trainer_members=15
max_mapping_copies=75  # a third of the 225 such lines the mapping held on 2026-12-04
max_function_lines=80
soft_file_lines=400
soft_function_lines=60

violations=$(mktemp)
warnings=$(mktemp)
trap 'rm -f "$violations" "$warnings"' EXIT

dirs_present() { local d; for d in "$@"; do [ -d "$d" ] && echo "$d"; done; return 0; }
mapfile -t code_dirs < <(dirs_present src apps)
mapfile -t comment_dirs < <(dirs_present src apps tests scripts)
[ ${#code_dirs[@]} -gt 0 ] || { echo "check_layout: no src/ or apps/ under $root" >&2; exit 1; }

# Text files, relative paths, sorted; build trees and VCS folders left out.
list_files() {
  find "$@" \( -name build -o -name .git -o -name '__pycache__' \) -prune -o -type f -print |
    sort | while IFS= read -r f; do grep -Iq . "$f" 2>/dev/null && echo "$f"; done
  return 0
}
mapfile -t code_files < <(list_files "${code_dirs[@]}")
mapfile -t cxx_files < <(printf '%s\n' "${code_files[@]}" | grep -E '\.(h|hh|hpp|c|cc|cpp|cxx|cu|cuh)$' || true)
mapfile -t comment_files < <(list_files "${comment_dirs[@]}")

# --- a. includes against the layers --------------------------------------------------------
include_count=0
if [ ${#cxx_files[@]} -gt 0 ]; then
  include_count=$(awk '
    # The layer of a path relative to the root (files) or to src/ (include names).
    function layer(p) {
      if (p ~ /^apps\//) return "apps"
      sub(/^src\//, "", p)
      if (p == "sana/torch_compat.h" || p ~ /^sana\/util\//) return "util"
      if (p ~ /^sana\/(config|data|model|diffusion|distributed|ckpt|parallel|train)\//) {
        split(p, parts, "/"); return parts[2]
      }
      return ""
    }
    function rank(l) {
      if (l == "util") return 0
      if (l ~ /^(config|data|model|diffusion|distributed|ckpt)$/) return 1
      if (l == "parallel") return 2
      if (l == "train") return 3
      if (l == "apps") return 4
      return -1
    }
    FNR == 1 { from = layer(FILENAME) }
    /^[ \t]*#[ \t]*include[ \t]*["<]sana\// {
      n++
      target = $0
      sub(/^[ \t]*#[ \t]*include[ \t]*["<]/, "", target); sub(/[">].*$/, "", target)
      to = layer(target)
      where = FILENAME ":" FNR ": includes " target
      if (from == "") { print where " (file is in no layer: rule a, layers are util, config/data/model/diffusion/distributed/ckpt, parallel, train, apps)" >> VIOL; next }
      if (to == "") { print where " (no such layer: rule a, sana/ includes name util, config, data, model, diffusion, distributed, ckpt, parallel, train or torch_compat.h)" >> VIOL; next }
      if (target ~ /^sana\/train\/features\// && FILENAME ~ /^src\// && FILENAME !~ /^src\/sana\/train\/features\//) {
        print where " (train -> train/features: rule a: train/features/ is a command of its own; only apps/ include it)" >> VIOL
        next
      }
      if (to == from || rank(to) < rank(from)) next
      if (rank(to) == rank(from) && to == "config")
        print where " (" from " -> config: sideways; rule a: a component takes its own options, filled from the config by train/options/core_options.h)" >> VIOL
      else if (rank(to) == rank(from))
        print where " (" from " -> " to ": sideways; rule a: config, data, model, diffusion, distributed and ckpt include only util and their own folder)" >> VIOL
      else
        print where " (" from " -> " to ": upward; rule a: " from " may include only lower layers)" >> VIOL
    }
    END { print n + 0 }
  ' VIOL="$violations" "${cxx_files[@]}")
fi
include_violations=$(wc -l < "$violations")

# --- b. file length -----------------------------------------------------------------------
longest_file="-"; longest_file_lines=0
while read -r lines file; do
  [ "$file" = total ] && continue
  if [ "$lines" -gt "$longest_file_lines" ]; then longest_file_lines=$lines; longest_file=$file; fi
  if [ "$lines" -gt "$max_file_lines" ]; then
    echo "$file:1: $lines lines (rule b: no file in src/ or apps/ over $max_file_lines lines)" >> "$violations"
  elif [ "$lines" -gt "$soft_file_lines" ]; then
    echo "$file:1: $lines lines (over the soft limit of $soft_file_lines: split it by concept before it grows)" >> "$warnings"
  fi
done < <(printf '%s\0' "${code_files[@]}" | xargs -0 wc -l)
file_violations=$(( $(wc -l < "$violations") - include_violations ))

# --- c. function length (universal-ctags) -------------------------------------------------
function_count=0; longest_function="-"; longest_function_lines=0; function_violations=0
ctags_note=""
if command -v ctags > /dev/null && ctags --version 2>/dev/null | grep -q 'Universal Ctags'; then
  before=$(wc -l < "$violations")
  summary=$(ctags --sort=no --kinds-C++=f --fields=+ne -R --languages=C++ -f - "${code_dirs[@]}" | awk -F'\t' -v MAX="$max_function_lines" -v SOFT="$soft_function_lines" '
    {
      line = 0; end = 0; scope = ""
      for (i = 4; i <= NF; i++) {
        if ($i ~ /^line:/) line = substr($i, 6) + 0
        else if ($i ~ /^end:/) end = substr($i, 5) + 0
        else if ($i ~ /^(class|struct|namespace):/) { scope = $i; sub(/^[a-z]+:/, "", scope) }
      }
      if (line == 0 || end == 0) next
      n++
      name = $1
      if (scope != "") { k = split(scope, s, "::"); if (s[k] !~ /^__anon/) name = s[k] "::" $1 }
      len = end - line + 1
      if (len > best) { best = len; bestname = name " (" $2 ":" line ")" }
      if (len > MAX) printf "%s:%d: function %s is %d lines (rule c: no function in src/ or apps/ over %d lines)\n", $2, line, name, len, MAX >> VIOL
      else if (len > SOFT) printf "%s:%d: function %s is %d lines (over the soft limit of %d: split it by what it does)\n", $2, line, name, len, SOFT >> WARN
    }
    END { printf "%d\t%d\t%s\n", n, best, bestname }
  ' VIOL="$violations" WARN="$warnings")
  IFS=$'\t' read -r function_count longest_function_lines longest_function <<< "$summary"
  function_violations=$(( $(wc -l < "$violations") - before ))
else
  ctags_note="function lengths NOT checked: universal-ctags is missing (scripts/install_deps.sh installs it)"
  echo "check_layout: $ctags_note" >&2
fi

# --- d. comments pointing outside the repository ------------------------------------------
# awk prints each candidate (file, line, path); the shell resolves it.
before=$(wc -l < "$violations")
reference_count=0
if [ ${#comment_files[@]} -gt 0 ]; then
  while IFS=$'\t' read -r file line ref; do
    reference_count=$((reference_count + 1))
    dir=$(dirname "$file")
    ok=0
    if [[ "$ref" == /* ]]; then
      ok=0
    elif [[ "$ref" == *.md ]]; then
      for base in "$root" "$root/$dir"; do
        p=$(realpath -m "$base/$ref")
        if [[ "$p" == "$root"/* ]] && [ -e "$p" ]; then ok=1; fi
      done
    else
      p=$(realpath -m "$root/$dir/$ref")
      if [[ "$p" == "$root" || "$p" == "$root"/* ]]; then ok=1; fi
    fi
    if [ "$ok" = 0 ]; then
      echo "$file:$line: comment points at '$ref', outside the repository (rule d: point at docs/ in the repo)" >> "$violations"
    fi
  done < <(awk '
    FNR == 1 {
      block = 0
      cstyle = (FILENAME ~ /\.(h|hh|hpp|c|cc|cpp|cxx|cu|cuh|js|java)$/)
      hashstyle = (FILENAME ~ /(\.(sh|bash|py|cmake|yaml|yml|toml|cfg|txt|awk)|CMakeLists\.txt|Dockerfile)$/)
    }
    {
      text = ""
      if (cstyle) {
        line_comment = index($0, "//"); block_start = index($0, "/*")
        if (block) {
          text = $0
          if (index($0, "*/") > 0) block = 0
        } else if (line_comment > 0 && (block_start == 0 || line_comment < block_start)) {
          text = substr($0, line_comment)
        } else if (block_start > 0) {
          text = substr($0, block_start)
          if (index(substr($0, block_start + 2), "*/") == 0) block = 1
        } else if ($0 ~ /^[ \t]*\*/) {
          text = $0
        }
      } else if (hashstyle) {
        if (match($0, /(^|[ \t])#/)) text = substr($0, RSTART)
        if (FNR == 1 && $0 ~ /^#!/) text = ""
      } else if (FILENAME ~ /\.md$/) {
        text = $0
      }
      gsub(/[A-Za-z][-A-Za-z0-9+.]*:\/\/[^ \t"'\''<>)]*/, "", text)  # URLs are not repository paths
      while (text != "" && match(text, /(\.\.\/[-A-Za-z0-9_.\/]*|[-A-Za-z0-9_.\/]*[A-Za-z0-9_]\.md)/)) {
        ref = substr(text, RSTART, RLENGTH)
        after = substr(text, RSTART + RLENGTH, 1)
        text = substr(text, RSTART + RLENGTH)
        if (ref ~ /\.md$/ && after ~ /[A-Za-z0-9_]/) continue
        if (ref !~ /^[.\/]+$/) sub(/[.\/]+$/, "", ref)
        if (ref == "") continue
        print FILENAME "\t" FNR "\t" ref
      }
    }
  ' "${comment_files[@]}")
fi
comment_violations=$(( $(wc -l < "$violations") - before ))

# --- e. bounded waits in the test scripts -------------------------------------------------
mapfile -t test_scripts < <(dirs_present tests | xargs -r -I{} find {} -name '*.sh' | sort)
before=$(wc -l < "$violations")
waits_scanned=0; waits_marked=0
if [ ${#test_scripts[@]} -gt 0 ]; then
  read -r waits_scanned waits_marked < <(awk -v OUT="$violations" '
    function check(text, file, line,   rest, seg, n, i, cmd, word) {
      if (text ~ /# bounded: /) { marked++; return }
      sub(/(^|[ \t])#.*$/, "", text)  # the comment
      rest = text
      # Split into commands at ; && || | ( $( ` and the keywords that start one.
      gsub(/(\$\(|&&|\|\||[;|(`&]|\<(then|do|else|if|while|until|elif)\>|!)/, "\n", rest)
      n = split(rest, seg, "\n")
      for (i = 1; i <= n; i++) {
        cmd = seg[i]
        sub(/^[ \t]+/, "", cmd)
        # Assignments before the command, and env (which starts what follows it). An exec
        # stays: it appears in the strings given to sh -c under a launcher already bounded.
        while (match(cmd, /^([A-Za-z_][A-Za-z0-9_]*=("[^"]*"|\047[^\047]*\047|[^ \t]*)|env)[ \t]+/)) cmd = substr(cmd, RLENGTH + 1)
        if (cmd ~ /^wait([ \t]|$)/) {
          printf "%s:%d: a bare wait (rule e: code_of PID SECONDS waits until a deadline)\n", file, line >> OUT
        } else if (cmd ~ /^("\$\{?[A-Z_]*BIN\}?"|\$\{?[A-Z_]*BIN\}?|mpirun|srun|ip[ \t]+netns[ \t]+exec|\/usr\/bin\/python3|python3|"\$PY"|\$PY|"\$\{?SANA_PYTHON\}?"|\$\{?SANA_PYTHON\}?|setsid)([ \t]|$)/) {
          word = cmd; sub(/[ \t].*$/, "", word)
          printf "%s:%d: %s started without a time limit (rule e: timeout SECONDS ..., or start_bounded)\n", file, line, word >> OUT
        }
      }
      scanned++
    }
    FNR == 1 { heredoc = ""; joined = ""; start = 0 }
    {
      if (heredoc != "") { if ($0 ~ ("^[ \t]*" heredoc "[ \t]*$")) heredoc = ""; next }
      if (joined == "") start = FNR
      if ($0 ~ /\\$/) { joined = joined substr($0, 1, length($0) - 1) " "; next }
      text = joined $0; joined = ""
      if (match(text, /<<-?[ \t]*\047?[A-Za-z_]+\047?/)) {
        heredoc = substr(text, RSTART, RLENGTH); gsub(/[<\047 \t-]/, "", heredoc)
      }
      check(text, FILENAME, start)
    }
    END { print scanned + 0, marked + 0 }
  ' "${test_scripts[@]}")
fi
wait_violations=$(( $(wc -l < "$violations") - before ))

# --- f. no ZeRO names in the model; g. SANA_TEST_ in one file ------------------------------
before=$(wc -l < "$violations")
model_files=()
for f in "${code_files[@]}"; do case $f in src/sana/model/*) model_files+=("$f") ;; esac; done
if [ ${#model_files[@]} -gt 0 ]; then
  grep -nE 'ZeRO|zero_stage|\bZero\b|[Gg]ather|ShardPlan|shard_plan' "${model_files[@]}" 2>/dev/null |
    awk -F: '{ printf "%s:%s: names ZeRO in the model (rule f: the model knows nothing of how it is trained; parallel/zero.h wraps it through model::BlockHooks)\n", $1, $2 }' >> "$violations" || true
fi
zero_violations=$(( $(wc -l < "$violations") - before ))
before=$(wc -l < "$violations")
grep -nF 'SANA_TEST_' "${code_files[@]}" 2>/dev/null | grep -vE '^src/sana/train/test_hooks\.(h|cpp):' |
  awk -F: '{ printf "%s:%s: reads or names a SANA_TEST_ variable (rule g: fault injection lives in src/sana/train/test_hooks.{h,cpp}; pass what a part needs in)\n", $1, $2 }' >> "$violations" || true
grep -nE 'TestHooks::(from_environment|get)\b' "${code_files[@]}" 2>/dev/null |
  grep -vE '^(src/sana/train/test_hooks\.(h|cpp)|apps/sana_train\.cpp):' |
  awk -F: '{ printf "%s:%s: reads the test hooks from the environment (rule g: main() in apps/sana_train.cpp reads them once; take them as a parameter)\n", $1, $2 }' >> "$violations" || true
hook_violations=$(( $(wc -l < "$violations") - before ))

# --- h. the config read in one place --------------------------------------------------------
# In src/sana/train/ and src/sana/parallel/, only the config mapping (train/options/), the
# entry point, the trainer and the prepare-features command include the config (config/*.h,
# or the mapping headers that bring it).
config_allowed='^src/sana/train/(options/[a-z_]+|train|loop/trainer|loop/trainer_[a-z_]+)\.(h|cpp)$|^src/sana/train/features/'
before=$(wc -l < "$violations")
config_readers=0
while IFS=: read -r file line _; do
  [ -z "$file" ] && continue
  if [[ "$file" =~ $config_allowed ]]; then
    config_readers=$((config_readers + 1))
  else
    echo "$file:$line: includes the config (rule h: a training part takes options of its own; train/options/ fills them)" >> "$violations"
  fi
done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"sana/(config/[a-z_]+|train/options/core_options|train/options/torch_options)\.h"' \
           $(printf '%s\n' "${cxx_files[@]}" | grep -E '^src/sana/(train|parallel)/') /dev/null 2>/dev/null || true)
config_violations=$(( $(wc -l < "$violations") - before ))

# --- i. ZeRO from outside the loop ---------------------------------------------------------
before=$(wc -l < "$violations")
mapfile -t loop_files < <(printf '%s\n' "${cxx_files[@]}" | grep -E '^src/sana/train/' |
                          grep -vE '^src/sana/train/(options|report)/' || true)
if [ ${#loop_files[@]} -gt 0 ]; then
  awk '
    {
      line = $0
      gsub(/"([^"\\]|\\.)*"/, "\"\"", line)  # string literals aside
      sub(/\/\/.*$/, "", line)                  # and comments
      if (match(line, /(^|[^A-Za-z0-9_])(zero_stage|gather_parameters|gather_to_writer|step_done|sort_by_parameter)([^A-Za-z0-9_]|$)/)) {
        word = substr(line, RSTART, RLENGTH); gsub(/[^A-Za-z0-9_]/, "", word)
        printf "%s:%d: %s in the loop (rule i: parallel::Zero applies itself; the loop names no stage and calls none of its steps)\n", FILENAME, FNR, word >> VIOL
      }
    }
  ' VIOL="$violations" "${loop_files[@]}"
fi
loop_zero_violations=$(( $(wc -l < "$violations") - before ))

# --- j. the front door ----------------------------------------------------------------------
before=$(wc -l < "$violations")
if [ -f README.md ]; then
  head -40 README.md > "$warnings.readme"
  for needle in 'bash scripts/quickstart.sh' 'bash scripts/test.sh' 'apps/' 'src/sana/' 'tests/' 'docs/'; do
    grep -qF -- "$needle" "$warnings.readme" ||
      echo "README.md:1: '$needle' is not in the first 40 lines (rule j: the two commands and the map come first)" >> "$violations"
  done
  rm -f "$warnings.readme"
fi
pages_indexed=0
if [ -f docs/design.md ]; then
  for page in docs/*.md; do
    [ "$page" = docs/design.md ] && continue
    if grep -qF "](${page#docs/})" docs/design.md; then
      pages_indexed=$((pages_indexed + 1))
    else
      echo "docs/design.md:1: does not link ${page#docs/} (rule j: the index names every page)" >> "$violations"
    fi
  done
fi
front_violations=$(( $(wc -l < "$violations") - before ))

# --- k. the trainer holds parts, not features -----------------------------------------------
before=$(wc -l < "$violations")
trainer_members=0
if [ -f src/sana/train/loop/trainer.h ]; then
  # Data members of class Trainer: declarations ending in "name_;", "name_{...};" or
  # "name_ = ...;" at the class's own depth (nested structs' fields end in no underscore).
  trainer_members=$(awk '
    /^class Trainer / { inside = 1; next }
    inside && /^};/ { inside = 0 }
    inside && !/^ *\/\// && /^  [A-Za-z].*[a-z0-9]_( = [^;]*|\{[^}]*\})?;/ { n++ }
    END { print n + 0 }
  ' src/sana/train/loop/trainer.h)
  if [ "$trainer_members" -gt "$max_trainer_members" ]; then
    echo "src/sana/train/loop/trainer.h:1: class Trainer has $trainer_members members, over $max_trainer_members (rule k: group the parts by concept, each owning its state)" >> "$violations"
  fi
fi
mapfile -t trainer_sources < <(printf '%s\n' "${cxx_files[@]}" | grep -E '^src/sana/train/loop/trainer[a-z_]*\.(h|cpp)$' || true)
if [ ${#trainer_sources[@]} -gt 0 ]; then
  awk '
    {
      line = $0
      gsub(/"([^"\\]|\\.)*"/, "\"\"", line)  # string literals aside
      sub(/\/\/.*$/, "", line)                  # and comments
      if (match(line, /(^|[^A-Za-z0-9_])(Sprint[A-Za-z0-9_]*|sprint_[A-Za-z0-9_]*)/)) {
        printf "%s:%d: a kind of training named in the trainer (rule k: it is a TrainingStep of its own)\n", FILENAME, FNR >> VIOL
      }
      probe = line
      gsub(/elastic_\.regroup\(/, "", probe)
      if (match(probe, /(^|[^A-Za-z0-9_])regroup[A-Za-z0-9_]*\(/)) {
        printf "%s:%d: regroup code in the trainer (rule k: the group changes in elastic/continuation.h)\n", FILENAME, FNR >> VIOL
      }
    }
  ' VIOL="$violations" "${trainer_sources[@]}"
fi
trainer_violations=$(( $(wc -l < "$violations") - before ))

# --- l. the config mapping is a table ---------------------------------------------------------
# A hand-written config-to-options line: "x.field = ..." whose right side reads the config
# (cfg., a parameter of a config:: type, or a "const auto& a = cfg...." alias of either).
before=$(wc -l < "$violations")
mapping_copies=0
mapfile -t mapping_files < <(printf '%s\n' "${cxx_files[@]}" | grep -E '^src/sana/train/options/[^/]+\.cpp$' || true)
if [ ${#mapping_files[@]} -gt 0 ]; then
  mapping_copies=$(awk '
    function reset() { split("", alias); alias["cfg"] = 1 }
    FNR == 1 { reset() }
    /^}/ { reset() }
    {
      line = $0
      while (match(line, /const config::[A-Za-z]+& [a-z_]+/)) {
        decl = substr(line, RSTART, RLENGTH); sub(/.*& /, "", decl); alias[decl] = 1
        line = substr(line, RSTART + RLENGTH)
      }
      if (match($0, /^ *const auto& [a-z_]+ = [a-z_]+\./)) {
        decl = substr($0, RSTART, RLENGTH); sub(/^ *const auto& /, "", decl)
        name = decl; sub(/ .*/, "", name); from = decl; sub(/.* = /, "", from); sub(/\.$/, "", from)
        if (from in alias) alias[name] = 1
      }
      if (match($0, /^ *[a-z_]+(\.[a-z_]+)+ = /)) {
        rhs = " " substr($0, RSTART + RLENGTH)
        for (a in alias) if (rhs ~ ("[^A-Za-z0-9_]" a "\\.")) { n++; break }
      }
    }
    END { print n + 0 }
  ' "${mapping_files[@]}")
  if [ "$mapping_copies" -gt "$max_mapping_copies" ]; then
    echo "src/sana/train/options/:1: $mapping_copies hand-written config-to-options lines, over $max_mapping_copies (rule l: a key taken as it is is a row of a fill_from_keys table, train/options/from_keys.h)" >> "$violations"
  fi
fi
mapping_violations=$(( $(wc -l < "$violations") - before ))

# --- report -------------------------------------------------------------------------------
soft_files=$(grep -c 'soft limit of '"$soft_file_lines"':' "$warnings" || true)
soft_functions=$(grep -c 'soft limit of '"$soft_function_lines"':' "$warnings" || true)
if [ -s "$warnings" ]; then sort -t: -k1,1 -k2,2n "$warnings" | sed 's/^/warning: /' >&2; fi
total=$(wc -l < "$violations")
if [ "$total" -gt 0 ]; then
  sort -t: -k1,1 -k2,2n "$violations"
  echo "check_layout: $total violation(s): includes $include_violations, file length $file_violations," \
       "function length $function_violations, comment references $comment_violations," \
       "unbounded waits $wait_violations, ZeRO in the model $zero_violations, test variables $hook_violations," \
       "config outside its mapping $config_violations, ZeRO in the loop $loop_zero_violations," \
       "front door $front_violations, the trainer $trainer_violations, the mapping $mapping_violations" >&2
  [ -n "$ctags_note" ] && echo "check_layout: $ctags_note" >&2
  exit 1
fi
printf 'check_layout: clean (%s)\n' "$root"
printf '  %-34s %-32s %s\n' "check" "scanned" "limit / largest"
printf '  %-34s %-32s %s\n' "a. sana/ includes vs layers" "$include_count includes, ${#cxx_files[@]} files" "upward 0, sideways 0"
printf '  %-34s %-32s %s\n' "b. file length" "${#code_files[@]} files" "$max_file_lines / $longest_file_lines ($longest_file)"
printf '  %-34s %-32s %s\n' "soft limits (warnings only)" "files > $soft_file_lines, functions > $soft_function_lines" \
       "$soft_files files, $soft_functions functions"
printf '  %-34s %-32s %s\n' "d. comment references" "$reference_count paths, ${#comment_files[@]} files" "all inside the repository"
printf '  %-34s %-32s %s\n' "f. no ZeRO names in the model" "${#model_files[@]} files" "0"
printf '  %-34s %-32s %s\n' "g. SANA_TEST_ in one place" "${#code_files[@]} files" "only test_hooks.{h,cpp}; hooks read by main() alone"
printf '  %-34s %-32s %s\n' "h. the config in one place" "src/sana/train, parallel" \
       "$config_readers includes, all by the mapping and the trainer"
printf '  %-34s %-32s %s\n' "i. ZeRO outside the loop" "${#loop_files[@]} files of src/sana/train" "0"
printf '  %-34s %-32s %s\n' "j. README's first screen, docs index" "README.md, docs/design.md" \
       "commands and map in 40 lines; $pages_indexed pages indexed"
printf '  %-34s %-32s %s\n' "k. the trainer holds parts" "${#trainer_sources[@]} trainer files" \
       "$max_trainer_members / $trainer_members members; no kind, no regroup"
printf '  %-34s %-32s %s\n' "l. the config mapping is a table" "${#mapping_files[@]} files of train/options" \
       "$max_mapping_copies / $mapping_copies hand-written config-to-options lines"
printf '  %-34s %-32s %s\n' "e. bounded waits in tests/" "$waits_scanned lines, ${#test_scripts[@]} scripts" \
       "bare wait 0, untimed start 0 ($waits_marked marked '# bounded:')"
if [ -n "$ctags_note" ]; then
  printf '  %-34s %s\n' "c. function length" "SKIPPED: $ctags_note"
  exit 77
fi
printf '  %-34s %-32s %s\n' "c. function length" "$function_count functions" "$max_function_lines / $longest_function_lines ($longest_function)"
