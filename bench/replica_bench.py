#!/usr/bin/python3
"""Peer replicas (peer_replicas, docs/restore.md "Peer replicas"): a lost
node's restore from a peer's memory against cold storage and memcpy, and the
trainers' save stall while replicas are pushed, every figure beside its
reference measured in the same run.

    /usr/bin/python3 bench/replica_bench.py [--gib 1] [--saves 3]
        [--rate 0] [--json FILE]

Two nodes, each in its own network namespace with its own daemon (the
harness of tests/netns: veth pairs into a bridge, real TCP between the
daemons), one rank each, --gib GiB in all (float32 tensors of 64 MiB, each
rank a row block of each), memory tiers on.

  save stall      each rank's ckptd.async_save call (the time the trainer is
                  held), for --saves saves back to back (each waits for its
                  commit, so a save's push of replicas runs while the next
                  one stages and writes): the mean stall of saves 2.. with
                  peer_replicas=1 against the same with peer_replicas=0
                  (target <= 1.1x)
  restore         node 1 is then replaced: its daemon killed, its state and
                  shm wiped, a fresh daemon started; the page cache dropped;
                  its rank (a new process: torch imported, the client
                  library loaded, its tensors pre-faulted) restores its
                  share through the daemon, which fetches it from node 0's
                  memory (peer_restore=prefer), then again with a fresh
                  daemon and peer_restore=off (cold storage), then copies
                  the same bytes from tensors of its own (memcpy):
                  peer / cold storage (target <= 0.2x), memcpy / peer
                  (target >= 0.4x)
Every restore checks its values (a checksum per tensor, after the clock).
Needs root (namespaces, drop_caches). Exit status: 0 targets met, 1 missed,
2 error.
"""
import argparse
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "tests" / "testing"))
TENSOR_MIB = 64


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def shard_state(gib, world, rank, fill):
    """Rank `rank`'s row block of each 64 MiB tensor of a --gib GiB state."""
    import ckptd
    import torch
    n = max(1, int(gib * 1024 // TENSOR_MIB))
    cols = 4096
    rows = TENSOR_MIB * (1 << 20) // 4 // cols
    per = rows // world
    sd = {}
    for i in range(n):
        t = torch.empty(per, cols, dtype=torch.float32)
        if fill:
            torch.arange(per * cols, dtype=torch.float32, out=t.view(-1)).mul_(1e-6).add_(
                i + rank * 1000)
        else:
            t.zero_()  # pre-faulted
        sd[f"layer{i:03d}.weight"] = ckptd.Shard(t, (rank * per, 0), (rows, cols))
    return sd


def checksum(sd):
    return {k: float(v.tensor.double().sum()) for k, v in sd.items()}


def child_save(a):
    import ckptd
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=300))
    sd = shard_state(a.gib, a.world, a.rank, fill=True)
    cluster = ckptd.discover_cluster()
    assert cluster is not None and cluster.num_nodes == a.world, cluster
    stalls = []
    for s in range(a.saves):
        dist.barrier()
        t0 = time.monotonic()
        fut = ckptd.async_save(sd, f"{a.dir}/step{s}", cluster=cluster)
        stalls.append(time.monotonic() - t0)
        st = fut.result(600)
        assert st.state == "COMMITTED", st
    dist.barrier()
    print(json.dumps({"stalls": stalls, "sums": checksum(sd)}), flush=True)
    dist.destroy_process_group()


def child_load(a):
    import ckptd
    from ckptd import _native
    _native.library_api_version()  # loads the library
    sd = shard_state(a.gib, a.world, a.rank, fill=False)
    src = shard_state(a.gib, a.world, a.rank, fill=True)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 2
    t0 = time.monotonic()
    if a.mode == "memcpy":
        for k, s in sd.items():
            s.tensor.copy_(src[k].tensor)
    else:
        ckptd.load(sd, a.dir, via_daemon=True, local_rank=0, local_world_size=1)
    took = time.monotonic() - t0
    print(json.dumps({"seconds": took, "ok": checksum(sd) == checksum(src)}), flush=True)
    return 0


def child(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--child", choices=["save", "load"])
    p.add_argument("--mode", default="daemon")
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--gib", type=float)
    p.add_argument("--saves", type=int, default=1)
    p.add_argument("--dir")
    a = p.parse_args(argv)
    return child_save(a) if a.child == "save" else child_load(a)


def env_for(c, node):
    env = dict(c.trainer_env(node))
    env.update({"MASTER_PORT": "29511", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "USE_LIBUV": "0", "PYTHONPATH": str(REPO / "client" / "python"),
                "CKPTD_CLIENT_LIB": str(BUILD / "client" / "libckptd_client.so")})
    return env


def run_saves(c, args, base):
    procs = [c.popen(n, [sys.executable, __file__, "--child", "save", "--rank", n, "--world",
                         2, "--gib", args.gib, "--saves", args.saves, "--dir", base],
                     env_for(c, n), stdout=subprocess.PIPE, text=True) for n in range(2)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"a saving rank failed (exit {p.returncode})\n"
                               f"{c.log_tail(0)}\n{c.log_tail(1)}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def restore_on_node1(c, args, src, mode):
    p = c.popen(1, [sys.executable, __file__, "--child", "load", "--mode", mode, "--rank", 1,
                    "--world", 2, "--gib", args.gib, "--dir", src], env_for(c, 1),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the {mode} rank did not start (exit {p.wait(60)})")
    drop_caches()
    p.stdin.write("go\n")
    p.stdin.flush()
    line = p.stdout.readline().strip()
    if p.wait(timeout=900) != 0 or not line:
        raise RuntimeError(f"the {mode} restore failed (exit {p.returncode})\n{c.log_tail(1)}")
    r = json.loads(line)
    if not r["ok"]:
        raise RuntimeError(f"the {mode} restore read wrong values")
    return r["seconds"]


def replace_node1(c, peer_restore):
    c.kill(1)
    for sub in ("state", "shm"):
        d = c.node_dir(1) / sub
        shutil.rmtree(d)
        d.mkdir()
    c.set_option(1, "peer_restore", peer_restore)
    c.start_daemon(1)


def cluster(workdir, replicas, args):
    import netns_cluster
    opts = {"memory_tier_bytes": f"{int(args.gib * 3 + 1)}G", "peer_replicas": str(replicas),
            "staging_budget": f"{int(args.gib + 1)}G", "replica_rate_limit": str(args.rate),
            "restore_threads": "2"}
    c = netns_cluster.NetnsCluster(2, workdir, BUILD, daemon_options=opts)
    peers = ",".join(c.peer_address(i) for i in range(2))
    for i in range(2):
        c.set_option(i, "restore_peers", peers)
        c.start_daemon(i)
    return c


def main():
    if "--child" in sys.argv:
        return child(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--rate", default="0", help="replica_rate_limit")
    p.add_argument("--json")
    args = p.parse_args()
    import netns_cluster
    reason = netns_cluster.skip_reason()
    if reason:
        print(f"replica_bench: {reason}", file=sys.stderr)
        return 2
    work = pathlib.Path(tempfile.mkdtemp(prefix="replica-bench-", dir="/tmp"))
    stalls = {}
    try:
        for replicas in (0, 1):
            c = cluster(work / f"r{replicas}", replicas, args)
            try:
                base = c.shared / "job"
                outs = run_saves(c, args, base)
                later = [s for o in outs for s in o["stalls"][1:]] or \
                    [s for o in outs for s in o["stalls"]]
                stalls[replicas] = sum(later) / len(later)
                print(f"peer_replicas={replicas}: stalls per rank "
                      f"{[[round(x, 3) for x in o['stalls']] for o in outs]}", flush=True)
                if replicas == 0:
                    continue
                newest = f"{base}/step{args.saves - 1}"
                deadline = time.monotonic() + 300
                pushed = f"checkpoint {newest}: this node's share"
                while not any(pushed in ln and "is held in the memory of node" in ln
                              for ln in c.log(1).splitlines()):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"node 1's share was not replicated\n{c.log_tail(1)}")
                    time.sleep(0.2)
                replace_node1(c, "prefer")
                before = c.metric(1, "ckptd_restore_bytes_total", source="peer")
                peer = restore_on_node1(c, args, newest, "daemon")
                fetched = c.metric(1, "ckptd_restore_bytes_total", source="peer") - before
                replace_node1(c, "off")
                cold = restore_on_node1(c, args, newest, "daemon")
                memcpy = restore_on_node1(c, args, newest, "memcpy")
            finally:
                c.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    share = args.gib / 2
    fig = {
        "gib": args.gib, "share_gib": share, "saves": args.saves, "rate": args.rate,
        "stall_s": {"replicas_0": stalls[0], "replicas_1": stalls[1],
                    "ratio": stalls[1] / stalls[0]},
        "restore_s": {"peer": peer, "cold_storage": cold, "memcpy": memcpy,
                      "peer_over_cold": peer / cold, "memcpy_over_peer": memcpy / peer,
                      "peer_bytes": fetched},
    }
    print(f"save stall (mean of saves 2..{args.saves}): peer_replicas=1 {stalls[1]:.3f} s, "
          f"=0 {stalls[0]:.3f} s: {fig['stall_s']['ratio']:.2f}x (target <= 1.1x)")
    print(f"restore of a replaced node's {share:.2f} GiB share: from a peer's memory {peer:.3f} s "
          f"({fetched / 2**30:.2f} GiB fetched, {share / peer:.2f} GiB/s), cold storage "
          f"{cold:.3f} s, memcpy {memcpy:.3f} s: peer / cold {peer / cold:.2f}x "
          f"(target <= 0.2x), memcpy / peer {memcpy / peer:.2f}x (target >= 0.4x)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(fig, indent=1))
    met = fig["stall_s"]["ratio"] <= 1.1 and peer / cold <= 0.2 and memcpy / peer >= 0.4
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
