#!/usr/bin/env bash
# Who may connect to a run's store. During a 2-process soak under `sana-train launch`:
#   - clients without the run's token try to read and change its keys (LibTorch's own
#     TCPStore client marking the run failed, a wrong token, a request before hello, half
#     a request left hanging, a silent connection, an oversized frame); none gets a key,
#     the run finishes with exit 0, and rank 0 says it refused them;
#   - every listening socket of the workers (store and Gloo) is on loopback;
#   - (part other_address, ctest dist.foreign_client_other_address) the store's port does
#     not answer on this host's first non-loopback IPv4 address; skipped (77) on a host
#     that has none.
#   bash tests/dist/foreign_client.sh [clients | other_address]
. "$(dirname "$0")/lib.sh"
part=${1:-clients}
other=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$' | grep -v '^127\.' | head -1)
[ "$part" = other_address ] && [ -z "$other" ] && skip "this host has no non-loopback IPv4 address to try the port on"
out=$SCRATCH/launch.log
timeout 120 "$BIN" launch --nproc-per-node 2 -- check-dist --seconds 12 --dist.timeout_s=20 \
  --work_dir="$SCRATCH/$TOKEN" > "$out" 2>&1 &
launcher=$!
wait_for_line "$out" "soak: all-reducing" 60 || fail "the soak did not start"
rank0=$(pid_of_rank 0) || fail "rank 0 not found"
port=$(tr '\0' '\n' < "/proc/$rank0/environ" | sed -n 's/^MASTER_PORT=//p')
echo "rank 0 (pid $rank0) hosts the store on port $port"

# Every listening TCP socket of the workers, as "address:port" (from /proc: no ss needed).
listening=$(timeout 120 "$SANA_PYTHON" - $(pgrep -f "$TOKEN") <<'EOF'
import os, socket, sys
inodes = set()
for pid in sys.argv[1:]:
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
            continue
        addr, port = f[1].split(":")
        raw = bytes.fromhex(addr)
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word in host order
        host = socket.inet_ntop(family, raw)
        print(f"{host}:{int(port, 16)}" if family == socket.AF_INET else f"[{host}]:{int(port, 16)}")
EOF
)
listening=$(echo "$listening" | sort -u)
echo "listening: $(echo $listening)"
if [ -z "$listening" ]; then
  fail "no listening socket of the workers found"
elif echo "$listening" | grep -qvE '^(127\.[0-9.]+|\[::1\]|\[::ffff:127\.[0-9.]+\]):[0-9]+$'; then
  fail "a worker listens beyond loopback on a single-host run: $(echo $listening)"
else
  pass "every listening socket of the workers is on loopback (store and Gloo)"
fi
if [ "$part" = other_address ]; then
  if timeout 5 "$SANA_PYTHON" -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)' \
      "$other" "$port" 2>/dev/null; then
    fail "the store's port accepts a connection on $other"
  else
    pass "the store's port refuses a connection on this host's address $other"
  fi
  code_of "$launcher" 60; assert_code "$CODE" 0 "the run"
  assert_no_leftovers
  finish
fi

# Raw foreign clients; each prints what the store did with it.
timeout 60 "$SANA_PYTHON" - "$port" > "$SCRATCH/raw.log" 2>&1 <<'EOF' &
import socket, struct, sys, time
port = int(sys.argv[1])

def conn():
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.settimeout(5)
    return s

def field(b):
    return struct.pack("<I", len(b)) + b

def frame(body):
    return struct.pack("<I", len(body)) + body

def closed(s):
    try:
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return True, data
            data += chunk
    except socket.timeout:
        return False, data

silent = conn()  # says nothing for the whole run
half = conn(); half.sendall(struct.pack("<I", 500) + b"\x01\x00")  # half a hello, then nothing
cases = {
    "wrong token": frame(b"\x01" + field(b"sana-store/2") + field(b"guessed-token")),
    "set before hello": frame(b"\x02" + field(b"sana/failed") + field(b"stop")),
    "oversized frame": struct.pack("<I", 1 << 30) + b"\x02",
    "garbage": b"GET / HTTP/1.0\r\n\r\n",
}
for name, data in cases.items():
    s = conn(); s.sendall(data)
    done, reply = closed(s)
    print(f"{name}: {'closed' if done else 'left open'} reply={reply[9:].decode(errors='replace')!r}")
time.sleep(2)  # keep the silent and half connections open while the run goes on
EOF
raw=$!
# LibTorch's own client, as any PyTorch tool would connect: it must get nothing.
timeout 60 "$SANA_PYTHON" - "$port" > "$SCRATCH/tcpstore.log" 2>&1 <<'EOF'
import sys, datetime
import torch.distributed as dist
kwargs = dict(is_master=False, timeout=datetime.timedelta(seconds=3))
if "use_libuv" in (dist.TCPStore.__init__.__doc__ or ""):
    kwargs["use_libuv"] = False  # LibTorch 2.2+ asks for libuv by default; Debian builds it without
try:
    s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), **kwargs)
    s.set("sana/failed", "a foreign client says stop")  # sent without waiting for an answer
    print("TCPStore: read back", s.get("sana/failed"))
except Exception as e:
    print("TCPStore: refused:", str(e).splitlines()[0])
EOF
cat "$SCRATCH/tcpstore.log"
if grep -q "refused" "$SCRATCH/tcpstore.log"; then pass "LibTorch's TCPStore client can neither set nor read a key"; else fail "LibTorch's TCPStore client was served"; fi
code_of "$raw" 60
cat "$SCRATCH/raw.log"
for c in "wrong token" "set before hello" "oversized frame" "garbage"; do
  assert_contains "$SCRATCH/raw.log" "$c: closed" "the store closes a foreign connection ($c)"
done
code_of "$launcher" 60; assert_code "$CODE" 0 "the run with foreign clients around it"
assert_contains "$out" "all correct" "the soak's all-reduces stayed correct"
assert_contains "$out" "the run's store refused a connection from 127.0.0.1" "rank 0 says it refused foreign clients"
if grep -q "stopping" "$out"; then fail "a foreign client disturbed the run"; cat "$out"; fi
assert_no_leftovers
finish
