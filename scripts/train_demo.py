#!/usr/bin/python3
"""The Python half of the main job (scripts/run.sh): a small data-parallel
training job (gloo, N processes) checkpoints through the local ckptd with
ckptd.CheckpointManager (async saves every 5 steps, the daemon keeps the
last 2), then a second run of the job resumes from the latest step and
checks that it continues exactly where the first run left off.

    train_demo.py ROOT WORLD        (CKPTD_SOCKET names the daemon)
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ckptd

STEPS = 23


def model_and_optim():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    return m, torch.optim.Adam(m.parameters(), lr=1e-3)


def step(model, optim, rank, i):
    g = torch.Generator().manual_seed(i * 100 + rank)
    x, y = torch.randn(32, 256, generator=g), torch.randint(0, 10, (32,), generator=g)
    optim.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optim.step()


def run(rank, world, root, init, phase, out):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    model, optim = model_and_optim()
    state = {"model": model, "optim": optim, "meta": {"step": 0}}
    mgr = ckptd.CheckpointManager(root, save_interval_steps=5, keep_last_n=2)
    start = 0
    if phase == "resume":
        start = mgr.latest_step()
        mgr.restore(start, state)
        assert state["meta"]["step"] == start
    stalls = []
    for i in range(start + 1, STEPS + 1 if phase == "resume" else 16):
        step(model, optim, rank, i)
        state["meta"]["step"] = i
        if mgr.save_async(i, state):
            stalls.append((i, mgr.pending()[-1].stats.stall_seconds))
    mgr.close()  # waits for the commits
    if rank == 0:
        for i, s in stalls:
            print(f"  {phase}: step {i} saved asynchronously, stall {s * 1e3:.1f} ms")
        print(f"  {phase}: committed steps under {root}: {mgr.all_steps()}")
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


def main():
    root, world = os.path.abspath(sys.argv[1]), int(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        # Run 1 trains steps 1..15 (checkpoints 5, 10, 15), then "dies";
        # run 2 resumes from step 15 and trains to STEPS.
        for phase in ("train", "resume"):
            mp.spawn(run, args=(world, root, os.path.join(tmp, f"init-{phase}"), phase,
                                os.path.join(tmp, f"{phase}.pt")), nprocs=world)
        # Reference: one uninterrupted run of all the steps.
        mp.spawn(run_reference, args=(world, os.path.join(tmp, "init-ref"),
                                      os.path.join(tmp, "ref.pt")), nprocs=world)
        got, ref = torch.load(os.path.join(tmp, "resume.pt")), torch.load(
            os.path.join(tmp, "ref.pt"))
        assert all(torch.equal(got[k], ref[k]) for k in ref), "resumed run diverged"
    print(f"  resumed run == uninterrupted run after {STEPS} steps (bit-exact)")


def run_reference(rank, world, init, out):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    model, optim = model_and_optim()
    for i in range(1, STEPS + 1):
        step(model, optim, rank, i)
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
