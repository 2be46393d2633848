#!/usr/bin/python3
"""ckptd daemon benchmark: one command, every ratio measured in the same run.

    /usr/bin/python3 bench/daemon_bench.py [--quick] [--json FILE] [--dir DIR]

Workloads (each starts its own daemon, so peak RSS is per workload):
  stall_1g      1 rank, 1 GiB in 16 tensors: trainer stall (Save until
                "staged", steady state after a warm-up save) vs a plain
                single-threaded memcpy of the same bytes   target <= 1.3x
  durable_1g    same run: bytes / (Save start -> commit) vs raw sequential
                4 MiB pwrite + fsync of the same bytes to the same
                directory                                  target >= 0.90x
  vs_torch_2g   1 rank, 2 GiB in 64 x 32 MiB float32 tensors: ckptd stall
                and durable time vs Debian torch 1.13 torch.save + fsync of
                the same state dict                        targets <= 0.1x, <= 1.0x
  rss_4x_budget staging_budget 256 MiB, 1 GiB saved (streams through the
                budget): daemon peak RSS (VmHWM) vs budget + 64 MiB

Buffers are pre-faulted before timing (see environment.md). The daemon and
the trainer run on the same 2 cores, as they would on a node. Exit status:
0 all targets met, 1 a target missed, 2 error.
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))
MIB = 1 << 20


class Daemon:
    def __init__(self, root, *flags):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket = self.root / "ckptd.sock"
        self.ckpt = self.root / "ckpt"
        self.ckpt.mkdir(parents=True, exist_ok=True)
        # Arenas live in tmpfs, as in production (/dev/shm/ckptd by default).
        self.shm = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-bench-", dir="/dev/shm"))
        self.log = open(self.root / "ckptd.log", "w")
        self.proc = subprocess.Popen(
            [str(BUILD / "bin" / "ckptd"), f"--socket={self.socket}",
             f"--checkpoint_roots={self.ckpt}", f"--shm_dir={self.shm}",
             f"--state_dir={self.root / 'state'}", "--log_level=warn", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if self.socket.exists():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptd exited {self.proc.returncode}; see {self.log.name}")
            time.sleep(0.02)
        raise RuntimeError("ckptd did not create its socket")

    def peak_rss_bytes(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.log.close()
        shutil.rmtree(self.shm, ignore_errors=True)


def trainer(daemon, prefix, nbytes, tensors, repeat, raw=True):
    cmd = [str(BUILD / "bin" / "daemon_bench"), f"--socket={daemon.socket}",
           f"--checkpoint-prefix={prefix}", f"--bytes={nbytes}", f"--tensors={tensors}",
           f"--repeat={repeat}"]
    if raw:
        cmd.append(f"--raw-file={daemon.ckpt / 'raw.bin'}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"daemon_bench failed: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


TORCH_SAVE = r"""
import os, sys, time, torch
path, n, per, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sd = {f"layer.{i}.weight": torch.ones(per // 4, dtype=torch.float32) for i in range(n)}
times = []
for k in range(repeat):
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
    times.append(time.perf_counter() - t0)
    os.unlink(path)
times.sort()
print(times[len(times) // 2])
"""


def torch_save_seconds(path, tensors, nbytes, repeat):
    per = nbytes // tensors
    out = subprocess.run(["/usr/bin/python3", "-c", TORCH_SAVE, str(path), str(tensors),
                          str(per), str(repeat)], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"torch.save baseline failed: {out.stderr}")
    return float(out.stdout.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--dir", help="work directory (default: a temp dir under the build dir)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--daemon-flag", action="append", default=[],
                    help="extra ckptd flag for every workload (e.g. --daemon-flag=--io_backend=pwrite)")
    args = ap.parse_args()
    scale = 1 / 16 if args.quick else 1
    work = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="daemon_bench-", dir=BUILD))
    work.mkdir(parents=True, exist_ok=True)
    results, missed = [], []

    def report(name, value, unit, ref_name, ref, ratio, target, cmp):
        ok = ratio <= target if cmp == "<=" else ratio >= target
        results.append({"workload": name, "value": value, "unit": unit, "reference": ref_name,
                        "reference_value": ref, "ratio": ratio, "target": f"{cmp} {target}",
                        "met": ok})
        print(f"{name:<24} {value:10.3f} {unit:<5} | {ref_name:<30} {ref:10.3f} | "
              f"ratio {ratio:6.3f} (target {cmp} {target}) {'ok' if ok else 'MISSED'}",
              flush=True)
        if not ok:
            missed.append(name)

    try:
        # 1 + 2: stall vs memcpy, durable vs raw write+fsync (same run).
        nbytes = int((1 << 30) * scale)
        d = Daemon(work / "w1", "--staging_budget=2G", *args.daemon_flag)
        try:
            r = trainer(d, "stall", nbytes, 16, args.repeat)
            rss1 = d.peak_rss_bytes()
        finally:
            d.stop()
        report("stall_1g", r["stall_s"] * 1e3, "ms", "memcpy of the same bytes (ms)",
               r["memcpy_s"] * 1e3, r["stall_s"] / r["memcpy_s"], 1.3, "<=")
        gbs = r["bytes"] / r["durable_s"] / 1e9
        raw_gbs = r["bytes"] / r["raw_s"] / 1e9
        report("durable_1g", gbs, "GB/s", "raw write+fsync (GB/s)", raw_gbs, gbs / raw_gbs, 0.9,
               ">=")
        print(f"  (first save, arena creation included: stall {r['first_stall_s'] * 1e3:.1f} ms; "
              f"copy part of the stall {r['copy_s'] * 1e3:.1f} ms; daemon peak RSS "
              f"{rss1 / MIB:.0f} MiB)", flush=True)

        # 3: vs torch.save + fsync, 2 GiB in 64 x 32 MiB.
        nbytes = int((2 << 30) * scale)
        d = Daemon(work / "w2", "--staging_budget=4G", *args.daemon_flag)
        try:
            r2 = trainer(d, "torch", nbytes, 64, args.repeat, raw=False)
        finally:
            d.stop()
        ts = torch_save_seconds(work / "w2" / "ckpt" / "torch.pt", 64, nbytes, args.repeat)
        report("vs_torch_2g_stall", r2["stall_s"], "s", "torch.save + fsync (s)", ts,
               r2["stall_s"] / ts, 0.1, "<=")
        report("vs_torch_2g_durable", r2["durable_s"], "s", "torch.save + fsync (s)", ts,
               r2["durable_s"] / ts, 1.0, "<=")

        # 4: peak RSS while saving 4x the staging budget.
        budget = int(256 * MIB * scale)
        nbytes = 4 * budget
        d = Daemon(work / "w3", f"--staging_budget={budget}", *args.daemon_flag)
        try:
            r3 = trainer(d, "rss", nbytes, 16, 1, raw=False)
            rss = d.peak_rss_bytes()
        finally:
            d.stop()
        report("rss_4x_budget", rss / MIB, "MiB", "staging budget + 64 MiB",
               (budget + 64 * MIB) / MIB, rss / (budget + 64 * MIB), 1.0, "<=")
        print(f"  ({r3['bytes'] / MIB:.0f} MiB saved in {r3['batches']} batches through a "
              f"{budget / MIB:.0f} MiB budget; durable {r3['durable_s']:.2f} s)", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"daemon_bench: {e}", file=sys.stderr)
        return 2
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print("all targets met" if not missed else f"missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
