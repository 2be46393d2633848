#!/usr/bin/env python3
"""ckptctl convert --format safetensors (and ckptctl import) against a copy
of the same bytes measured in the same run.

    /usr/bin/python3 bench/export_bench.py [--mib 1024] [--runs 3]

A ckptd_demo checkpoint of --mib MiB (4 ranks, row-sharded float32
weights, replicated biases) is exported to safetensors (float32, then
bf16), and the torch.save file `ckptctl convert` writes is imported back;
the reference is `cp` of the checkpoint's data files (read + write of the
same bytes, page cache warm like the export's). Prints median wall times,
the ratio to the copy, and each command's peak RSS (ru_maxrss of the child,
measured from a small parent so the parent's own RSS does not leak in).
"""
import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))
MEASURE = ("import os, subprocess, sys, time\n"
           "t = time.monotonic()\n"
           "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
           "_, status, usage = os.wait4(p.pid, 0)\n"
           "print(time.monotonic() - t, usage.ru_maxrss, os.waitstatus_to_exitcode(status))\n")


def timed(argv):
    """(seconds, peak RSS bytes) of one run of argv."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *map(str, argv)],
                         capture_output=True, text=True, check=True).stdout.split()
    secs, rss, rc = float(out[0]), int(out[1]) << 10, int(out[2])
    if rc != 0:
        raise SystemExit(f"{argv} exited {rc}")
    return secs, rss


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    ckptctl = BUILD / "bin" / "ckptctl"
    with tempfile.TemporaryDirectory(prefix="ckptd_export_bench_", dir="/var/tmp") as tmp:
        tmp = pathlib.Path(tmp)
        ck = tmp / "ck"
        subprocess.run([BUILD / "bin" / "ckptd_demo", "--dir", ck, "--size-mb", str(a.mib),
                        "--save-ranks", "4", "--load-ranks", "1"], check=True,
                       capture_output=True)
        size = sum(f.stat().st_size for f in ck.iterdir())
        subprocess.run([ckptctl, "convert", ck, tmp / "full.pt"], check=True, capture_output=True)
        rows = {"copy (reference)": [], "export float32": [], "export bf16": [], "import": []}
        rss = {k: 0 for k in rows}
        for _ in range(a.runs):
            for name, argv, out in [
                    ("copy (reference)", ["cp", "-r", ck, tmp / "copy"], tmp / "copy"),
                    ("export float32", [ckptctl, "convert", ck, tmp / "hf", "--format",
                                        "safetensors"], tmp / "hf"),
                    ("export bf16", [ckptctl, "convert", ck, tmp / "hf16", "--format",
                                     "safetensors", "--dtype", "bf16"], tmp / "hf16"),
                    ("import", [ckptctl, "import", tmp / "full.pt", tmp / "imp"], tmp / "imp")]:
                shutil.rmtree(out, ignore_errors=True)
                secs, peak = timed(argv)
                rows[name].append(secs)
                rss[name] = max(rss[name], peak)
        ref = statistics.median(rows["copy (reference)"])
        print(f"checkpoint: {size / 2**20:.0f} MiB in {len(list(ck.iterdir())) - 1} data files; "
              f"medians of {a.runs} runs")
        for name, times in rows.items():
            med = statistics.median(times)
            print(f"  {name:18s} {med:6.2f} s  {size / med / 2**20:7.0f} MiB/s  "
                  f"{med / ref:5.2f}x copy  peak RSS {rss[name] / 2**20:5.0f} MiB")


if __name__ == "__main__":
    main()
