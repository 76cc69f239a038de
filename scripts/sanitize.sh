#!/usr/bin/env bash
# Sanitizer builds and runs, for a person (each is another full build, ~25 min here, so CI
# does not run them; the fuzz targets in CI are built with ASan and UBSan):
#   address  ASan + UBSan build of everything into build-asan/: both unit-test binaries,
#            then a 2-process `sana-train launch` training run on the example photos with
#            previews and checkpoints, then a resume from its checkpoint;
#   thread   TSan build into build-tsan/: the threaded parts, the loader (decode workers,
#            prefetch, stop mid-epoch), the background checkpoint writer, the run's store
#            (server thread and client deadlines) and the flight recorder.
#   bash scripts/sanitize.sh [address|thread|all]      (default all; after install_deps.sh)
# Only our code is instrumented; LibTorch, OpenCV and the rest are Debian's. Suppressions
# (tests/sanitize/*.supp) name third-party code only, each with its reason. Every report
# goes to a file (log_path), so a finding is counted even when a test tolerates the exit:
# the table at the end gives the runs, their exit codes and the reports found.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kinds=("${1:-all}")
[ "${kinds[0]}" = all ] && kinds=(address thread)
supp=$root/tests/sanitize
data=$root/data/example
[ -d "$data" ] || bash "$root/scripts/prepare_example_data.sh" > /dev/null
status=0
rows=()

build() {  # KIND TARGET...: build-asan/ or build-tsan/
  local kind=$1 dir
  case $kind in address) dir=$root/build-asan ;; thread) dir=$root/build-tsan ;; esac
  shift
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    local generator=()
    command -v ninja > /dev/null && generator=(-G Ninja)
    # -O1 -g1: quicker to build than -O2 -g, and reports still have file:line.
    cmake -S "$root" -B "$dir" "${generator[@]}" -DSANA_SANITIZE="$kind" -DSANA_BUILD_TESTS=ON \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" > "$dir.configure.log" 2>&1 ||
      { cat "$dir.configure.log"; exit 1; }
  fi
  local t0=$SECONDS
  echo "sanitize: building $kind into $dir ..."
  cmake --build "$dir" -j "${SANA_BUILD_JOBS:-2}" --target "$@" > "$dir/build.log" 2>&1 ||
    { tail -40 "$dir/build.log"; exit 1; }
  echo "sanitize: $kind built in $((SECONDS - t0)) s"
  BUILD=$dir
}

# run NAME TIMEOUT COMMAND...: runs it with the reports going to $LOGS/NAME.*; adds a row.
run() {
  local name=$1 secs=$2
  shift 2
  local t0=$SECONDS rc
  rm -f "$LOGS/$name".*
  ASAN_OPTIONS="$ASAN_BASE:log_path=$LOGS/$name.asan" UBSAN_OPTIONS="$UBSAN_BASE:log_path=$LOGS/$name.ubsan" \
    TSAN_OPTIONS="$TSAN_BASE:log_path=$LOGS/$name.tsan" timeout -k 10 "$secs" "$@" > "$LOGS/$name.out" 2>&1
  rc=$?
  local reports
  reports=$(find "$LOGS" -maxdepth 1 -name "$name.[atu]san.*" | wc -l)
  local summary
  summary=$(cat "$LOGS/$name".[atu]san.* 2>/dev/null | grep -hE '^SUMMARY:' | sort | uniq -c | sort -rn | head -5 |
            sed 's/^ *//' | tr '\n' ';')
  rows+=("$(printf '| %s | %s | %s s | %s | %s |' "$name" "$rc" "$((SECONDS - t0))" "$reports" "${summary:--}")")
  if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
    status=1
    echo "sanitize: $name: exit $rc, $reports report(s); output in $LOGS/$name.out"
    cat "$LOGS/$name".[atu]san.* 2>/dev/null | head -60
    tail -20 "$LOGS/$name.out"
  else
    echo "sanitize: $name: clean ($((SECONDS - t0)) s)"
  fi
}

for kind in "${kinds[@]}"; do
  case $kind in
    address)
      build address sana-train sana_unit_tests sana_torch_tests
      LOGS=$BUILD/sanitize-logs
      mkdir -p "$LOGS"
      # Leaks: LeakSanitizer, with lsan.supp for LibTorch's and OpenMP's own.
      # Uninstrumented libraries may throw through our frames: no container-overflow checks
      # (they need every library instrumented).
      ASAN_BASE="detect_leaks=1:detect_container_overflow=0:abort_on_error=0:halt_on_error=1"
      export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
      UBSAN_BASE="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
      TSAN_BASE=""
      export SANA_TRAIN_BIN=$BUILD/apps/sana-train
      run asan.unit 900 "$BUILD/tests/sana_unit_tests"
      # Hidden ones ([.reference]: Python) skipped, and [text]: SentencePiece's module needs
      # RTLD_DEEPBIND (model/spm_shim.cpp), which ASan refuses.
      run asan.torch_unit 2400 "$BUILD/tests/sana_torch_tests" "~[text]"
      work=$(mktemp -d /tmp/sana-asan-XXXXXX)
      common=(--config "$root/configs/sana_tiny_cpu.yaml" "--data.data_dir=[$data]" "--work_dir=$work/run"
              --train.log_interval=5 --train.eval_sampling_steps=10 --train.preview_steps=4
              --train.save_model_steps=10 --dist.timeout_s=300)
      run asan.train_2proc 900 "$BUILD/apps/sana-train" launch --nproc-per-node 2 -- "${common[@]}" --train.max_steps=20
      run asan.resume_2proc 900 "$BUILD/apps/sana-train" launch --nproc-per-node 2 -- "${common[@]}" \
        --train.max_steps=30 --resume_from=latest
      rm -rf "$work"
      ;;
    thread)
      build thread sana_unit_tests sana_torch_tests
      LOGS=$BUILD/sanitize-logs
      mkdir -p "$LOGS"
      ASAN_BASE=""
      UBSAN_BASE=""
      TSAN_BASE="halt_on_error=0:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
      # LibTorch's intra-op pool is OpenMP (libgomp, not instrumented: TSan cannot see its
      # barriers), so the tensor maths runs on the calling thread; our threads stay threads.
      export OMP_NUM_THREADS=1
      export SANA_TRAIN_BIN=$BUILD/apps/sana-train
      # -#: Catch2's file-name tags ([#test_store] = tests/unit/distributed/test_store.cpp).
      run tsan.loader 1200 "$BUILD/tests/sana_torch_tests" "[loader],[features]"
      run tsan.checkpoint_writer 1200 "$BUILD/tests/sana_torch_tests" "[ckpt],[checkpointer]"
      run tsan.store 900 "$BUILD/tests/sana_unit_tests" -# "[#test_store],[#test_flight_recorder]"
      run tsan.watched_store 900 "$BUILD/tests/sana_torch_tests" -# "[#test_watched_store]"
      ;;
    *) echo "usage: sanitize.sh [address|thread|all]"; exit 2 ;;
  esac
done
echo
echo "| run | exit | time | reports | summary |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $status
