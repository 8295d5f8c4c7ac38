#!/usr/bin/env python3
"""Configuration soak for `afa run`: random but valid configurations, every engine.

For each soak seed S this tool builds one run configuration from `random.Random(S)` alone
(so the same seed always gives the same file), writes it to OUT/cS.toml, runs

    afa run OUT/cS.toml --seed S --json OUT/cS.json --quiet

and classifies what happened. It exists to find engine bugs (panics, integrity mismatches,
hangs, wrong errors) rather than to measure anything, so every configuration is small: small
devices, short jobs, a few seconds of host time at most with the dev binary.

Usage:

    python3 tools/soak.py [--afa PATH] [--out DIR] [--timeout-s 60] FIRST_SEED COUNT
                          [--engine NAME]

    --afa PATH       the `afa` binary (default target/release/afa: `cargo build --release`)
    --out DIR        where cS.toml, cS.json and cS.stderr go (default soak-out)
    --timeout-s N    a run still going after N seconds is killed and counted as `timeout`
    --engine NAME    only this engine family (`ssd`, `raid5`, `swan`, `scala-co`, ...: the
                     list below) or one label (`swan/raid4`, `two-phase/raid6`). The
                     family is still drawn first and then overridden, so a seed that draws
                     that family anyway gives the same file with or without the option; a
                     label is found by drawing from seeds derived from S until it comes up

Engines covered (the printed ENGINE column is a label: the family, and for the engines that
run over an md-style layout, that layout): one generic SSD (`ssd`), the md-style levels
`raid0`, `raid1`, `raid10`, `raid4`, `raid5`, `raid6` and `raid5f`, Log-RAID over raid0,
raid4 or raid5 (`log-raid/...`), the FusionRAID-style two-phase engine (`two-phase/raid5` is
m = 1, `two-phase/raid6` m = 2), ScalaAFA and its ablations (`scalaafa/...`, `scala-co/...`,
`scala-wr/...`), SWAN with RAID 0, RAID 4 or RAID 5 R-groups (`swan/...`), one WAFLASH SSD
(`waflash`) and one OX SSD behind OXBlock (`ox`).

One line is printed per seed:

    S ENGINE OUTCOME detail

with OUTCOME one of

    ok               exit 0 and the report's integrity.mismatches is 0
    mismatch         a read came back wrong (integrity.mismatches > 0, exit 2)
    panic            exit 101, "panicked" on stderr, or death by a signal; the detail is the
                     panic's location and message
    timeout          killed after --timeout-s seconds
    config-rejected  the binary refused the configuration as invalid: a bug of this
                     generator (or a validation rule that is too strict), not of an engine
    error            any other non-zero exit; the detail is the first line of stderr. A
                     device out of space on a tiny, worn device is expected now and then;
                     anything else deserves a look

An ok line may carry a note of reads that failed as uncorrectable and member reads an
array corrected: with read faults on, jobs run with `continue_on_error=read`, since a
correction can meet a second failure in the same stripe (a double fault, legitimate).
An out-of-space error on a device that lost at least four blocks to injected faults is
marked "[worn out: plausible]" in the summary. A timeout line names the engine functions
the run was in (two gdb backtraces, when gdb is installed, are kept in OUT/cS.stack), which
tells a loop inside one command from a run that is merely slow.

At the end come the counts per outcome and per engine, and every line that was not ok. The
out directory keeps every configuration, report and stderr, so a seed can be rerun by hand:

    target/release/afa run soak-out/c17.toml --seed 17 --json /tmp/r.json

The generator follows docs/configuration.md: it computes each SSD's capacity the way the
"Capacity" section does, so that over-provisioning always covers the GC reserve, and mirrors
the engines' own shape checks (ScalaAFA's vertical heroes, SWAN's and Log-RAID's segments and
summaries, OX's reserved EBLOCKs, WAFLASH's buffer and spare space) so that few
configurations are rejected.
"""

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict

KIB = 1024
MIB = 1024 * 1024

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE_DIR = os.path.join(REPO, "workload", "tests", "fixtures")

# Engine families and how often each is drawn. The single SSD, WAFLASH and OX get a little
# more weight because they have the most options of their own.
ENGINES = [
    ("ssd", 2.0),
    ("raid0", 1.0),
    ("raid1", 0.8),
    ("raid10", 0.8),
    ("raid4", 0.8),
    ("raid5", 1.0),
    ("raid6", 1.0),
    ("raid5f", 0.8),
    ("log-raid", 1.2),
    ("two-phase", 1.2),
    ("scalaafa", 1.0),
    ("scala-co", 0.8),
    ("scala-wr", 0.8),
    ("swan", 1.4),
    ("waflash", 1.5),
    ("ox", 1.5),
]
FAMILIES = [name for name, _ in ENGINES]

# Faults are kept small: the point is to exercise the fault paths, not to wear a tiny device
# out within one run (which would only produce "out of space" errors).
FAULT_PROBABILITIES = [0.0001, 0.0002, 0.0005, 0.001, 0.002]
# A failed program retires its whole block at the next GC, so one failure per 1/p programs
# costs a block: on devices of a few hundred blocks even 0.002 retires most of the spare
# within one run. Program failures are drawn lower for that reason.
PROGRAM_FAULT_PROBABILITIES = [0.00001, 0.00002, 0.00005, 0.0001]
# The same holds, less sharply, for erases (a failed erase leaves its block bad).
ERASE_FAULT_PROBABILITIES = [0.0001, 0.0002, 0.0005, 0.001]


# ---------------------------------------------------------------------------------------
# TOML output
# ---------------------------------------------------------------------------------------


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(v)
        return r if ("." in r or "e" in r or "inf" in r or "nan" in r) else r + ".0"
    if isinstance(v, str):
        if "\n" in v:
            # A fio job: a multi-line basic string. Job texts never hold backslashes or
            # triple quotes, so no escaping is needed.
            return '"""\n' + v + '"""'
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(d):
    """Nested dicts become [tables]; a list of dicts (array.failures) stays inline."""
    out = []

    def emit(table, name):
        scalars = [(k, v) for k, v in table.items() if v is not None and not isinstance(v, dict)]
        subs = [(k, v) for k, v in table.items() if isinstance(v, dict)]
        if name is not None and (scalars or not subs):
            out.append(f"[{name}]")
        for k, v in scalars:
            out.append(f"{k} = {toml_value(v)}")
        if scalars or (name is not None and not subs):
            out.append("")
        for k, v in subs:
            emit(v, f"{name}.{k}" if name else k)

    emit(d, None)
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------


def chance(rng, p):
    return rng.random() < p


def size_str(n):
    """A byte count in fio's notation (powers of 1024)."""
    if n % MIB == 0:
        return f"{n // MIB}m"
    if n % KIB == 0:
        return f"{n // KIB}k"
    return str(n)


def bits_of(cell_mode):
    return {"slc": 1, "mlc": 2, "tlc": 3}[cell_mode]


# ---------------------------------------------------------------------------------------
# The generic SSD ([ssd])
# ---------------------------------------------------------------------------------------


class SsdShape:
    """What the rest of the generator needs to know about a generated [ssd]."""

    def __init__(self, table, sector, page, capacity_sectors, payload, max_transfer_sectors):
        self.table = table
        self.sector = sector
        self.page = page
        self.capacity_sectors = capacity_sectors
        self.payload = payload
        self.max_transfer_sectors = max_transfer_sectors


def gen_geometry(rng, role):
    """A small geometry. `role` is "single" (one SSD) or "member" (one of several)."""
    if role == "single":
        g = dict(
            channels=rng.choice([1, 2, 2, 4]),
            chips_per_channel=rng.choice([1, 2]),
            dies_per_chip=rng.choice([1, 2]),
            planes_per_die=rng.choice([1, 2]),
            blocks_per_plane=rng.choice([24, 32, 48, 64, 96]),
            pages_per_block=rng.choice([32, 64, 128, 256]),
            page_bytes=rng.choice([4096, 4096, 8192, 16384]),
        )
        raw_limit = 256 * MIB
    else:
        g = dict(
            channels=rng.choice([1, 2, 2]),
            chips_per_channel=rng.choice([1, 2]),
            dies_per_chip=rng.choice([1, 2]),
            planes_per_die=rng.choice([1, 2]),
            blocks_per_plane=rng.choice([24, 32, 48, 64]),
            pages_per_block=rng.choice([32, 64, 128]),
            page_bytes=rng.choice([4096, 4096, 8192, 16384]),
        )
        raw_limit = 64 * MIB
    # Sector sizes: mostly 4 KiB, but small sectors exercise sector-granular (unaligned)
    # requests and many sectors per page. At most 64 sectors per page.
    sectors = [s for s in (512, 1024, 2048, 4096) if s <= g["page_bytes"] and g["page_bytes"] // s <= 64]
    weights = [1 if s != 4096 else 3 for s in sectors]
    g["sector_bytes"] = rng.choices(sectors, weights)[0]

    def raw(g):
        return (g["channels"] * g["chips_per_channel"] * g["dies_per_chip"] * g["planes_per_die"]
                * g["blocks_per_plane"] * g["pages_per_block"] * g["page_bytes"])

    # Shrink until the device is small enough to run fast; pages per block first, since
    # planes need blocks for the GC reserve and the SLC cache.
    while raw(g) > raw_limit:
        if g["pages_per_block"] > 32:
            g["pages_per_block"] //= 2
        elif g["blocks_per_plane"] > 24:
            g["blocks_per_plane"] = max(24, g["blocks_per_plane"] // 2)
        elif g["channels"] > 1:
            g["channels"] //= 2
        else:
            g["chips_per_channel"] = 1
            g["dies_per_chip"] = 1
    if chance(rng, 0.2):
        g["oob_bytes_per_page"] = rng.choice([16, 24, 64, 128, 256])
    return g


def planes_of(g):
    return g["channels"] * g["chips_per_channel"] * g["dies_per_chip"] * g["planes_per_die"]


def gen_timing(rng, cell_mode, read_suspend, erase_suspend):
    t = {}
    if chance(rng, 0.4):
        t["channel_mb_s"] = rng.choice([200.0, 400.0, 800.0, 1200.0])
    if chance(rng, 0.25):
        t["multi_plane"] = chance(rng, 0.5)
    if chance(rng, 0.3):
        t["scheduling"] = rng.choice(["fill-gaps", "first-come"])
    if read_suspend:
        t["read_suspend"] = True
    if erase_suspend:
        t["erase_suspend"] = True
    if read_suspend or erase_suspend:
        # Must be shorter than every mode's program (and erase) time; the tables below never
        # go under 100 us for a program.
        t["suspend_ns"] = rng.choice([5000, 10000, 20000, 40000])
    if chance(rng, 0.25):
        mode = rng.choice(["slc", "mlc", "tlc", cell_mode])
        tab = {}
        if chance(rng, 0.7):
            tab["read_ns"] = rng.choice([20000, 40000, 60000, 90000])
        if chance(rng, 0.7):
            tab["program_ns"] = rng.choice([100000, 300000, 700000, 1500000])
        if chance(rng, 0.5):
            tab["erase_ns"] = rng.choice([1000000, 3000000, 6000000])
        if chance(rng, 0.4):
            tab["endurance_cycles"] = rng.choice([100, 1000, 3000, 10000])
        if tab:
            t[mode] = tab
    return t


def gen_faults(rng, p_any, allow_read=True, allow_bad=True):
    if not chance(rng, p_any):
        return None
    f = {}
    if allow_read and chance(rng, 0.5):
        f["read_fail_probability"] = rng.choice(FAULT_PROBABILITIES)
    if chance(rng, 0.5):
        f["program_fail_probability"] = rng.choice(PROGRAM_FAULT_PROBABILITIES)
    if chance(rng, 0.4):
        f["erase_fail_probability"] = rng.choice(ERASE_FAULT_PROBABILITIES)
    if allow_bad and chance(rng, 0.3):
        f["factory_bad_block_fraction"] = rng.choice([0.005, 0.01, 0.02])
    return f or None


def ssd_min_op(dense_per_plane, reserve, bad_fraction):
    """The smallest over-provisioning the "Capacity" rules accept, allowing for factory bad
    blocks (which are drawn per block, so a plane may lose a few more than the mean)."""
    good = dense_per_plane
    if bad_fraction > 0:
        good = dense_per_plane - math.ceil(dense_per_plane * bad_fraction * 2 + 1)
    return good / (good - reserve) - 1.0


def gen_ssd(rng, role, faults_p=0.3, allow_read_faults=True, allow_bad_blocks=True,
            payload=None, scala=False):
    """One generic SSD: the [ssd] table and its derived shape."""
    g = gen_geometry(rng, role)
    cell_mode = rng.choices(["slc", "mlc", "tlc"], [1, 3, 2])[0]
    if cell_mode == "tlc" and chance(rng, 0.5):
        # TLC parts have page counts divisible by 3; 1/3 of them in SLC mode.
        g["pages_per_block"] = {32: 48, 64: 96, 128: 192, 256: 384}.get(g["pages_per_block"], 96)
    planes = planes_of(g)
    ppb = g["pages_per_block"]
    page = g["page_bytes"]
    sector = g["sector_bytes"]
    spp = page // sector
    bpp = g["blocks_per_plane"]

    ssd = {}
    ssd["cell_mode"] = cell_mode
    if payload is None:
        raw = planes * bpp * ppb * page
        full_ok = raw <= (128 * MIB if role == "single" else 48 * MIB)
        payload = rng.choices(["token", "full", "none"], [6, 2.5 if full_ok else 0, 1])[0]
    ssd["payload"] = payload

    faults = gen_faults(rng, faults_p, allow_read=allow_read_faults, allow_bad=allow_bad_blocks)
    program_fail = bool(faults and faults.get("program_fail_probability"))
    erase_fail = bool(faults and faults.get("erase_fail_probability"))
    bad_fraction = (faults or {}).get("factory_bad_block_fraction", 0.0)

    gc = {}
    hard = rng.choice([2, 2, 2, 3, 4])
    if hard != 2 or chance(rng, 0.3):
        gc["hard_threshold_blocks"] = hard
    soft = hard + rng.choice([0, 1, 2, 2, 4])
    if soft != 4 or chance(rng, 0.3):
        gc["soft_threshold_blocks"] = soft
    if chance(rng, 0.5):
        gc["victim"] = rng.choice(["greedy", "fifo", "cost-benefit"])
    if chance(rng, 0.2):
        gc["background"] = chance(rng, 0.5)
    if chance(rng, 0.25):
        gc["idle_erase"] = True
    if chance(rng, 0.25):
        gc["incremental"] = True

    # SLC cache: whole SLC blocks, at least 2 per plane, and never with cell_mode = "slc".
    slc_pages = ppb // bits_of(cell_mode)
    slc_blocks = 0
    want_slc = 0.55 if scala else 0.3
    if cell_mode != "slc" and slc_pages >= 1 and chance(rng, want_slc):
        slc_blocks = rng.randint(2, max(2, bpp // 6))
        slc = {"capacity_bytes": slc_blocks * planes * slc_pages * page}
        if scala and chance(rng, 0.7):
            slc["eviction"] = "transient"
        elif chance(rng, 0.6):
            slc["eviction"] = rng.choice(["greedy", "fifo", "transient"])
        if chance(rng, 0.3):
            slc["transient_factor"] = rng.choice([0.0, 0.5, 1.0, 2.0])
        ssd["slc_cache"] = slc

    dense = bpp - slc_blocks
    reserve = hard + 2 + (1 if program_fail or erase_fail else 0)
    min_op = max(0.01, ssd_min_op(dense, reserve, bad_fraction))
    # Failed programs and erases retire blocks while the run goes on; a little more spare
    # keeps most such runs from ending out of space (some still do, which is expected).
    wear_margin = 0.08 if faults and (faults.get("program_fail_probability")
                                      or faults.get("erase_fail_probability")) else 0.0
    op = round(min_op + wear_margin + rng.uniform(0.03, 0.35), 4)
    ssd["over_provisioning"] = op
    logical_pages = int(dense * planes * ppb / (1 + op))
    if bad_fraction:
        logical_pages = int(logical_pages * (1 - 3 * bad_fraction))
    capacity_sectors = logical_pages * spp

    ssd["geometry"] = g
    t = gen_timing(rng, cell_mode, chance(rng, 0.12), chance(rng, 0.12))
    if t:
        ssd["timing"] = t

    host = {}
    max_transfer = 65536
    if chance(rng, 0.3):
        host["queue_depth"] = rng.choice([8, 32, 128, 1024])
    if chance(rng, 0.25):
        host["bandwidth_mb_s"] = rng.choice([550.0, 3500.0, 7880.0])
    if chance(rng, 0.2):
        host["command_overhead_ns"] = rng.choice([0, 1000, 5000])
    if role == "single" and chance(rng, 0.25):
        # Must be at least the largest request the workload makes (checked by the caller
        # through SsdShape.max_transfer_sectors).
        max_transfer = rng.choice([1024, 2048, 65536])
        max_transfer = max(max_transfer, (1 * MIB) // sector)
        host["max_transfer_sectors"] = max_transfer
    if chance(rng, 0.2):
        host["dram_mb_s"] = rng.choice([3200.0, 12800.0])
    if chance(rng, 0.2):
        host["duplex"] = "half"
    if host:
        ssd["host"] = host

    if chance(rng, 0.5):
        # At most a few percent of the logical capacity, whose size bounds it.
        pages = rng.choice([1, 2, 4, 16, 64, 256])
        pages = max(1, min(pages, logical_pages // 20))
        wb = {"capacity_bytes": pages * page}
        if chance(rng, 0.6):
            wb["policy"] = rng.choice(["fifo", "lru"])
        if chance(rng, 0.5):
            wb["destage_fraction"] = rng.choice([0.0, 0.25, 0.5, 0.9, 1.0])
        ssd["write_buffer"] = wb

    if chance(rng, 0.35):
        ftl = {}
        if chance(rng, 0.7):
            order = list("CWDP")
            rng.shuffle(order)
            s = "".join(order)
            ftl["allocation_order"] = s.lower() if chance(rng, 0.2) else s
        if chance(rng, 0.6):
            ftl["die_aware_window"] = rng.choice([1, 2, 4, 8, 1000])
        if ftl:
            ssd["ftl"] = ftl
    if gc:
        ssd["gc"] = gc
    if chance(rng, 0.3):
        wl = {}
        if chance(rng, 0.5):
            wl["dynamic"] = chance(rng, 0.5)
        if chance(rng, 0.7):
            wl["static_threshold_erases"] = rng.choice([0, 2, 5, 20, 100])
        if wl:
            ssd["wear_leveling"] = wl
    if scala and chance(rng, 0.4):
        ssd["convert"] = {"ns_per_64k_from_6": rng.choice([5000, 20000, 80000])}
    if faults:
        ssd["faults"] = faults
    return SsdShape(ssd, sector, page, capacity_sectors, payload, max_transfer)


# ---------------------------------------------------------------------------------------
# Workloads: fio job files
# ---------------------------------------------------------------------------------------


class JobContext:
    """What a workload may ask of its device."""

    def __init__(self, sector, page, capacity_bytes, max_bs):
        self.sector = sector
        self.page = page
        self.capacity_bytes = capacity_bytes
        self.max_bs = max_bs          # largest request in bytes
        self.trims = True             # the device takes trims
        self.raid5f_stripe = 0        # raid5f: writes must be whole, aligned stripes
        self.max_qd = 256             # requests in flight over all clones
        self.continue_read = False    # uncorrectable reads must not stop the run
        self.preconditioned = False
        self.unaligned = True         # sector-granular (sub-page) requests are fine
        self.max_ios = 150000         # budget of requests for the main phase


def pick_bs(rng, ctx, big=False):
    """A request size in bytes: page-friendly powers of two, or (for unaligned requests) any
    whole number of sectors."""
    if not big and ctx.unaligned and chance(rng, 0.3):
        top = max(1, min(48, ctx.max_bs // ctx.sector))
        return ctx.sector * rng.randint(1, top)
    if big:
        cands = [64 * KIB, 128 * KIB, 256 * KIB, 512 * KIB, 1 * MIB]
    else:
        cands = [4 * KIB, 4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 128 * KIB]
    cands = [c for c in cands if c <= ctx.max_bs and c % ctx.sector == 0]
    if not cands:
        return ctx.sector * max(1, ctx.max_bs // ctx.sector)
    return rng.choice(cands)


def bs_option(rng, ctx, write=True):
    """The block-size options of a job section: `bs`, `bsrange` or `bssplit`."""
    if ctx.raid5f_stripe and write:
        # raid5f takes only whole, aligned stripes; reads may be any size.
        w = ctx.raid5f_stripe * rng.choice([1, 1, 2])
        r = pick_bs(rng, ctx)
        return [f"bs={size_str(r)},{size_str(w)}"], max(w, r)
    u = rng.random()
    if u < 0.12:
        lo = ctx.sector * rng.choice([1, 2, 8]) if ctx.unaligned else max(ctx.sector, 4 * KIB)
        hi = min(ctx.max_bs, lo * rng.choice([4, 16, 32]))
        hi = max(lo, hi // ctx.sector * ctx.sector)
        return [f"bsrange={size_str(lo)}-{size_str(hi)}"], hi
    if u < 0.22:
        sizes = sorted({pick_bs(rng, ctx) for _ in range(3)})
        pct = [50, 30, 20][: len(sizes)]
        parts = [f"{size_str(s)}/{p}" for s, p in zip(sizes, pct)]
        if len(sizes) < 3:
            parts[-1] = parts[-1].split("/")[0]  # the last entry takes the rest
        return ["bssplit=" + ":".join(parts)], max(sizes)
    b = pick_bs(rng, ctx)
    return [f"bs={size_str(b)}"], b


def region(rng, ctx):
    """`offset` and `size` as percentages of the device, never past its end."""
    if ctx.raid5f_stripe:
        return []
    if chance(rng, 0.6):
        return []
    off = rng.choice([0, 0, 10, 25, 50])
    # A region must hold several of the largest requests.
    sizes = [p for p in (10, 25, 50, 75, 100) if ctx.capacity_bytes * p / 100 >= 8 * ctx.max_bs]
    size = rng.choice(sizes or [100])
    if size == 100:
        off = 0
    size = min(size, 100 - off)
    opts = [f"size={size}%"]
    if off:
        opts.append(f"offset={off}%")
    return opts


def gen_job(rng, ctx):
    """An inline fio job: an optional fill, a main phase of one or two concurrent jobs, and
    an optional read-back, each phase stonewalled from the one before."""
    glob = ["[global]"]
    if ctx.continue_read:
        glob.append("continue_on_error=read")
    if chance(rng, 0.15):
        glob += ["ioengine=libaio", "direct=1"]
    sections = []

    def qd():
        d = rng.choice([1, 2, 4, 8, 16, 32, 64])
        return min(d, ctx.max_qd)

    # Phase 1: a sequential fill, so that the later phases read written data and overwrite.
    if chance(rng, 0.35 if ctx.preconditioned else 0.75):
        s = ["[fill]", "rw=write"]
        b = pick_bs(rng, ctx, big=True)
        if ctx.raid5f_stripe:
            b = ctx.raid5f_stripe * max(1, min(4, (1 * MIB) // ctx.raid5f_stripe))
            # A whole number of stripes from offset 0, well inside the volume, so that the
            # last request is not shortened (which raid5f would refuse).
            stripes = int(ctx.capacity_bytes * rng.uniform(0.3, 0.6)) // ctx.raid5f_stripe
            s.append(f"size={max(1, stripes) * ctx.raid5f_stripe}")
        else:
            # A region that holds at least one block: fio's job-file rules (and afa's)
            # refuse a region smaller than the block size (seed 16331: 30% of a 3.4 MB
            # volume against 1 MiB blocks).
            fits = [p for p in [30, 50, 80, 100] if ctx.capacity_bytes * p // 100 >= b]
            s.append(f"size={rng.choice(fits or [100])}%")
        s += [f"bs={size_str(b)}", f"iodepth={qd()}"]
        if chance(rng, 0.2):
            s.append("end_fsync=1")
        sections.append(s)

    # Phase 2: the main jobs.
    n_main = 1 if chance(rng, 0.7) else 2
    # Most runs are short; some go on long enough for GC, wear and conversion to matter.
    budget = int(ctx.max_ios * rng.choice([0.1, 0.3, 1.0, 1.0, 2.5]))
    for j in range(n_main):
        s = [f"[main{j}]"]
        if sections and j == 0:
            s.append("stonewall")
        modes = ["randwrite", "randwrite", "randrw", "randrw", "rw", "write", "randread", "read"]
        if ctx.trims and not ctx.raid5f_stripe:
            modes += ["randtrim", "trimwrite", "randtrimwrite"]
        rw = rng.choice(modes)
        if rw in ("write", "rw") and chance(rng, 0.2) and not ctx.raid5f_stripe:
            hole = pick_bs(rng, ctx)
            rw += f":{size_str(hole)}"
        s.append(f"rw={rw}")
        writes = any(x in rw for x in ("write", "rw", "trim"))
        if "rw" in rw and "trim" not in rw:
            s.append(f"rwmixread={rng.choice([10, 30, 50, 70, 90])}")
        opts, top_bs = bs_option(rng, ctx, write=writes and "trim" not in rw)
        if "trim" in rw and ctx.raid5f_stripe:
            opts = [f"bs={size_str(ctx.raid5f_stripe)}"]
        s += opts
        s += region(rng, ctx)
        numjobs = rng.choice([1, 1, 1, 2, 3])
        depth = qd()
        while numjobs * depth > ctx.max_qd and depth > 1:
            depth //= 2
        s.append(f"iodepth={depth}")
        if numjobs > 1:
            s.append(f"numjobs={numjobs}")
        time_based = writes and chance(rng, 0.1) and "trim" not in rw
        if time_based:
            # A time-based job needs simulated time to pass, so only jobs that write (reads
            # of never-written data may take no time at all).
            s += ["time_based", f"runtime={rng.choice([10, 20, 50, 100])}ms"]
        else:
            ios = max(50, budget // (numjobs * n_main))
            ios = rng.randint(ios // 4, ios)
            # Bytes matter as much as requests: 1 MiB requests to tiny members cost far
            # more host time per request than 4 KiB ones. At most a few volumes' worth.
            byte_budget = max(64 * MIB, min(6 * 1024 * MIB, ctx.capacity_bytes * 12))
            ios = max(20, min(ios, byte_budget // (numjobs * n_main * top_bs)))
            s.append(f"number_ios={ios}")
            # Without io_size a job ends after one region's worth of bytes; this lets
            # number_ios decide.
            s.append(f"io_size={size_str(ios * top_bs)}")
        if rw.startswith("rand") and chance(rng, 0.3):
            s.append("random_distribution=" + rng.choice(
                ["zipf:1.1", "zipf:0.8", "pareto:0.3", "normal:20", "zoned:60/10:30/20:10/70"]))
        if rw.startswith("rand") and chance(rng, 0.1):
            s.append(f"percentage_random={rng.choice([30, 70])}")
        if writes and chance(rng, 0.15):
            s.append(f"fsync={rng.choice([1, 8, 64])}")
        if writes and chance(rng, 0.15):
            s.append("end_fsync=1")
        if writes and chance(rng, 0.1):
            s.append("sync=1")
        if writes and not time_based and "trim" not in rw and chance(rng, 0.1):
            s.append("verify=crc32c")
            if chance(rng, 0.5):
                s.append(f"verify_backlog={rng.choice([16, 128])}")
        if chance(rng, 0.05):
            s += ["thinktime=50", f"thinktime_blocks={rng.choice([4, 16])}"]
        if not time_based and chance(rng, 0.05):
            s.append(f"rate_iops={rng.choice([2000, 20000])}")
        if chance(rng, 0.05):
            s.append("serialize_overlap=1")
        if chance(rng, 0.08):
            s.append(f"iodepth_low={max(0, depth // 2)}")
        sections.append(s)

    # Phase 3: read back what is there, every read checked by the oracle.
    if chance(rng, 0.8):
        s = ["[check]", "stonewall"]
        s.append("rw=" + rng.choice(["read", "randread", "randread"]))
        b = pick_bs(rng, ctx, big=chance(rng, 0.5))
        s += [f"bs={size_str(b)}", f"iodepth={qd()}"]
        s.append(f"number_ios={rng.randint(200, 4000)}")
        sections.append(s)

    return "\n".join(glob) + "\n\n" + "\n\n".join("\n".join(s) for s in sections) + "\n"


# The fixture traces, their formats and their longest read or write in bytes (measured by
# `afa trace convert --to msr`): a trace is drawn only for a device that takes its longest
# request in one command, since `afa run` refuses a replay that has a longer one.
TRACES = [
    ("msr_small.csv", "msr", 64 * KIB),
    ("blkparse_small.txt", "blkparse", 128 * KIB),
    ("fiu_small.txt", "fiu", 64 * KIB),
    ("spc_small.csv", "spc", 16 * KIB),
    ("alibaba_small.csv", "alibaba", 128 * KIB),
    ("tencent_small.csv", "tencent", 128 * KIB),
    ("ascii_small.trace", "ascii", 128 * KIB),
    ("iolog_v3.log", "iolog", 16 * KIB),
]


def gen_workload(rng, ctx, allow_trace=True):
    w = {}
    if allow_trace and not ctx.raid5f_stripe and chance(rng, 0.06):
        name, fmt, longest_bytes = rng.choice(TRACES)
        # A record's ends are rounded out to whole sectors when it is replayed.
        if longest_bytes + 2 * ctx.sector > ctx.max_bs:
            w["job"] = gen_job(rng, ctx)
            return finish_workload(rng, w)
        t = {"path": os.path.join(TRACE_DIR, name), "format": fmt}
        if chance(rng, 0.5):
            t["replay"] = "closed"
            t["iodepth"] = rng.choice([1, 8, 32])
        else:
            t["time_scale"] = rng.choice([0.0, 0.5, 1.0])
        w["trace"] = t
    else:
        w["job"] = gen_job(rng, ctx)
    return finish_workload(rng, w)


def finish_workload(rng, w):
    if chance(rng, 0.1):
        w["background_work"] = False
    return w


def gen_host_cpu(rng, p=0.25):
    if not chance(rng, p):
        return None
    h = {"threads": rng.choice([1, 1, 2, 4]), "profile": rng.choice(["kernel", "userspace"])}
    if chance(rng, 0.2):
        h["request_ns"] = rng.choice([500, 2000, 8000])
    return h


def gen_report(rng):
    if chance(rng, 0.3):
        return {"timeline_interval_ms": rng.choice([0.0, 1.0, 10.0, 50.0])}
    return None


# ---------------------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------------------

# md-style levels: (data members k, redundancy m) for n members.
def md_k_m(level, n):
    return {
        "raid0": (n, 0),
        "raid1": (1, n - 1),
        "raid10": (n // 2, 1),
        "raid4": (n - 1, 1),
        "raid5": (n - 1, 1),
        "raid5f": (n - 1, 1),
        "raid6": (n - 2, 2),
    }[level]


def summary_sectors_for(segment_sectors, sector_bytes):
    """Log-RAID's and SWAN's segment summary: 32 bytes plus 13 per data sector."""
    for n in range(1, segment_sectors):
        if 32 + 13 * (segment_sectors - n) <= n * sector_bytes:
            return n
    return segment_sectors


def gen_failures(rng, n_members, tolerance, horizon_ms, group_of=None, per_group=None):
    """Member failures within what the layout tolerates (never more than `tolerance`, and
    with R-groups at most `per_group` in each)."""
    if tolerance <= 0 or not chance(rng, 0.4):
        return []
    count = rng.randint(1, tolerance)
    members = list(range(n_members))
    rng.shuffle(members)
    chosen = []
    used = Counter()
    for m in members:
        if len(chosen) == count:
            break
        if group_of is not None:
            if used[group_of(m)] >= per_group:
                continue
            used[group_of(m)] += 1
        chosen.append(m)
    return [{"member": m, "at_ms": float(rng.choice([0.0, 0.5, 2.0, 5.0, 20.0, 60.0]))}
            for m in sorted(chosen)]


def array_common(rng, a):
    """The parity and rebuild rates every array engine takes."""
    if chance(rng, 0.2):
        a["parity_mb_s"] = rng.choice([1000.0, 12000.0])
    if chance(rng, 0.3):
        a["rebuild_mb_s"] = rng.choice([20.0, 100.0, 500.0, 3000.0])


def pick_chunk(rng, sector, choices=(4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 64 * KIB, 128 * KIB)):
    c = rng.choice(list(choices))
    return max(c, sector) // sector * sector


def read_faults_on(ssd):
    return bool(ssd.table.get("faults", {}).get("read_fail_probability"))


def drop_read_faults(ssd):
    f = ssd.table.get("faults")
    if f and "read_fail_probability" in f:
        del f["read_fail_probability"]
        if not f:
            del ssd.table["faults"]


def gen_md(rng, level):
    n = {
        "raid0": rng.choice([1, 2, 3, 4, 6]),
        "raid1": rng.choice([2, 2, 3]),
        "raid10": rng.choice([4, 4, 6]),
        "raid4": rng.choice([3, 4, 5]),
        "raid5": rng.choice([3, 4, 5, 6]),
        "raid5f": rng.choice([3, 4, 5]),
        "raid6": rng.choice([4, 5, 6, 7]),
    }[level]
    # raid5f needs every member the same size for its whole-stripe arithmetic to hold, so no
    # factory bad blocks there (they would make the volume's capacity differ from ours).
    ssd = gen_ssd(rng, "member", faults_p=0.3)
    if level == "raid5f" and "faults" in ssd.table:
        ssd.table["faults"].pop("factory_bad_block_fraction", None)
        if not ssd.table["faults"]:
            del ssd.table["faults"]
    chunk = pick_chunk(rng, ssd.sector)
    k, m = md_k_m(level, n)
    a = {"level": level, "members": n, "chunk_bytes": chunk}
    array_common(rng, a)
    if level in ("raid4", "raid5", "raid6") and chance(rng, 0.3):
        a["stripe_cache_stripes"] = rng.choice([2, 8, 64])
    spares = rng.choice([0, 0, 1, 2]) if m > 0 else 0
    if spares:
        a["spares"] = spares
    # raid1 tolerates n - 1, raid10 one per mirror pair: keep to one failure there, so that
    # the two never hit the same pair.
    tol = 1 if level == "raid10" else min(m, 2)
    fails = gen_failures(rng, n, tol, 60)
    if fails:
        a["failures"] = fails
    stripes = (ssd.capacity_sectors * ssd.sector) // chunk
    cap = stripes * chunk * k
    return a, ssd, cap, m, len(fails), chunk * k


def gen_log_raid(rng):
    level = rng.choice(["raid0", "raid4", "raid5"])
    n = rng.choice([2, 3, 4]) if level == "raid0" else rng.choice([3, 4, 5])
    ssd = gen_ssd(rng, "member", faults_p=0.3)
    chunk = pick_chunk(rng, ssd.sector, (4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB))
    k, m = md_k_m(level, n)
    a = {"level": level, "members": n, "chunk_bytes": chunk}
    array_common(rng, a)
    stripe_sectors = chunk // ssd.sector * k
    stripes = (ssd.capacity_sectors * ssd.sector) // chunk
    array_sectors = stripes * stripe_sectors
    log = {}
    gc_free = rng.choice([2, 2, 3, 4])
    if gc_free != 2:
        log["gc_free_segments"] = gc_free
    # Enough segments that cleaning has room: at least a dozen.
    seg_choices = [s for s in (1, 2, 4, 8, 16, 32)
                   if array_sectors // (s * stripe_sectors) >= max(12, gc_free + 6)
                   and summary_sectors_for(s * stripe_sectors, ssd.sector) < s * stripe_sectors]
    seg = rng.choice(seg_choices) if seg_choices else 1
    log["segment_stripes"] = seg
    spare = rng.choice([0.05, 0.1, 0.2, 0.3])
    log["spare_fraction"] = spare
    if chance(rng, 0.4):
        log["nvram_stripes"] = rng.choice([1, 2, 8, 32])
    if chance(rng, 0.2):
        log["nvram_write_ns"] = rng.choice([0, 500, 2000, 20000])
    segment_sectors = seg * stripe_sectors
    summary = summary_sectors_for(segment_sectors, ssd.sector)
    # Volatile memory: a FLUSH's partial summary must fit in a stripe, and a victim's
    # cleaning may cost a stripe, which the segment's data must exceed.
    if summary < stripe_sectors and segment_sectors - summary > stripe_sectors \
            and chance(rng, 0.35):
        log["host_memory"] = "volatile"
    a["log"] = log
    spares = rng.choice([0, 0, 1]) if m else 0
    if spares:
        a["spares"] = spares
    fails = gen_failures(rng, n, m, 60)
    if fails:
        a["failures"] = fails
    segments = array_sectors // segment_sectors
    data = segment_sectors - summary
    logical = min(int(segments * data * (1 - spare)), (segments - gc_free - 1) * data)
    return level, a, ssd, logical * ssd.sector, m, len(fails)


def add_spares_and_failures(rng, a, n, m):
    """Gives the two-phase engines (two-phase, ScalaAFA) 0-2 spares and up to m member
    failures in their first 60 ms; returns the failures."""
    spares = rng.choice([0, 1, 1, 2])
    if spares:
        a["spares"] = spares
    fails = gen_failures(rng, n, m, 60)
    if fails:
        a["failures"] = fails
    return fails


def gen_two_phase(rng):
    level = rng.choice(["raid5", "raid6"])
    m = 1 if level == "raid5" else 2
    n = rng.randint(m + 2, 6)
    ssd = gen_ssd(rng, "member", faults_p=0.3)
    chunk = pick_chunk(rng, ssd.sector, (8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB))
    a = {"level": level, "members": n, "chunk_bytes": chunk}
    array_common(rng, a)
    tp = {}
    w = rng.choice([0.02, 0.05, 0.1, 0.3, 0.45])
    s = rng.choice([0.05, 0.1, 0.2, 0.4])
    tp["watermark_fraction"] = w
    tp["spare_fraction"] = s
    if chance(rng, 0.4):
        tp["sub_chunk_writes"] = rng.choice(["merge", "in-place"])
    a["two_phase"] = tp
    fails = add_spares_and_failures(rng, a, n, m)
    k = n - m
    slots = (ssd.capacity_sectors * ssd.sector) // chunk
    usable = n * slots * (1 - s)
    volume_chunks = int(usable / ((n / k) * (1 - w) + w * (m + 1))) // k * k
    return level, a, ssd, volume_chunks * chunk, m, len(fails)


def gen_scala(rng, mode):
    level = rng.choice(["raid5", "raid6"])
    m = 1 if level == "raid5" else 2
    n = rng.randint(m + 2, 6)
    k = n - m
    for _attempt in range(20):
        ssd = gen_ssd(rng, "member", faults_p=0.3, scala=True)
        chunk = pick_chunk(rng, ssd.sector, (8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB))
        chunks = (ssd.capacity_sectors * ssd.sector) // chunk
        sc = {"mode": mode}
        tf = rng.choice([0.05, 0.1, 0.2, 0.3, 0.45])
        slc = ssd.table.get("slc_cache")
        if slc and chance(rng, 0.5):
            # Transient area the size of the SLC cache, as the ScalaAFA fixture does.
            tb = slc["capacity_bytes"]
            transient_chunks = tb // chunk
            sc["transient_bytes"] = tb
        else:
            transient_chunks = int(chunks * tf)
            sc["transient_fraction"] = tf
        vhs = min(transient_chunks // k, chunks // 2 // k)
        ckpt = 0.0
        if chance(rng, 0.35):
            ckpt = float(rng.choice([1, 5, 20, 100]))
        # The checkpoint slots are a few chunks at most at this size; keep a margin.
        rows = chunks - vhs * k - (8 if ckpt else 0)
        if vhs >= 4 and rows >= 24:
            break
    else:
        raise RuntimeError("no ScalaAFA shape found")
    a = {"level": level, "members": n, "chunk_bytes": chunk}
    array_common(rng, a)
    if ckpt:
        sc["checkpoint_interval_ms"] = ckpt
    if chance(rng, 0.4):
        sc["io_threads"] = rng.choice([1, 2, 4, 8])
    if chance(rng, 0.4):
        sc["grant_batch_hhs"] = rng.choice([4, 16, 64, 256, 1024])
    if chance(rng, 0.2):
        sc["low_water_hhs"] = rng.choice([0, 1, 8])
    if chance(rng, 0.4):
        sc["convert_watermark_fraction"] = rng.choice([0.0, 0.25, 0.5, 0.9, 1.0])
    spare = rng.choice([0.05, 0.1, 0.1, 0.3])
    sc["spare_fraction"] = spare
    # Every thread's open group (and the GC writer's) strands the unfilled slots of a row,
    # and the manager keeps two rows for the GC writer: with fewer spare rows than that the
    # volume fills up in its layout ("no hero group"), which is no engine bug.
    spare_rows = rows - int(rows * (1 - spare))
    while sc.get("io_threads", 1) > 1 and spare_rows < sc["io_threads"] + 3:
        sc["io_threads"] //= 2
    if chance(rng, 0.4):
        sc["sub_chunk_writes"] = rng.choice(["merge", "in-place"])
    if mode == "scala-co" or chance(rng, 0.2):
        if chance(rng, 0.5):
            sc["daemon_copy_mb_s"] = rng.choice([1000.0, 10000.0])
            sc["daemon_parity_mb_s"] = rng.choice([1000.0, 12000.0])
        if chance(rng, 0.3):
            sc["daemon_message_ns"] = rng.choice([0, 200, 2000])
            sc["daemon_command_ns"] = rng.choice([100, 1100, 10000])
    a["scalaafa"] = sc
    fails = add_spares_and_failures(rng, a, n, m)
    volume = int(rows * (1 - spare)) * k * chunk
    return level, a, ssd, volume, m, len(fails)


def gen_swan(rng):
    level = rng.choice(["raid0", "raid4", "raid5"])
    groups = rng.choice([2, 2, 3, 4])
    width = rng.choice([1, 2, 3]) if level == "raid0" else rng.choice([3, 3, 4])
    while groups * width > 12:
        groups -= 1
    n = groups * width
    age = 0.0
    payload = None
    if chance(rng, 0.12):
        # Aging writes data the oracle does not know, so it needs payload "none".
        age = rng.choice([0.3, 0.6])
        payload = "none"
    ssd = gen_ssd(rng, "member", faults_p=0.3, payload=payload)
    chunk = pick_chunk(rng, ssd.sector, (4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB))
    k = width if level == "raid0" else width - 1
    m = 0 if level == "raid0" else 1
    stripe = chunk * k
    stripe_sectors = stripe // ssd.sector
    group_sectors = (ssd.capacity_sectors * ssd.sector) // chunk * chunk // ssd.sector * k
    mults = [x for x in (1, 2, 4, 8, 16, 32)
             if group_sectors // (x * stripe_sectors) >= 10
             and x * stripe_sectors >= 2
             and summary_sectors_for(x * stripe_sectors, ssd.sector) < x * stripe_sectors]
    mult = rng.choice(mults) if mults else 1
    seg = stripe * mult
    a = {"level": level, "members": n, "chunk_bytes": chunk}
    array_common(rng, a)
    sw = {"groups": groups, "segment_bytes": seg}
    spare = rng.choice([0.1, 0.2, 0.3, 0.4, 0.5])
    sw["spare_fraction"] = spare
    if chance(rng, 0.4):
        sw["victim"] = rng.choice(["greedy", "fifo"])
    if chance(rng, 0.3):
        sw["gc_free_target"] = rng.choice([0.0, 0.5, 1.0, 2.0])
    if chance(rng, 0.3):
        # Any ceiling runs: the volume is capped where some full segment is always under it
        # (array/src/swan.rs). Before the cap, a ceiling below the volume's fill stopped
        # cleaning once random writes had spread the valid blocks evenly (seeds 222 and 388),
        # and a volume filling its usable segments wedged at the default one (seed 9603).
        sw["gc_max_victim_valid"] = rng.choice([0.5, 0.8, 0.95, 1.0])
    if groups > 2 and chance(rng, 0.4):
        sw["gc_parallel_groups"] = rng.randint(1, groups - 1)
    if chance(rng, 0.3):
        sw["gc_read_window_blocks"] = rng.choice([0, 1, 8, 32])
    if chance(rng, 0.3):
        sw["buffer_stripes"] = rng.choice([1, 2, 8, 32])
    if chance(rng, 0.2):
        sw["buffer_write_ns"] = rng.choice([0, 2000, 20000])
    if age:
        sw["age_fraction"] = age
    seg_sectors = seg // ssd.sector
    summary = summary_sectors_for(seg_sectors, ssd.sector)
    if summary < stripe_sectors and chance(rng, 0.35):
        sw["host_memory"] = "volatile"
    a["swan"] = sw
    spares = rng.choice([0, 0, 1, 2]) if m else 0
    if spares:
        a["spares"] = spares
    fails = gen_failures(rng, n, rng.choice([1, 2]) if m else 0, 60,
                         group_of=lambda x: x // width, per_group=1)
    if fails:
        a["failures"] = fails
    segments = group_sectors // seg_sectors * groups
    data = seg_sectors - summary
    # The volume's cap (array/src/swan.rs): the full segments times one more than the
    # victim ceiling (`victim_ceiling`).
    ceiling = min(int(sw.get("gc_max_victim_valid", 0.95) * data), data - 1)
    if sw.get("host_memory") == "volatile":
        ceiling = min(ceiling, max(0, data - 2 * summary))
    logical = min(int(segments * data * (1 - spare)),
                  max(0, (segments - groups * 3 - 1) * (ceiling + 1) - 1))
    return level, a, ssd, logical * ssd.sector, m, len(fails), age


def gen_array_run(rng, family):
    cfg = {}
    pre_ok = True
    if family in ("raid0", "raid1", "raid10", "raid4", "raid5", "raid6", "raid5f"):
        a, ssd, cap, m, nfail, stripe = gen_md(rng, family)
        label = family
    elif family == "log-raid":
        level, a, ssd, cap, m, nfail = gen_log_raid(rng)
        label = f"log-raid/{level}"
    elif family == "two-phase":
        level, a, ssd, cap, m, nfail = gen_two_phase(rng)
        label = f"two-phase/{level}"
    elif family in ("scalaafa", "scala-co", "scala-wr"):
        level, a, ssd, cap, m, nfail = gen_scala(rng, family)
        label = f"{family}/{level}"
    elif family == "swan":
        level, a, ssd, cap, m, nfail, age = gen_swan(rng)
        label = f"swan/{level}"
        pre_ok = False  # SWAN volumes are aged with array.swan.age_fraction instead
    else:
        raise ValueError(family)

    # Uncorrectable reads. A layout with redundancy left after the scheduled failures
    # corrects them, but a correction reads the stripe's other members, and one of those
    # reads may fail too: at 0.002 per page about one correction in twenty meets a second
    # failure on 4+1 stripes of 32 KiB chunks, as md's raid5 does as well (measured). So
    # the jobs go on past failed reads (`continue_on_error=read`; the report counts them,
    # and the ok line shows them beside the corrections), and redundant layouts get the
    # lower rates. A write cannot go on past a failed read, so layouts left without
    # redundancy by their failures get no read faults at all.
    continue_read = False
    if read_faults_on(ssd):
        if m > 0 and m - nfail < 1:
            drop_read_faults(ssd)
        else:
            continue_read = True
            f = ssd.table["faults"]
            if m > 0:
                f["read_fail_probability"] = min(f["read_fail_probability"], 0.0005)

    cfg["ssd"] = ssd.table
    preconditioned = False
    if pre_ok and chance(rng, 0.25):
        cfg["precondition"] = {
            "fill_fraction": rng.choice([0.3, 0.5, 0.7, 0.9]),
            "pattern": rng.choice(["sequential", "random-simulated"]),
            "overwrite_rounds": rng.choice([0.0, 0.1, 0.25, 0.5]),
        }
        preconditioned = True
    cfg["array"] = a
    host = gen_host_cpu(rng)
    if host:
        cfg["host"] = host
    ctx = JobContext(ssd.sector, ssd.page, cap, 1 * MIB)
    ctx.preconditioned = preconditioned
    ctx.continue_read = continue_read
    if family == "raid5f":
        ctx.raid5f_stripe = stripe
        ctx.trims = False
        if stripe > ctx.max_bs:
            ctx.max_bs = stripe
    cfg["workload"] = gen_workload(rng, ctx)
    rep = gen_report(rng)
    if rep:
        cfg["report"] = rep
    return label, cfg


# ---------------------------------------------------------------------------------------
# One SSD, WAFLASH, OX
# ---------------------------------------------------------------------------------------


def gen_ssd_run(rng):
    ssd = gen_ssd(rng, "single", faults_p=0.35)
    cfg = {"ssd": ssd.table}
    preconditioned = False
    if chance(rng, 0.45):
        cfg["precondition"] = {
            "fill_fraction": rng.choice([0.3, 0.5, 0.75, 0.9, 1.0]),
            "pattern": rng.choice(["sequential", "random", "random-simulated"]),
            "overwrite_rounds": rng.choice([0.0, 0.1, 0.25, 0.5, 1.0]),
        }
        preconditioned = True
    host = gen_host_cpu(rng)
    if host:
        cfg["host"] = host
    max_bs = min(1 * MIB, ssd.max_transfer_sectors * ssd.sector)
    ctx = JobContext(ssd.sector, ssd.page, ssd.capacity_sectors * ssd.sector, max_bs)
    ctx.preconditioned = preconditioned
    # One SSD has no redundancy: an uncorrectable read fails its command.
    ctx.continue_read = read_faults_on(ssd)
    qd = ssd.table.get("host", {}).get("queue_depth")
    if qd:
        # The host never exceeds the device's queue; deeper jobs just wait, which is fine,
        # but keep it comparable.
        ctx.max_qd = max(qd, 8)
    cfg["workload"] = gen_workload(rng, ctx)
    rep = gen_report(rng)
    if rep:
        cfg["report"] = rep
    return "ssd", cfg


def gen_waflash_run(rng):
    g = {
        "channels": rng.choice([1, 2, 4]),
        "chips_per_channel": rng.choice([1, 2]),
        "dies_per_chip": 1,
        "planes_per_die": rng.choice([1, 2]),
        "blocks_per_plane": rng.choice([16, 24, 32, 48, 64]),
        "pages_per_block": rng.choice([32, 64, 128]),
    }
    # Sector/page ratios from 2 to 16 sectors per page (WAFLASH's paper: 4 KiB in 16 KiB).
    page, sector = rng.choice([(8192, 4096), (16384, 4096), (16384, 4096), (32768, 4096),
                               (4096, 512), (8192, 1024), (16384, 2048)])
    g["page_bytes"] = page
    g["sector_bytes"] = sector
    while (g["channels"] * g["chips_per_channel"] * g["planes_per_die"] * g["blocks_per_plane"]
           * g["pages_per_block"] * page) > 256 * MIB:
        g["pages_per_block"] //= 2
    spp = page // sector
    planes = g["channels"] * g["chips_per_channel"] * g["planes_per_die"]
    bpp = g["blocks_per_plane"]
    ppb = g["pages_per_block"]
    w = {"geometry": g}
    if chance(rng, 0.4):
        w["cell_mode"] = rng.choice(["slc", "mlc", "tlc"])
    payload = rng.choices(["token", "full", "none"], [6, 2, 1])[0]
    w["payload"] = payload
    gc_thr = rng.choice([2, 3, 3, 4])
    while gc_thr + 2 >= bpp:
        gc_thr -= 1
    w["gc_threshold_blocks"] = gc_thr
    faults = gen_faults(rng, 0.3)
    # A failed program retires a block at its next GC, a failed erase leaves one bad, and
    # factory bad blocks take spare space: keep more spare when faults are on.
    min_op = (gc_thr + 1) / bpp + (0.08 if faults else 0.02)
    op = round(min(0.85, min_op + rng.uniform(0.05, 0.3)), 4)
    w["over_provisioning"] = op
    logical_pages = int(planes * bpp * ppb * (1 - op))
    mts = 256
    if chance(rng, 0.3):
        mts = rng.choice([32, 64, 128, 256, 512])
        w["host"] = {"max_transfer_sectors": mts}
        if chance(rng, 0.3):
            w["host"]["queue_depth"] = rng.choice([16, 64, 1024])
    needed = (mts + 2 * spp) * sector
    buf = max(needed, rng.choice([1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB]))
    buf = int(buf * rng.choice([1.0, 1.0, 1.5]))
    buf = buf // sector * sector
    buf = max(needed, min(buf, logical_pages * page // 4 // sector * sector))
    w["buffer_bytes"] = buf
    policy = rng.choice(["fifo", "lru", "mca", "pc-lru"])
    w["buffer_policy"] = policy
    if policy == "fifo" and chance(rng, 0.4):
        w["fifo_drain"] = "whole"
    ftl = rng.choice(["page-rmw", "multi-version", "multi-version"])
    w["ftl"] = ftl
    compaction = ftl == "multi-version" and chance(rng, 0.6)
    w["compaction"] = compaction
    if ftl == "multi-version" and chance(rng, 0.4):
        lo = 1 if compaction else 0
        w["mv_threshold_sectors"] = rng.randint(lo, spp - 1)
    if compaction and chance(rng, 0.4):
        w["region_pages"] = rng.choice([1, 8, 64, 256])
    if chance(rng, 0.3):
        w["max_versions"] = rng.choice([2, 3, 4, 8])
    if chance(rng, 0.3):
        w["idle_merge_batch"] = rng.choice([1, 16, 128])
    if chance(rng, 0.3):
        w["idle_merge_after_ns"] = rng.choice([0, 100000, 1000000])
    if chance(rng, 0.2):
        w["scan_window_pages"] = rng.choice([1, 16, 256])
    t = gen_timing(rng, w.get("cell_mode", "mlc"), False, False)
    if t:
        w["timing"] = t
    if faults:
        w["faults"] = faults
    cfg = {"waflash": {"ssd": w}}
    if chance(rng, 0.3):
        personality = rng.choice(["randomwrite", "fileserver", "webserver", "webproxy"])
        files, mean = {
            "randomwrite": (1, 5_000_000_000),
            "fileserver": (10_000, 128 * KIB),
            "webproxy": (10_000, 128 * KIB),
            "webserver": (1_000, 16 * KIB),
        }[personality]
        default_threads = {"randomwrite": 3, "fileserver": 50, "webserver": 100, "webproxy": 100}
        threads = rng.choice([1, 4, 16]) if chance(rng, 0.3) else None
        logical_bytes = logical_pages * page
        target = logical_bytes * rng.uniform(0.1, 0.35)

        def footprint(personality, scale, threads):
            # The fileset's extent as waflash/src/filebench.rs lays it out: each file in an
            # extent of twice its mean size, at least one file per thread, and the web
            # server's log after them (1 GiB at full scale, at least 16 MiB).
            if personality == "randomwrite":
                return max(int(mean * scale), 8 * KIB)
            n = max(round(files * scale), threads or default_threads[personality])
            log = max(int((1 << 30) * scale), 16 * MIB) if personality == "webserver" else 0
            return n * 2 * mean + log

        scale = 1.0
        while footprint(personality, scale, threads) > target and scale > 1e-7:
            scale *= 0.7
        if footprint(personality, scale, threads) > target and personality != "randomwrite":
            threads = max(1, min(threads or default_threads[personality],
                                 int(target // (4 * mean))))
        if footprint(personality, scale, threads) > target:
            # Too small a device for this personality's fileset: random writes instead.
            personality, files, mean, threads = "randomwrite", 1, 5_000_000_000, None
            scale = min(1.0, target / mean)
        fb = {
            "personality": personality,
            "io_bytes": rng.choice([1024, 2048, 4096, 5120, 8192, 9216]),
            "requests": rng.choice([2000, 5000, 10000, 20000, 50000]),
            "scale": float(f"{scale:.6g}"),
            "seed": rng.randint(1, 1000),
        }
        if threads:
            fb["threads"] = threads
        cfg["waflash"]["filebench"] = fb
        # A Filebench stream cannot go on past a failed read (it has no continue_on_error),
        # and one SSD has no redundancy to correct it, so no read faults here.
        if faults and faults.pop("read_fail_probability", None) and not faults:
            del w["faults"]
    else:
        ctx = JobContext(sector, page, logical_pages * page, min(mts * sector, 1 * MIB))
        ctx.continue_read = bool(faults and faults.get("read_fail_probability"))
        cfg["workload"] = gen_workload(rng, ctx)
    host = gen_host_cpu(rng, 0.15)
    if host:
        cfg["host"] = host
    rep = gen_report(rng)
    if rep:
        cfg["report"] = rep
    return "waflash", cfg


def ox_table_pages(ch, luns, epl, rblock, wblock, eblock):
    wb = wblock
    eblocks = ch * luns * epl
    entries = wb // 8
    rpe = eblock // rblock
    mp = -(-(eblocks * rpe) // entries)
    map_s = -(-mp // max(entries // 2, 1))
    words = -(-rpe // 64)
    gbitv = -(-eblocks // max(entries // words, 1))
    gbitv_s = -(-gbitv // entries)
    wear = -(-eblocks // (wb // 4))
    return mp + map_s + gbitv + gbitv_s + wear


def ox_reserved_eblocks(ch, luns, epl, rblock, wblock, eblock):
    """`OxConfig::reserved_eblocks` (ox/src/config.rs)."""
    total_luns = ch * luns
    system = ch + 2
    open_ = total_luns * 4
    held_back = ch * (2 * luns + 2)
    gc_margin = ch * 2
    pages = ox_table_pages(ch, luns, epl, rblock, wblock, eblock)
    wpe = eblock // wblock
    spread = -(-(4 * pages) // wpe) + total_luns
    meta = 2 * ch + 2 * min(pages, spread)
    return system + open_ + held_back + meta + gc_margin


def gen_ox_run(rng):
    for _attempt in range(50):
        ch = rng.choice([2, 2, 4, 4, 8])
        luns = rng.choice([1, 2, 2, 4])
        rblock = rng.choice([4096, 4096, 4096, 2048, 8192])
        wblock = rblock * rng.choice([1, 2, 4, 8, 16])
        wblock = min(wblock, rblock * 64)
        eblock = wblock * rng.choice([4, 8, 16, 32, 64])
        epl = rng.choice([16, 24, 32, 48, 64, 96])
        while ch * luns * epl * eblock > 256 * MIB and epl > 16:
            epl //= 2
        if ch * luns * epl * eblock > 256 * MIB:
            continue
        reserved = ox_reserved_eblocks(ch, luns, epl, rblock, wblock, eblock)
        data_rblocks = (ch * luns * epl - reserved) * (eblock // rblock)
        # At least 16 MiB of logical space, so that every job's region holds its requests.
        if data_rblocks * rblock >= 16 * MIB:
            break
    else:
        raise RuntimeError("no OX shape found")
    ox = {
        "channels": ch,
        "luns_per_channel": luns,
        "eblocks_per_lun": epl,
    }
    faults = gen_faults(rng, 0.3, allow_read=True, allow_bad=True)
    # Fill most of what the FTL allows, less with faults (bad EBLOCKs come out of the same
    # flash).
    frac = rng.choice([0.2, 0.4, 0.6, 0.8, 0.95]) if not faults else rng.choice([0.2, 0.4, 0.6])
    logical = max(4 * MIB // rblock, int(data_rblocks * frac))
    ox["logical_pages"] = logical
    if chance(rng, 0.3):
        ox["cell_mode"] = rng.choice(["slc", "mlc", "tlc"])
    ox["payload"] = rng.choices(["token", "none"], [9, 1])[0]
    if chance(rng, 0.5):
        ox["map_cache_pages"] = rng.choice([2, 3, 8, 64])
    links = rng.randint(1, ch // 2)
    ox["log_forward_links"] = links
    max_desc = (rblock - 8) // 8
    batch = rng.choice([1, 8, 64, 255, max_desc])
    batch = min(batch, max_desc)
    ox["max_batch_pages"] = batch
    ox["terms"] = {"rblock_bytes": rblock, "wblock_bytes": wblock, "eblock_bytes": eblock,
                   "tag_bytes": rng.choice([16, 16, 24, 32])}
    t = gen_timing(rng, ox.get("cell_mode", "mlc"), chance(rng, 0.1), False)
    if t:
        ox["timing"] = t
    if faults:
        ox["faults"] = faults
    costs = {}
    if chance(rng, 0.3):
        costs["cores"] = rng.choice([1, 2, 4, 8])
    if chance(rng, 0.2):
        costs["context_cpu_ns"] = rng.choice([1000, 25000, 100000])
    if chance(rng, 0.2):
        costs["transport_latency_ns"] = rng.choice([0, 15000, 100000])
    if chance(rng, 0.2):
        costs["packet_bytes"] = rng.choice([4096, 65512])
    if chance(rng, 0.2):
        costs["block_packet_contexts"] = rng.choice([0, 1, 4])
    if chance(rng, 0.2):
        costs["read_lookup_threads"] = rng.choice([0, 1, 2])
    if costs:
        ox["costs"] = costs
    gc = {}
    if chance(rng, 0.5):
        start = rng.choice([0.3, 0.5, 0.7, 0.85])
        gc["start_used_fraction"] = start
        gc["stop_used_fraction"] = round(start - rng.choice([0.0, 0.05, 0.2]), 3)
    if chance(rng, 0.2):
        gc["static_wear_threshold_erases"] = rng.choice([0, 4, 16])
    if chance(rng, 0.3):
        gc["max_gc_channels"] = rng.choice([0, 1, 2, ch])
    if chance(rng, 0.2):
        gc["read_whole_wblocks"] = chance(rng, 0.5)
    if chance(rng, 0.2):
        gc["min_invalid_fraction"] = rng.choice([0.0, 0.25, 0.5, 0.9])
    if chance(rng, 0.1):
        gc["min_invalid_relax_from_used_fraction"] = rng.choice([0.5, 0.7, 0.9])
    if gc:
        ox["gc"] = gc
    if chance(rng, 0.3):
        ox["checkpoint"] = {"enabled": False} if chance(rng, 0.3) else {
            "interval_ns": rng.choice([1_000_000, 5_000_000, 20_000_000, 500_000_000])}
    wc = {}
    if chance(rng, 0.45):
        wc["write_back"] = True
    if chance(rng, 0.3):
        total_luns = ch * luns
        calibrated = ch + 2 + total_luns * 6
        data_bytes = max(0, ch * luns * epl - calibrated) * eblock
        limit = max(0, data_bytes - logical * rblock) // 4
        batch_bytes = batch * rblock
        if limit >= batch_bytes:
            wc["capacity_bytes"] = rng.randint(batch_bytes, limit)
    if wc:
        ox["write_cache"] = wc
    cfg = {"ox": ox}
    host = gen_host_cpu(rng, 0.2)
    if host:
        cfg["host"] = host
    # OXBlock takes at most 256 RBLOCKs per command and 128 commands in flight.
    ctx = JobContext(rblock, wblock, logical * rblock, min(256 * rblock, 1 * MIB))
    ctx.max_qd = 128
    ctx.continue_read = bool(faults and faults.get("read_fail_probability"))
    ctx.max_ios = 8000
    cfg["workload"] = gen_workload(rng, ctx)
    rep = gen_report(rng)
    if rep:
        cfg["report"] = rep
    return "ox", cfg


def generate(seed, engine_filter=None):
    """The configuration of soak seed `seed`: (label, config dict)."""
    rng = random.Random(seed)
    family = rng.choices(FAMILIES, [w for _, w in ENGINES])[0]
    if engine_filter:
        fam = engine_filter.split("/")[0]
        family = fam
    if family == "ssd":
        label, cfg = gen_ssd_run(rng)
    elif family == "waflash":
        label, cfg = gen_waflash_run(rng)
    elif family == "ox":
        label, cfg = gen_ox_run(rng)
    else:
        label, cfg = gen_array_run(rng, family)
    top = {"seed": seed}
    top.update(cfg)
    return label, top


# ---------------------------------------------------------------------------------------
# Running and classifying
# ---------------------------------------------------------------------------------------


def is_config_rejection(msg):
    """Whether an `afa` error (the text after "error: ") says the configuration is invalid,
    as opposed to a run that started and failed."""
    if msg.startswith("configuration "):
        # "configuration PATH: REASON". Preconditioning and aging run the engine, so their
        # failures are the engine's, not the configuration's.
        rest = msg.split(": ", 1)[1] if ": " in msg else msg
        return not rest.startswith(("preconditioning", "aging"))
    keys = ("inline job:", "job file", "job [", "fio option", "invalid ", "array.swan:", "array.log:",
            "ox: ", "waflash.ssd", "unknown field", "unknown variant")
    return msg.startswith(keys)


def panic_detail(stderr):
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if "panicked" in line:
            # Rust prints "thread 'main' panicked at FILE:LINE:COL:" and the message on the
            # next line (older toolchains on the same line).
            detail = line.strip()
            if i + 1 < len(lines) and lines[i + 1].strip() and not lines[i + 1].startswith("note:"):
                detail += " " + lines[i + 1].strip()
            return detail[:400]
    return (lines[-1] if lines else "").strip()[:400]


def run_one(afa, cfg_path, json_path, seed, timeout_s):
    if os.path.exists(json_path):
        os.remove(json_path)
    cmd = [afa, "run", cfg_path, "--seed", str(seed), "--json", json_path, "--quiet"]
    start = time.monotonic()
    # A new session, so that a timeout kills the run and anything it started.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    stack = ""
    try:
        out, err = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        # Before killing it, see where it is: a run that is merely slow and one that loops
        # inside a single command look the same from outside.
        stack = capture_stack(proc.pid, json_path[: -len(".json")] + ".stack")
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return proc.returncode, out, err, timed_out, time.monotonic() - start, stack


def capture_stack(pid, path):
    """Two backtraces of a running `afa`, a few seconds apart, written to `path`; returns the
    engine functions of the innermost frames of the second one (empty without gdb)."""
    if not shutil.which("gdb"):
        return ""
    texts = []
    for i in range(2):
        try:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "bt 60"],
                               capture_output=True, text=True, timeout=60)
            texts.append(r.stdout)
        except (subprocess.TimeoutExpired, OSError):
            break
        if i == 0:
            time.sleep(3)
    with open(path, "w") as f:
        f.write("\n\n----- 3 s later -----\n\n".join(texts))
    if not texts:
        return ""
    frames = []
    for line in texts[-1].splitlines():
        m = re.match(r"#\d+\s+(?:0x[0-9a-f]+ in )?(\S+)", line)
        if m:
            frames.append(m.group(1))
    # Outermost first, the device's own frames only (the host driver, the CLI and the
    # generic `submit` wrappers say nothing), generics stripped:
    # afa_array::log_raid::LogRaid<..>::clean_one<..> -> LogRaid::clean_one.
    names = []
    for name in reversed(frames):
        if not name.startswith(("afa_array", "afa_ssd", "afa_ox", "afa_waflash", "afa_nand")):
            continue
        name = re.sub(r"<[^<>]*(?:<[^<>]*(?:<[^<>]*>[^<>]*)*>[^<>]*)*>", "", name)
        parts = [x for x in name.split("::") if x and not x.startswith("{")]
        if len(parts) < 2 or parts[-1].startswith("submit"):
            continue
        short = "::".join(parts[-2:])
        if not names or names[-1] != short:
            names.append(short)
    if len(names) > 9:
        names = names[:9] + ["..."]
    return " > ".join(names)


def read_fault_note(report):
    """For an ok run: the reads that failed as uncorrectable (continue_on_error=read) and,
    on an array, the member reads its engine corrected. Failed reads on a layout with
    redundancy should be rare next to the corrections (double faults in one stripe)."""
    failed = (report.get("read") or {}).get("errors") or 0
    array = report.get("array") or {}
    corrected = array.get("read_errors_corrected") or 0
    uncorrectable = ((report.get("waflash") or {}).get("device") or {}).get("uncorrectable_reads") or 0
    parts = []
    if failed:
        parts.append(f"{failed} reads failed")
    if corrected:
        parts.append(f"{corrected} member reads corrected")
    if uncorrectable and not failed:
        parts.append(f"{uncorrectable} uncorrectable reads")
    return "(" + ", ".join(parts) + ")" if parts else ""


def classify(rc, err, timed_out, json_path, timeout_s, stack=""):
    if timed_out:
        return "timeout", f"killed after {timeout_s:g} s" + (f"; stuck in {stack}" if stack else "")
    mismatches = None
    report = None
    if os.path.exists(json_path):
        try:
            with open(json_path) as f:
                report = json.load(f)
            # docs/configuration.md, "integrity": sectors that read back wrong.
            mismatches = report["integrity"]["mismatches"]
        except (OSError, ValueError, KeyError, TypeError):
            mismatches = None
    if rc == 101 or "panicked" in err:
        return "panic", panic_detail(err)
    if rc is not None and rc < 0:
        return "panic", f"killed by signal {-rc}: " + (err.strip().splitlines() or [""])[-1][:300]
    if mismatches:
        first = next((l for l in err.splitlines() if l.startswith("error:")), "")
        return "mismatch", f"{mismatches} mismatches; {first[:300]}"
    if rc == 0:
        if mismatches is None:
            return "error", "exit 0 but no readable JSON report"
        return "ok", read_fault_note(report)
    lines = [l for l in err.splitlines() if l.strip()]
    first_error = next((l for l in lines if l.startswith("error:")), lines[0] if lines else "")
    msg = first_error[len("error: "):] if first_error.startswith("error: ") else first_error
    if "read back wrong" in msg:
        return "mismatch", msg[:300]
    if is_config_rejection(msg):
        return "config-rejected", msg[:400]
    return "error", first_error[:400]


def worn_out(outcome, detail):
    """An out-of-space error on a device that had lost blocks to injected faults: expected
    now and then on tiny devices, so the summary marks it. Out of space without any bad
    block would be an FTL bug (the over-provisioning covers the GC reserve)."""
    if outcome != "error" or "out of space" not in detail:
        return False
    # A block or two lost is not wear: ScalaAFA, for one, reports running out of heroes
    # as a member's plane 0 out of space.
    m = re.search(r"(\d+) blocks? bad", detail)
    return bool(m and int(m.group(1)) >= 4)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("first_seed", type=int)
    p.add_argument("count", type=int)
    p.add_argument("--afa", default="target/release/afa")
    p.add_argument("--out", default="soak-out")
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--engine", default=None,
                   help="only this engine family or label: " + ", ".join(FAMILIES))
    args = p.parse_args()
    # Quietly stop when the output is piped into `head`.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if args.engine and args.engine.split("/")[0] not in FAMILIES:
        p.error(f"unknown engine {args.engine!r}; one of {', '.join(FAMILIES)}")
    os.makedirs(args.out, exist_ok=True)

    outcomes = Counter()
    per_engine = defaultdict(Counter)
    notable = []
    t0 = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.count):
        label, cfg = None, None
        # With a label filter (`swan/raid4`), draw again from a derived seed until the label
        # matches; the file still records the soak seed it was run under.
        for attempt in range(200):
            gen_seed = seed if attempt == 0 else seed * 1000003 + attempt
            label, cfg = generate(gen_seed, args.engine)
            if not args.engine or "/" not in args.engine or label == args.engine:
                break
        cfg["seed"] = seed
        cfg_path = os.path.join(args.out, f"c{seed}.toml")
        json_path = os.path.join(args.out, f"c{seed}.json")
        with open(cfg_path, "w") as f:
            f.write(f"# afa soak: seed {seed}, engine {label} (tools/soak.py)\n")
            f.write(to_toml(cfg))
        rc, out, err, timed_out, secs, stack = run_one(args.afa, cfg_path, json_path, seed,
                                                       args.timeout_s)
        with open(os.path.join(args.out, f"c{seed}.stderr"), "w") as f:
            f.write(err)
        outcome, detail = classify(rc, err, timed_out, json_path, args.timeout_s, stack)
        outcomes[outcome] += 1
        per_engine[label][outcome] += 1
        if outcome != "ok":
            notable.append((seed, label, outcome, detail, cfg_path))
        print(f"{seed} {label} {outcome} {detail}".rstrip() + f"  [{secs:.1f}s]", flush=True)

    total = sum(outcomes.values())
    print()
    print(f"{total} runs in {time.monotonic() - t0:.0f} s")
    print("per outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    print("per engine:")
    for label in sorted(per_engine):
        c = per_engine[label]
        print(f"  {label:22s} {sum(c.values()):4d}  " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    if notable:
        print("not ok:")
        for seed, label, outcome, detail, path in notable:
            hint = "  [worn out: plausible]" if worn_out(outcome, detail) else ""
            print(f"  {seed} {label} {outcome} {path}: {detail}{hint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
