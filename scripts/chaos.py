#!/usr/bin/env python3
"""Random faults against multi-process training runs for a set time (scripts/chaos.sh).

Campaign after campaign, a `sana-train launch` run of the tiny preset on 4 processes
(dist.elastic continue, --max-restarts, a checkpoint every 20 steps, a ZeRO stage drawn
per campaign from 0-3: a lost rank's share comes from its mirror) trains to its last
step while faults strike at random moments: SIGKILL, SIGSTOP and SIGTERM of workers,
SIGKILL of rank 0 (lost like any other: the launcher hosts the store), SIGTERM and SIGKILL
of a launcher, a full disk and a read-only work_dir (on a tmpfs of its own, as root), and a
corrupted checkpoint file, followed soon by a SIGKILL of (node 0's) launcher so that a
resume meets it. A run that stops is launched again with resume_from latest.
After each campaign: the last step was reached, every sample trained exactly once per
epoch (from the per-step sample ids), every checkpoint left verifies (the corrupted ones
are found bad), no process is left. At the end a summary: faults by kind, steps redone
and time to recover per fault, the campaigns' checks, and the workers' peak RSS.

One campaign in three (as root, where network namespaces can be made) runs on two nodes:
two launchers (--nnodes 2), half the processes each, in two namespaces joined by a veth
link that is also cut (1-12 s: past dist.heartbeat_timeout_s the peers across are lost)
and slowed (capped at 2-128 Mbit/s each way for 10-30 s, packets queued up to 300 ms). A
run on two nodes is done when the group's rank 0 finishes, on whichever node it is: a node
that lost all its workers may have stopped before (node 0's launcher, the store's host,
stays up until the other node is done).

Not a test: it prints figures. `--summary-of DIR/results.json` prints an earlier run's
summary again (results.json is written after each campaign).
"""
import argparse
import collections
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS_PER_CKPT = 20
LASTING = ("disk_full", "read_only", "cut_link", "slow_link")  # faults lifted after a while


def sh(*cmd, check=False):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, check=check)


def processes(token):
    """pid -> (environment, command line) of every process whose command line has `token`."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if not any(token.encode() in c for c in cmd):
                continue
            env = dict(e.split(b"=", 1) for e in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in e)
            out[int(pid)] = ({k.decode(): v.decode() for k, v in env.items()}, [c.decode() for c in cmd])
        except OSError:
            continue
    return out


def workers(token):
    """pid -> (rank slot, join id or None) of the training workers (not the launcher)."""
    out = {}
    for pid, (env, cmd) in processes(token).items():
        if "launch" in cmd or "RANK" not in env:
            continue
        out[pid] = (int(env["RANK"]), env.get("SANA_JOIN"))
    return out


def rss_kib(pids):
    total = 0
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


class Disk:
    """The campaigns' work folder: a tmpfs of its own when root (full disk, read-only)."""

    def __init__(self, path, megabytes):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.own = os.geteuid() == 0 and sh("mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", path).returncode == 0
        self.filler = os.path.join(path, "filler")

    def fill(self):
        st = os.statvfs(self.path)
        free = st.f_bavail * st.f_frsize
        try:  # a disk the run has filled already may refuse even the file
            with open(self.filler, "wb") as f:
                f.write(b"\0" * max(free - 4096, 0))
        except OSError:
            pass

    def free(self):
        if os.path.exists(self.filler):
            os.remove(self.filler)

    def read_only(self, on):
        sh("mount", "-o", "remount," + ("ro" if on else "rw"), self.path)

    def close(self):
        self.read_only(False)
        self.free()
        if self.own:
            sh("umount", "-l", self.path)


class Network:
    """Two network namespaces joined by a veth link, each a node of a two-node run, with
    addresses of our own (198.18.0.1 and 198.18.0.2, the benchmarking range) and no route
    out. The link can be cut (one end down) and slowed: a bandwidth cap (tc tbf) whose queue
    delays each packet up to 300 ms and drops past it. (netem's fixed delay and jitter would
    be the closer fault; this machine's kernel has no sch_netem.)"""

    def __init__(self, token):
        tag = token[-8:]
        self.ns = [f"{tag}n0", f"{tag}n1"]
        self.veth = [f"{tag}v0", f"{tag}v1"]
        self.addr = ["198.18.0.1", "198.18.0.2"]
        self.ok = os.geteuid() == 0 and sh("ip", "netns", "add", self.ns[0]).returncode == 0
        if not self.ok:
            return
        steps = [("ip", "netns", "add", self.ns[1]),
                 ("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])]
        for n in (0, 1):
            steps += [("ip", "link", "set", self.veth[n], "netns", self.ns[n]),
                      ("ip", "-n", self.ns[n], "addr", "add", self.addr[n] + "/30", "dev", self.veth[n]),
                      ("ip", "-n", self.ns[n], "link", "set", "lo", "up"),
                      ("ip", "-n", self.ns[n], "link", "set", self.veth[n], "up")]
        self.ok = all(sh(*c).returncode == 0 for c in steps) and self.wait_up()

    def wait_up(self, seconds=10):
        end = time.time() + seconds
        while time.time() < end:
            if all("state UP" in sh("ip", "-n", self.ns[n], "-o", "link", "show", self.veth[n]).stdout for n in (0, 1)):
                return True
            time.sleep(0.1)
        return False

    def cut(self, on):
        sh("ip", "-n", self.ns[1], "link", "set", self.veth[1], "down" if on else "up")
        if not on:
            self.wait_up()

    def slow(self, mbit):
        """Both directions capped at `mbit` Mbit/s; None lifts it. True when tc took it."""
        ok = True
        for n in (0, 1):
            if mbit is None:
                sh("tc", "-n", self.ns[n], "qdisc", "del", "dev", self.veth[n], "root")
            else:
                ok &= sh("tc", "-n", self.ns[n], "qdisc", "replace", "dev", self.veth[n], "root", "tbf", "rate",
                         f"{mbit}mbit", "burst", "64kb", "latency", "300ms").returncode == 0
        return ok

    def close(self):
        for n in (0, 1):
            sh("ip", "netns", "del", self.ns[n])


class Campaign:
    def __init__(self, args, disk, index, token, rnd, log, net=None):
        self.args, self.disk, self.rnd, self.log = args, disk, rnd, log
        self.work = os.path.join(disk.path, f"{token}-c{index}")  # the token finds its processes
        self.keep = os.path.join(args.dir, f"c{index}")
        self.token = token
        self.faults = []       # {kind, t, step, recovered_s, redone}
        self.attempts = 0
        self.corrupted = set()  # checkpoint folders whose file we damaged
        self.peaks = []         # per attempt: the workers' summed peak RSS (KiB)
        self.step_times = {}    # global step -> wall time it was first recorded (this campaign)
        self.highest = 0
        self.zero = rnd.choice([0, 1, 2, 3])  # train.zero_stage
        self.torn = 0  # lines of the per-step sample ids cut short (a full disk)
        # One campaign in three (where namespaces can be made): two nodes, half the
        # processes each, over the link, which is cut and slowed too.
        self.net = net if net and net.ok and rnd.random() < 1 / 3 else None
        self.nodes = 2 if self.net else 1

    def command(self, node=0, port=0):
        data = os.path.join(ROOT, "build/tests/test_photos")
        if not os.path.isdir(data):
            data = "/usr/share/backgrounds/mate"
        where = [self.args.bin, "launch", "--nproc-per-node", str(self.args.nproc), "--max-restarts", "2"]
        if self.net:  # no --max-restarts: the launchers of two nodes do not restart in step (no replacements)
            where = ["ip", "netns", "exec", self.net.ns[node], self.args.bin, "launch", "--nnodes", "2", "--node-rank",
                     str(node), "--nproc-per-node", str(self.args.nproc // 2), "--master-addr", self.net.addr[0],
                     "--master-port", str(port)]
        return where + ["--",
                "--config", os.path.join(ROOT, "configs/sana_tiny_cpu.yaml"), f"--data.data_dir=[{data}]",
                "--train.visualize=false", "--train.log_interval=20", "--dist.timeout_s=20",
                "--dist.heartbeat_timeout_s=3", "--dist.elastic=continue", f"--train.max_steps={self.args.steps}",
                "--train.num_epochs=1000000",
                f"--train.save_model_steps={STEPS_PER_CKPT}", "--train.micro_batch_size=2", "--resume_from=latest",
                "--ckpt.keep_last_n=4", f"--train.zero_stage={self.zero}", f"--work_dir={self.work}"]

    def attempt_log(self, attempt, node=0):
        part = f".n{node}" if self.nodes > 1 else ""
        return os.path.join(self.args.dir, f"{os.path.basename(self.keep)}.a{attempt}{part}.log")

    def redone(self):
        """Per fault: steps trained again because of it. One the survivors went on from: the
        step it interrupted (1). One that stopped the run: the steps since the checkpoint
        the first resume after it (the launcher's own restart, or the next attempt) read."""
        resumes, regroups = [], []  # (wall time, global step) of "resumed from" and "left the run" lines
        stamp = r"\[(\d+-\d+-\d+ \d+:\d+:\d+\.\d+) "
        for a in range(1, self.attempts + 1):
            for node in range(self.nodes):
                for line in open(self.attempt_log(a, node), errors="replace"):
                    m = re.search(stamp + r".*(resumed from .* global step|left the run after step) (\d+)", line)
                    if m:
                        t = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + float("0" + m.group(1)[19:])
                        (resumes if m.group(2).startswith("resumed") else regroups).append((t, int(m.group(3))))
        # A resume or a regroup counts for the fault before it, not for an earlier one.
        times = [f["t"] for f in self.faults] + [float("inf")]
        for i, f in enumerate(self.faults):
            after = [s for t, s in sorted(resumes) if f["t"] < t < times[i + 1]]
            if after and f["kind"] != "corrupt_checkpoint":
                f["redone"] = max(f["step"] - after[0], 0)
            elif any(f["t"] < t < times[i + 1] for t, _ in regroups):
                f["redone"] = 1  # the survivors went on: the interrupted step only
            else:
                f["redone"] = 0

    def metrics_steps(self):
        path = os.path.join(self.work, "metrics.jsonl")
        steps = []
        try:
            lines = open(path).readlines()
        except OSError:
            return steps
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue  # cut short (a full disk, a kill): the rest counts
            if "step" in r:
                steps.append(r["step"])
        return steps

    def run(self, deadline):
        while self.attempts < 30:
            self.attempts += 1
            if self.attempt(deadline):
                return True
            if self.usage_error:
                self.log(f"  usage error (exit 2): see {self.attempt_log(self.attempts)}; the campaign stops")
                return False
            if time.time() > deadline + 600:
                return False
        return False

    def attempt(self, deadline):
        """One launch; faults at random moments. True when the run reached its last step."""
        env = dict(os.environ, SANA_TEST_LOG_IDS="1")
        port = self.rnd.randrange(20000, 30000)  # inside the namespaces: nothing else listens there
        outs = [open(self.attempt_log(self.attempts, node), "w") for node in range(self.nodes)]
        launchers = [subprocess.Popen(self.command(node, port), stdout=outs[node], stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True) for node in range(self.nodes)]
        started = time.time()
        next_fault = started + self.rnd.uniform(5, 20)
        peak = 0
        pending_undo = None  # (time, fn): a disk or link fault lifted after a while
        planned = None       # the next fault's kind
        corrupted_last = False  # the fault before was a corrupted checkpoint: this one makes a resume meet it
        while any(launcher.poll() is None for launcher in launchers):
            time.sleep(0.2)
            now = time.time()
            steps = self.metrics_steps()
            for s in steps:
                self.step_times.setdefault(s, now)
            if steps:
                self.highest = max(self.highest, steps[-1])
            pids = list(workers(self.token))
            peak = max(peak, rss_kib(pids))
            # Recovered: the second step after the fault's is done (a stop request still
            # finishes the first one before it stops).
            for f in self.faults:
                if f["recovered_s"] is None and steps and max(steps) > f["step"] + 1 and self.step_times.get(max(steps), 0) > f["t"]:
                    f["recovered_s"] = now - f["t"]
            if pending_undo and now > pending_undo[0]:
                pending_undo[1]()
                pending_undo = None
            if planned is None:
                planned = self.rnd.choice(self.kinds())
            if pending_undo and planned in LASTING:
                planned = None  # one lasting fault at a time: the first is lifted before another strikes
                continue
            # A disk fault strikes during a save: in the step before a checkpoint is due.
            due = planned not in ("disk_full", "read_only") or (steps and steps[-1] % STEPS_PER_CKPT == STEPS_PER_CKPT - 1)
            if now > next_fault and due and time.time() < deadline and steps and steps[-1] < self.args.steps - 2:
                count = len(self.faults)
                follow_up = planned == "kill_launcher" and corrupted_last  # node 0's: it ends the run
                target = launchers[0] if follow_up else self.rnd.choice(launchers)
                pending_undo = self.strike(planned, target, steps[-1]) or pending_undo
                corrupted_last = False
                next_fault = now + self.rnd.uniform(5, 20)
                if planned == "corrupt_checkpoint" and len(self.faults) > count:
                    # Soon a restart, before the next save: its resume must pass over the damage.
                    # (Rank 0's loss no longer restarts the run: the survivors go on.)
                    planned = "kill_launcher"
                    corrupted_last = True
                    next_fault = now + self.rnd.uniform(0.5, 2)
                else:
                    planned = None
            if now - started > 900:  # bounded: a stuck attempt is a finding
                self.log(f"  attempt {self.attempts}: still running after 900 s; killing it")
                for launcher in launchers:
                    if launcher.poll() is None:  # a node that finished has nothing left to kill
                        os.killpg(launcher.pid, signal.SIGKILL)
        for launcher in launchers:
            launcher.wait(timeout=60)
        if pending_undo:
            pending_undo[1]()
        for out in outs:
            out.close()
        self.peaks.append(peak)
        orphans = self.wait_gone(15)
        if orphans:
            self.log(f"  attempt {self.attempts}: {len(orphans)} process(es) left: {orphans}; killing them")
            for pid in orphans:
                os.kill(pid, signal.SIGKILL)
        self.orphans = getattr(self, "orphans", 0) + len(orphans)
        # The ids of this attempt apart: a later attempt redoes the steps after its checkpoint.
        folder = os.path.join(self.work, f"ids.a{self.attempts}")
        os.makedirs(folder, exist_ok=True)
        for path in glob.glob(os.path.join(self.work, "ids.rank*.log")):
            shutil.move(path, folder)
        steps = self.metrics_steps()
        codes = [launcher.returncode for launcher in launchers]
        self.usage_error = all(c == 2 for c in codes) and not steps
        # The group's rank 0 finishes the run, on whichever node it is by then; a node whose
        # workers were all lost (the link cut, a launcher killed) stopped before.
        done = 0 in codes and steps and max(steps) >= self.args.steps and self.finished()
        self.log(f"  attempt {self.attempts}: exit {'/'.join(map(str, codes))}, reached step {max(steps) if steps else 0}"
                 f"{' (done)' if done else ''}")
        return done

    def finished(self):
        return any("parameters identical on all" in open(self.attempt_log(self.attempts, node), errors="replace").read()
                   for node in range(self.nodes))

    def wait_gone(self, seconds):
        end = time.time() + seconds
        while time.time() < end:
            left = list(processes(self.token))
            if not left:
                return []
            time.sleep(0.2)
        return list(processes(self.token))

    def kinds(self):
        kinds = ["kill_worker", "stop_worker", "term_worker", "kill_rank0", "term_launcher", "kill_launcher",
                 "corrupt_checkpoint"]
        kinds += (["disk_full", "read_only"] if self.disk.own else []) + (["cut_link", "slow_link"] if self.net else [])
        return [k for k in kinds if not self.args.kinds or k in self.args.kinds.split(",")] or kinds

    def strike(self, kind, launcher, step):
        """Applies fault `kind`; returns (when, undo) for a disk fault."""
        ws = workers(self.token)
        others = [pid for pid, (slot, join) in ws.items() if slot != 0 or join is not None]
        rank0 = [pid for pid, (slot, join) in ws.items() if slot == 0 and join is None]
        fault = {"kind": kind, "t": time.time(), "step": step, "recovered_s": None, "attempt": self.attempts,
                 "zero": self.zero}
        undo = None
        if kind in ("kill_worker", "stop_worker", "term_worker") and others:
            os.kill(self.rnd.choice(others), {"kill_worker": signal.SIGKILL, "stop_worker": signal.SIGSTOP,
                                              "term_worker": signal.SIGTERM}[kind])
        elif kind == "kill_rank0" and rank0:
            os.kill(rank0[0], signal.SIGKILL)
        elif kind == "term_launcher":
            os.kill(launcher.pid, signal.SIGTERM)
        elif kind == "kill_launcher":
            os.kill(launcher.pid, signal.SIGKILL)
        elif kind == "corrupt_checkpoint":
            folders = sorted(glob.glob(os.path.join(self.work, "checkpoints", "step_*")))
            files = glob.glob(os.path.join(folders[-1], "*.safetensors")) if folders else []
            if not files:
                return None
            path = self.rnd.choice(files)
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) // 2)
                f.write(b"\xff\x00\xff\x00")
            self.corrupted.add(folders[-1])
            fault["recovered_s"] = 0.0  # nothing stops: found at the next resume, or by the final check
        elif kind == "disk_full":
            self.disk.fill()
            undo = (time.time() + self.rnd.uniform(5, 15), self.disk.free)
        elif kind == "read_only":
            self.disk.read_only(True)
            undo = (time.time() + self.rnd.uniform(5, 15), lambda: self.disk.read_only(False))
        elif kind == "cut_link":  # past dist.heartbeat_timeout_s or not: the peers across are lost, or wait
            self.net.cut(True)
            undo = (time.time() + self.rnd.uniform(1, 12), lambda: self.net.cut(False))
        elif kind == "slow_link":
            fault["mbit"] = self.rnd.choice([2, 8, 32, 128])
            if not self.net.slow(fault["mbit"]):
                return None
            undo = (time.time() + self.rnd.uniform(10, 30), lambda: self.net.slow(None))
        else:
            return None
        self.log(f"  fault {kind} at step {step}")
        self.faults.append(fault)
        return undo

    def check(self):
        """The campaign's checks: samples once per epoch, checkpoints, and the redone steps."""
        self.redone()
        # Per attempt, a step logged by several world sizes took the smallest: the larger
        # one's lines are a step a loss interrupted. A later attempt's steps replace an
        # earlier one's (it resumed before them).
        final = {}
        for a in range(1, self.attempts + 1):
            by_world = {}
            for path in glob.glob(os.path.join(self.work, f"ids.a{a}", "ids.rank*.w*.log")):
                w = int(re.search(r"\.w(\d+)\.log$", path).group(1))
                # One line per micro-batch. A step this rank logged again (the launcher
                # restarted the run) shows as a line whose samples the step already had:
                # the last time counts.
                mine, key = {}, None
                for line in open(path, errors="replace"):
                    fields = line.split()
                    if len(fields) < 3 or not all(f.isdigit() for f in fields):
                        self.torn += 1  # written whole or not at all only while the disk has room
                        continue
                    e, s, *ids = map(int, fields)
                    if (e, s) == key and not set(ids) & set(mine[key]):
                        mine[key] += ids
                    else:
                        key = (e, s)
                        mine[key] = list(ids)
                for key, ids in mine.items():
                    by_world.setdefault(w, {}).setdefault(key, []).extend(ids)
            mine = {}
            for w in sorted(by_world, reverse=True):
                mine.update(by_world[w])
            if mine:
                first = min(mine)
                final = {k: v for k, v in final.items() if k < first}
            final.update(mine)
        epochs = {}
        for (e, _), ids in final.items():
            epochs.setdefault(e, []).extend(ids)
        sizes = sorted({len(v) for v in epochs.values()})
        # Each sample at most once in an epoch, and every epoch but the last (max_steps may
        # end it early) as full as the fullest.
        once = all(len(v) == len(set(v)) for v in epochs.values()) and all(
            len(v) == max(sizes) for e, v in epochs.items() if e != max(epochs))
        full = [e for e, v in epochs.items() if len(v) == max(sizes)] if sizes else []
        verified, bad, caught = 0, [], 0
        for folder in sorted(glob.glob(os.path.join(self.work, "checkpoints", "step_*"))):
            ok = sh(self.args.bin, "inspect", folder).returncode == 0
            if folder in self.corrupted:
                caught += not ok
            elif ok:
                verified += 1
            else:
                bad.append(os.path.basename(folder))
        # A resume that found the latest checkpoint damaged (ours) and took the one before.
        skipped = sum(len(re.findall(r"r0/\d+ W\] resume_from latest: skipping", open(self.attempt_log(a, n),
                                                                                   errors="replace").read()))
                      for a in range(1, self.attempts + 1) for n in range(self.nodes))
        return {"epochs": len(epochs), "samples_once": once, "epoch_sizes": sizes, "full_epochs": len(full),
                "damaged_skipped_at_resume": skipped,
                "checkpoints_verified": verified, "checkpoints_bad": bad,
                "corrupted_found": caught, "corrupted_left": sum(os.path.isdir(c) for c in self.corrupted)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--dir", default="/tmp/sana-chaos")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=600, help="steps per campaign")
    p.add_argument("--kinds", help="only these fault kinds, comma-separated (e.g. corrupt_checkpoint,stop_worker)")
    p.add_argument("--no-nodes", dest="nodes", action="store_false",
                   help="no two-node campaigns (network namespaces, link cuts and delays)")
    p.add_argument("--bin", default=os.environ.get("SANA_TRAIN_BIN", os.path.join(ROOT, "build/apps/sana-train")))
    p.add_argument("--summary-of", metavar="RESULTS_JSON",
                   help="print the summary of an earlier run's results.json (written after each campaign) and exit")
    args = p.parse_args()
    if args.summary_of:
        results = json.load(open(args.summary_of))
        summarize(results, None, print)
        return
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"chaos: no sana-train at {args.bin}: build it first (scripts/build.sh) or pass --bin")
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    rnd = random.Random(args.seed)
    # SIGTERM (timeout, a person's kill) ends as Ctrl-C does: the tmpfs and namespaces go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    journal = open(os.path.join(args.dir, "chaos.log"), "w")

    def log(line):
        print(line, flush=True)
        journal.write(line + "\n")
        journal.flush()

    disk = Disk(os.path.join(args.dir, "work"), 96)
    token = f"chaos{os.getpid()}"
    net = Network(token) if args.nodes else None
    log(f"chaos: {args.minutes:g} min, seed {args.seed}, {args.nproc} processes, {args.steps} steps per campaign, "
        f"work on {'a tmpfs of its own' if disk.own else 'the disk (not root: no full-disk or read-only faults)'}, "
        f"{'one campaign in three on two nodes (network namespaces)' if net and net.ok else 'one node (no namespaces)'}")
    start = time.time()
    deadline = start + args.minutes * 60
    results = []
    try:
        index = 0
        while time.time() < deadline:
            index += 1
            c = Campaign(args, disk, index, token, rnd, log, net)
            log(f"campaign {index} (train.zero_stage {c.zero}{', two nodes' if c.nodes > 1 else ''})")
            reached = c.run(deadline)
            r = c.check()
            r.update(reached=reached, attempts=c.attempts, faults=c.faults, peaks=c.peaks, zero=c.zero, nodes=c.nodes,
                     orphans=getattr(c, "orphans", 0))
            log(f"  reached the last step {reached}; {r['epochs']} epochs, samples once per epoch {r['samples_once']} "
                f"(epoch sizes {r['epoch_sizes']}); checkpoints verified {r['checkpoints_verified']}, bad "
                f"{r['checkpoints_bad']}, corrupted found {r['corrupted_found']}; orphans {r['orphans']}; "
                f"peak RSS per attempt (MiB) {[round(k / 1024) for k in c.peaks]}")
            r["torn_id_lines"] = c.torn
            results.append(r)
            with open(os.path.join(args.dir, "results.json"), "w") as f:  # a crash keeps what was measured
                json.dump(results, f)
            if os.path.isdir(c.work):
                shutil.copytree(c.work, c.keep, ignore=shutil.ignore_patterns("*.safetensors", "index", "tensorboard"),
                                dirs_exist_ok=True)
                shutil.rmtree(c.work, ignore_errors=True)
    finally:
        for pid in processes(token):  # stopped midway: nothing of ours stays
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        disk.close()
        if net and net.ok:
            net.close()
    summarize(results, time.time() - start, log)
    ok = all(r["reached"] and r["samples_once"] and not r["checkpoints_bad"] and not r["orphans"] for r in results)
    sys.exit(0 if ok and results else 1)


def summarize(results, seconds, log):
    faults = [f for r in results for f in r["faults"]]
    took = f" in {seconds / 60:.1f} min" if seconds is not None else ""
    log(f"\nsummary: {len(results)} campaigns{took}, {len(faults)} faults")
    kinds = sorted({f["kind"] for f in faults})
    log("| fault | applied | recovered | time to recover, s (median / max) | steps redone (mean / max) |")
    log("|---|---|---|---|---|")
    for k in kinds:
        mine = [f for f in faults if f["kind"] == k]
        rec = sorted(f["recovered_s"] for f in mine if f["recovered_s"] is not None)
        med = rec[len(rec) // 2] if rec else float("nan")
        redo = [f.get("redone", 0) for f in mine]
        log(f"| {k} | {len(mine)} | {len(rec)} | {med:.1f} / {max(rec) if rec else float('nan'):.1f} | "
            f"{sum(redo) / len(redo):.1f} / {max(redo)} |")
    sharded = [f for f in faults if f["zero"] > 0 and f["kind"] in ("kill_worker", "stop_worker")]
    rec = sorted(f["recovered_s"] for f in sharded if f["recovered_s"] is not None)
    if sharded:
        log(f"workers killed or stopped under ZeRO 1-3: {len(sharded)}, recovered {len(rec)}, time to recover "
            f"median {rec[len(rec) // 2] if rec else float('nan'):.1f} s, steps redone mean "
            f"{sum(f.get('redone', 0) for f in sharded) / len(sharded):.1f}")
    log(f"campaigns that reached their last step: {sum(r['reached'] for r in results)} of {len(results)} "
        f"(by train.zero_stage: {dict(sorted(collections.Counter(r['zero'] for r in results).items()))}; "
        f"on two nodes: {sum(r.get('nodes', 1) > 1 for r in results)})")
    log(f"samples once per epoch: {sum(r['samples_once'] for r in results)} of {len(results)} campaigns")
    log(f"checkpoints verified: {sum(r['checkpoints_verified'] for r in results)}, bad "
        f"{sum(len(r['checkpoints_bad']) for r in results)}; corrupted by us and found bad at the end "
        f"{sum(r['corrupted_found'] for r in results)}, passed over by a resume "
        f"{sum(r.get('damaged_skipped_at_resume', 0) for r in results)}, the rest rotated away")
    log(f"orphan processes: {sum(r['orphans'] for r in results)}")
    peaks = [p for r in results for p in r["peaks"] if p]
    if peaks:
        log(f"workers' peak RSS per attempt: first {peaks[0] / 1024:.0f} MiB, last {peaks[-1] / 1024:.0f} MiB, "
            f"highest {max(peaks) / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
