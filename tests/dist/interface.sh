#!/usr/bin/env bash
# The network interface for Gloo comes from dist.socket_ifname or GLOO_SOCKET_IFNAME; one
# that does not exist is a usage error naming it and the key, not a Gloo assertion.
. "$(dirname "$0")/lib.sh"
out=$SCRATCH/lo.log
timeout 60 "$BIN" launch --nproc-per-node 2 -- check-dist --dist.timeout_s=30 \
  --dist.socket_ifname=lo --work_dir="$SCRATCH/$TOKEN" > "$out" 2>&1
assert_code $? 0 "dist.socket_ifname=lo"
out=$SCRATCH/env.log
GLOO_SOCKET_IFNAME=lo timeout 60 "$BIN" launch --nproc-per-node 2 -- check-dist \
  --dist.timeout_s=30 --work_dir="$SCRATCH/$TOKEN" > "$out" 2>&1
assert_code $? 0 "GLOO_SOCKET_IFNAME=lo"
out=$SCRATCH/bad.log
timeout 60 "$BIN" launch --nproc-per-node 2 -- check-dist --dist.timeout_s=30 \
  --dist.socket_ifname=nosuchif0 --work_dir="$SCRATCH/$TOKEN" > "$out" 2>&1
assert_code $? 2 "a missing interface"
assert_contains "$out" "network interface 'nosuchif0' (from dist.socket_ifname) has no address on this host" "the error names the interface and the key"
assert_no_leftovers
finish
