#!/usr/bin/python3
"""The Python half of the main job (scripts/run.sh): a small data-parallel
training job (gloo, N processes) checkpoints through the local ckptd with
ckptd.CheckpointManager (async saves every 5 steps, the daemon keeps the
last 2), then a second run of the job resumes from the latest step and
checks that it continues exactly where the first run left off.

Rank 0 prints each checkpoint's stall (the save_async call), then its first
checkpoint's stall and the steady state's (the later ones), each against a
memcpy of the same bytes timed in the same process: the manager reserves the
rank's shared-memory arena in the background after the first step, so the
first checkpoint does not pay for creating it.

    train_demo.py ROOT WORLD        (CKPTD_SOCKET names the daemon)
"""
import ctypes
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ckptd

STEPS = 25
HIDDEN = 1024  # 1.3 M parameters: 15 MiB of model + Adam state per rank


def model_and_optim():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, HIDDEN), torch.nn.ReLU(),
                            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                            torch.nn.Linear(HIDDEN, 10))
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
        t0 = time.perf_counter()  # the whole call: a wait for the reservation too
        if mgr.save_async(i, state):
            stalls.append((i, time.perf_counter() - t0))
    mgr.close()  # waits for the commits
    if rank == 0:
        for i, s in stalls:
            print(f"  {phase}: step {i} saved asynchronously, stall {s * 1e3:.1f} ms")
        print_first_and_steady(phase, stalls, state)
        print(f"  {phase}: committed steps under {root}: {mgr.all_steps()}")
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


def memcpy_of(state):
    """(bytes, seconds): a single-threaded memcpy of the state's tensors
    into pre-faulted buffers, median of 5."""
    sd = {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()}
    src = [t for t in ckptd.flatten_state_dict(sd)[0].values()
           if torch.is_tensor(t) and t.is_contiguous()]
    dst = [torch.ones_like(t) for t in src]
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for a, b in zip(src, dst):
            ctypes.memmove(b.data_ptr(), a.data_ptr(), a.numel() * a.element_size())
        times.append(time.perf_counter() - t0)
    return sum(t.numel() * t.element_size() for t in src), statistics.median(times)


def print_first_and_steady(phase, stalls, state):
    nbytes, copy = memcpy_of(state)
    (first_step, first), rest = stalls[0], stalls[1:]
    print(f"  {phase}: first checkpoint (step {first_step}): stall {first * 1e3:.1f} ms = "
          f"{first / copy:.2f}x a memcpy of its {nbytes / 2**20:.0f} MiB ({copy * 1e3:.1f} ms, "
          f"same process)")
    if rest:
        steady = statistics.median(s for _, s in rest)
        print(f"  {phase}: steady state (steps {', '.join(str(i) for i, _ in rest)}): stall "
              f"{steady * 1e3:.1f} ms = {steady / copy:.2f}x that memcpy; first / steady "
              f"{first / steady:.2f}x")


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
