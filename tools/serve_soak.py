#!/usr/bin/env python3
"""Serve-mode soak: the configuration soak's random volumes, served by `afa serve` to fio.

`tools/soak.py` finds engine bugs through `afa run`, where the simulator drives the engine.
Serve mode drives the same engines from real clients, with real data in every sector, on
other code paths (the NBD server, the engines' serve front ends, the member files of
`--state`, the restart and its recovery). This tool takes soak.py's configuration of each
seed S (the same file `soak.py S 1` writes), serves it, and checks what the clients read:

1. `afa serve OUT/cS.toml --listen unix:OUT/cS.sock --pace none` (with `--state OUT/cS.d`
   for about half the seeds).
2. fio, ioengine=nbd: one pass over the whole volume of writes at random offsets and of a
   random block size (unaligned sizes included), each checked by fio's own verify
   (crc32c in every block, read back when the pass ends), ending in a FLUSH.
3. With `--state`: the server is stopped by SIGTERM or killed by SIGKILL and started again
   on the same files, and fio reads the first pass back (`verify_only`). Every write was
   acknowledged and flushed, so every one must come back.
4. A second pass overwrites the volume at another block size and queue depth (the engines'
   cleaners and GC run now) and is verified the same way.
5. qemu-io writes zeroes over a few ranges and reads them back as zeroes; then the server
   is stopped by SIGTERM, which must end it with status 0.

Read faults are taken out of the configuration: a read that fails as uncorrectable is a
legitimate answer of a faulty device, but it would fail fio's verify. Other faults stay.
So does everything else of soak.py's file but what serve mode refuses by design: the
`[precondition]`, OX payloads other than `token`, SWAN's aging, and with `--state` md's
stripe cache, in-place sub-chunk updates and two-phase or ScalaAFA members' OOB areas too
small for their tags. `raid5f` takes only whole aligned stripes, so its clients write in
stripes.

Usage:

    python3 tools/serve_soak.py [--afa PATH] [--out DIR] [--timeout-s 120] FIRST_SEED COUNT
                                [--engine NAME]

One line per seed, `S ENGINE OUTCOME detail`, with OUTCOME one of

    ok        every step passed
    panic     "panicked" in the server's stderr, or the server died by a signal it was not sent
    verify    fio's verify or qemu-io's pattern check found wrong data
    worn-out  a request failed out of space on a volume with injected program or erase
              failures, which retire blocks (plausible, as soak.py's "worn out")
    error     a client or the server failed otherwise (the detail says which step)
    refused   the server refused the configuration (soak.py's runs accept it)
    timeout   a step took longer than --timeout-s

Like soak.py, OUT keeps every configuration and every process's output for a rerun by hand.
"""

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak  # noqa: E402  (the configuration generator, shared on purpose)


class StepFailed(Exception):
    def __init__(self, outcome, detail):
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


def strip_read_faults(node):
    """Removes every read-fault probability from a configuration dict, at any depth."""
    if isinstance(node, dict):
        node.pop("read_fail_probability", None)
        for key in list(node):
            strip_read_faults(node[key])
            if node[key] == {} and key == "faults":
                del node[key]


class Server:
    """One `afa serve` process and the files it writes its output to."""

    def __init__(self, args, cfg_path, sock, state_dir, log_prefix):
        self.args = args
        self.cfg_path = cfg_path
        self.sock = sock
        self.state_dir = state_dir
        self.log_prefix = log_prefix
        self.starts = 0
        self.proc = None

    def start(self):
        self.starts += 1
        if os.path.exists(self.sock):
            os.remove(self.sock)
        cmd = [self.args.afa, "serve", self.cfg_path, "--listen", f"unix:{self.sock}",
               "--pace", "none"]
        if self.state_dir:
            cmd += ["--state", self.state_dir]
        out = open(f"{self.log_prefix}.serve{self.starts}.out", "w")
        err = open(f"{self.log_prefix}.serve{self.starts}.err", "w")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        deadline = time.monotonic() + self.args.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.check_stderr()
                text = self.stderr().strip().splitlines()
                first = text[0] if text else f"exit {self.proc.returncode}"
                outcome = "refused" if self.starts == 1 and "configuration" in first else "error"
                raise StepFailed(outcome, f"start {self.starts}: {first}")
            if os.path.exists(self.sock):
                try:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(self.sock)
                    s.close()
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        raise StepFailed("timeout", f"start {self.starts}: the socket never listened")

    def stderr(self):
        with open(f"{self.log_prefix}.serve{self.starts}.err") as f:
            return f.read()

    def check_stderr(self):
        err = self.stderr()
        if "panicked" in err:
            raise StepFailed("panic", soak.panic_detail(err))
        if self.proc.returncode is not None and self.proc.returncode < 0:
            sig = -self.proc.returncode
            if sig not in (signal.SIGKILL, signal.SIGTERM):
                raise StepFailed("panic", f"server died by signal {sig}")

    def stop(self, sig):
        """Sends `sig` and waits; a SIGTERM must end the server with status 0."""
        if self.proc.poll() is not None:
            self.check_stderr()
            raise StepFailed("error", f"server {self.starts} had exited ({self.proc.returncode}) "
                             "before it was stopped")
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=self.args.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise StepFailed("timeout", f"server {self.starts} did not stop on signal {sig}")
        self.check_stderr()
        if sig == signal.SIGTERM and self.proc.returncode != 0:
            last = self.stderr().strip().splitlines()
            raise StepFailed("error", f"server {self.starts} stopped with status "
                             f"{self.proc.returncode}: {last[-1] if last else ''}")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def run_client(args, cmd, log_path, step):
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                timeout=args.timeout_s).returncode
        except subprocess.TimeoutExpired:
            raise StepFailed("timeout", f"{step} took over {args.timeout_s:.0f} s")
    with open(log_path) as f:
        text = f.read()
    if rc != 0:
        bad = [ln for ln in text.splitlines() if "verify" in ln.lower() or "pattern" in ln.lower()
               or "bad magic" in ln.lower() or "mismatch" in ln.lower()]
        if bad:
            raise StepFailed("verify", f"{step}: {bad[0].strip()}")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        raise StepFailed("error", f"{step}: {lines[-1] if lines else f'exit {rc}'}")
    return text


def fio_job(uri, name, rw, bs, iodepth, randseed, verify_only=False):
    job = [
        "fio", f"--name={name}", "--ioengine=nbd", f"--uri={uri}", "--size=100%",
        f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}", f"--randseed={randseed}",
        "--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--end_fsync=1",
        "--output-format=normal",
    ]
    if verify_only:
        job.append("--verify_only=1")
    return job


def volume_bytes(args, uri, log_prefix):
    text = run_client(args, ["nbdinfo", "--size", uri], f"{log_prefix}.size", "nbdinfo")
    return int(text.split()[-1])


def media_can_fail(node):
    """Whether the configuration injects program or erase failures anywhere."""
    if isinstance(node, dict):
        if node.get("program_fail_probability") or node.get("erase_fail_probability"):
            return True
        return any(media_can_fail(v) for v in node.values())
    return False


def full_stripe_bytes(cfg):
    """The write unit of `raid5f`, which refuses anything but whole aligned stripes (as
    SPDK's RAID5F does), or None for every other engine."""
    array = cfg.get("array", {})
    if array.get("level") != "raid5f":
        return None
    return array["chunk_bytes"] * (array["members"] - 1)


def fit_for_serving(cfg, with_state):
    """What serve mode refuses, by design, in soak.py's run configurations: a precondition
    (its fill carries no bytes), OX without version tokens, SWAN's aging, and with `--state`
    md's stripe cache, in-place sub-chunk updates (recovery from the member files cannot
    find them) and two-phase or ScalaAFA members without room for a 14-byte OOB tag per
    sector."""
    cfg.pop("precondition", None)
    strip_read_faults(cfg)
    # A served OX device checks every read against its RBLOCK's version token.
    if "ox" in cfg:
        cfg["ox"]["payload"] = "token"
    # SWAN's aging writes data no oracle knows, so it needs payload "none", which serve mode
    # never runs (and --state would keep that data).
    swan = cfg.get("array", {}).get("swan")
    if swan:
        swan.pop("age_fraction", None)
    geometry = cfg.get("ssd", {}).get("geometry")
    array = cfg.get("array", {})
    tagged = "scalaafa" in array or "two_phase" in array
    if with_state and tagged and geometry:
        # The controller keeps 8 bytes of the area for itself.
        tags = 14 * (geometry["page_bytes"] // geometry["sector_bytes"]) + 8
        geometry["oob_bytes_per_page"] = max(geometry.get("oob_bytes_per_page", 0), tags)
    if with_state:
        # The stripe cache holds acknowledged writes in memory, which a kill -9 would lose.
        array.pop("stripe_cache_stripes", None)
        for table in array.values():
            if isinstance(table, dict) and table.get("sub_chunk_writes") == "in-place":
                table["sub_chunk_writes"] = "merge"


def one_seed(args, seed, rng, with_state, cfg, cfg_path, log_prefix):
    stripe = full_stripe_bytes(cfg)
    state_dir = f"{log_prefix}.d" if with_state else None
    if state_dir and os.path.exists(state_dir):
        shutil.rmtree(state_dir)
    sock = f"{log_prefix}.sock"
    uri = f"nbd+unix:///afa?socket={sock}"
    server = Server(args, cfg_path, sock, state_dir, log_prefix)
    steps = []
    try:
        server.start()
        size = volume_bytes(args, uri, log_prefix)
        # Block sizes that divide the volume are not needed (fio stops at the last whole
        # block); unaligned ones make the engines read-modify-write partial sectors.
        bs1 = rng.choice(["4k", "8k", "16k", "64k", "128k", "1k", "3k", "12k"])
        bs1 = stripe or bs1
        qd1 = rng.choice([1, 4, 16, 32])
        rw1 = rng.choice(["randwrite", "randwrite", "write"])
        pass1 = fio_job(uri, "pass1", rw1, bs1, qd1, seed)
        steps.append(f"pass1 {rw1} bs={bs1} qd={qd1}")
        run_client(args, pass1, f"{log_prefix}.pass1", steps[-1])

        if state_dir:
            sig = rng.choice([signal.SIGTERM, signal.SIGKILL])
            steps.append(f"restart after {signal.Signals(sig).name}")
            server.stop(sig)
            server.start()
            again = volume_bytes(args, uri, log_prefix)
            if again != size:
                raise StepFailed("error", f"the volume was {size} bytes and is {again} after "
                                 "the restart")
            steps.append("reread pass1")
            run_client(args, fio_job(uri, "pass1", rw1, bs1, qd1, seed, verify_only=True),
                       f"{log_prefix}.reread", steps[-1])

        bs2 = stripe or rng.choice(["4k", "16k", "32k", "256k", "5k", "2k"])
        qd2 = rng.choice([1, 8, 32])
        steps.append(f"pass2 randwrite bs={bs2} qd={qd2}")
        run_client(args, fio_job(uri, "pass2", "randwrite", bs2, qd2, seed + 1),
                   f"{log_prefix}.pass2", steps[-1])

        commands = []
        for _ in range(rng.randint(1, 6)):
            length = rng.choice([512, 4096, 65536, 1 << 20, rng.randint(1, 300_000)])
            length = min(length, size)
            offset = rng.randrange(0, size - length + 1)
            if stripe:
                # One stripe: qemu-io fails a longer write-zeroes on such an export itself
                # (EINVAL, with nothing sent), which would read back as a verify failure.
                length = stripe
                offset = rng.randrange(0, size // stripe - 2) * stripe
            commands += ["-c", f"write -z {offset} {length}", "-c", f"read -P 0 {offset} {length}"]
        commands += ["-c", "flush"]
        steps.append("zeroes")
        text = run_client(args, ["qemu-io", "-f", "raw", *commands, uri], f"{log_prefix}.zeroes",
                          steps[-1])
        if "Pattern verification failed" in text or "failed" in text.lower():
            bad = [ln for ln in text.splitlines() if "fail" in ln.lower()]
            raise StepFailed("verify", f"zeroes: {bad[0].strip()}")

        steps.append("stop")
        server.stop(signal.SIGTERM)
        return "ok", f"{len(steps)} steps" + (", state" if state_dir else "")
    except StepFailed as e:
        server.kill()
        try:
            server.check_stderr()
        except StepFailed as p:
            return p.outcome, f"{p.detail} (during {steps[-1] if steps else 'start'})"
        # A member that lost its spare blocks to injected program or erase failures runs out
        # of space legitimately, as in soak.py's "[worn out: plausible]".
        if e.outcome == "error" and "out of space" in server.stderr() and media_can_fail(cfg):
            return "worn-out", e.detail
        return e.outcome, e.detail
    finally:
        server.kill()
        if state_dir and os.path.exists(state_dir) and not args.keep_state:
            shutil.rmtree(state_dir)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("first_seed", type=int)
    p.add_argument("count", type=int)
    p.add_argument("--afa", default="target/release/afa")
    p.add_argument("--out", default="serve-soak-out")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--engine", default=None, help="only this engine family: "
                   + ", ".join(soak.FAMILIES))
    p.add_argument("--keep-state", action="store_true",
                   help="keep each seed's --state directory (they are as large as the volume)")
    args = p.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    for tool in ("fio", "nbdinfo", "qemu-io"):
        if shutil.which(tool) is None:
            p.error(f"{tool} is not installed (apt install fio libnbd-bin qemu-utils)")
    if args.engine and args.engine not in soak.FAMILIES:
        p.error(f"unknown engine family {args.engine!r}; one of {', '.join(soak.FAMILIES)}")
    os.makedirs(args.out, exist_ok=True)

    outcomes = Counter()
    notable = []
    t0 = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.count):
        label, cfg = soak.generate(seed, args.engine)
        cfg["seed"] = seed
        # The client side draws from its own generator, so that the configuration stays
        # soak.py's for the same seed but for what serve mode refuses.
        rng = random.Random(f"serve-{seed}")
        with_state = rng.random() < 0.5
        fit_for_serving(cfg, with_state)
        cfg_path = os.path.join(args.out, f"c{seed}.toml")
        with open(cfg_path, "w") as f:
            f.write(f"# afa serve soak: seed {seed}, engine {label} (tools/serve_soak.py)\n")
            f.write(soak.to_toml(cfg))
        start = time.monotonic()
        outcome, detail = one_seed(args, seed, rng, with_state, cfg, cfg_path, os.path.join(args.out, f"c{seed}"))
        outcomes[outcome] += 1
        if outcome != "ok":
            notable.append((seed, label, outcome, detail))
        print(f"{seed} {label} {outcome} {detail}  [{time.monotonic() - start:.1f}s]", flush=True)

    print()
    print(f"{sum(outcomes.values())} seeds in {time.monotonic() - t0:.0f} s")
    print("per outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    for seed, label, outcome, detail in notable:
        print(f"  {seed} {label} {outcome}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
