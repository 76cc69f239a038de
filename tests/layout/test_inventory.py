#!/usr/bin/env python3
"""build.test_inventory: every Catch2 case runs under ctest, and every ctest entry that runs
a Catch2 binary runs at least one case.

Catch2's discovery hands ctest one entry per case, with the case's name as the binary's test
spec; a name the spec syntax reads otherwise (Catch2 2.13's CatchAddTests split names at `;`)
makes an entry that matches nothing, and a case that no entry runs: both pass silently. This
asks each binary itself, with each entry's own arguments, which cases that entry runs.
  test_inventory.py BUILD_DIR
Exit 0 when the inventory is whole, 1 with every gap named, 2 when ctest or a binary cannot
be asked.
"""
import concurrent.futures
import json
import os
import subprocess
import sys


def ask(cmd, timeout=120):
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return run.returncode, run.stdout, run.stderr


def case_names(binary, spec_args):
    """The cases `binary` runs for spec_args: Catch2 v2's --list-test-names-only (whose exit
    code is the count), else v3's quiet --list-tests."""
    code, out, err = ask([binary, "--list-test-names-only", *spec_args])
    if "unrecognised token" in (out + err).lower():
        code, out, err = ask([binary, "--list-tests", "--verbosity", "quiet", *spec_args])
    if code < 0:
        raise RuntimeError(f"{binary} died listing its cases (signal {-code})")
    return [line for line in out.splitlines() if line.strip()]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = sys.argv[1]
    code, out, _ = ask(["ctest", "--test-dir", build, "--show-only=json-v1"])
    if code != 0:
        print(f"test_inventory: ctest --show-only in {build} failed", file=sys.stderr)
        return 2
    entries = [t for t in json.loads(out)["tests"] if t.get("command")]
    # tests/unit/cuda_cases.sh BIN ARGS runs BIN "[cuda]" ARGS (or skips where no GPU is).
    for t in entries:
        c = t["command"]
        if len(c) >= 3 and os.path.basename(c[0]) == "bash" and c[1].endswith("/unit/cuda_cases.sh"):
            t["command"] = [c[2], "[cuda]", *c[3:]]
    # A Catch2 binary: a test executable of this build that ctest runs directly.
    catch = {os.path.basename(t["command"][0]): t["command"][0] for t in entries
             if t["command"][0].startswith(os.path.join(os.path.abspath(build), "tests"))
             and os.path.basename(t["command"][0]).endswith("_tests")}
    if not catch:
        print(f"test_inventory: no Catch2 binary among {len(entries)} ctest entries in {build}", file=sys.stderr)
        return 2
    runs = [t for t in entries if t["command"][0] in catch.values()]
    gaps = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        every = dict(zip(catch.values(), pool.map(lambda b: set(case_names(b, [])), catch.values())))
        matched = list(pool.map(lambda t: case_names(t["command"][0], t["command"][1:]), runs))
    covered = {b: set() for b in catch.values()}
    for t, cases in zip(runs, matched):
        if not cases:
            gaps.append(f"entry {t['name']!r} runs no case (its arguments: {t['command'][1:]})")
        covered[t["command"][0]].update(cases)
    for binary, cases in every.items():
        for name in sorted(cases - covered[binary]):
            gaps.append(f"case {name!r} of {os.path.basename(binary)} is run by no ctest entry")
    total = sum(len(c) for c in every.values())
    print(f"test_inventory: {len(runs)} ctest entries run {len(catch)} Catch2 binaries with {total} cases "
          f"(hidden [.] helpers aside); {len(gaps)} gaps")
    for gap in gaps:
        print("  " + gap)
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
