"""One rank of a multi-process test of the ckptd Python package
(test_pyclient_dist.py). Ranks form a real gloo process group
(file:// rendezvous); rank and world size reach ckptd from the group.

  pyclient_worker.py SCENARIO PHASE RANK WORLD INIT_FILE SOCKET CKPT OUT [EXTRA]

Scenarios:
  replicated  DDP-style: the same Net + Adam on every rank, gradients
              averaged with all_reduce. save: train, ckptd.save, dump the
              reference; load: fresh Net + fresh Adam, ckptd.load, compare
              with the reference, then train on.
  sharded     an embedding table row-sharded unevenly over the ranks
              (ckptd.Shard) plus a replicated head, with FQN-keyed Adam state
              (the shape of FSDP's optimizer state dict). save: train, save,
              dump every rank's shard; load: new sharding for this world
              size, ckptd.load, compare against the saved ranks' shards; with
              EXTRA, save the loaded state again as checkpoint EXTRA.
  async       replicated training; async_save at step 2, then training goes
              on while the daemon writes; the checkpoint must hold the step-2
              values.
  preempt     only rank 0 gets SIGTERM; CheckpointManager(save_on_preemption)
              makes every rank save the same step.
  multinode   `sharded` save through several daemons (each rank's SOCKET is
              its node's daemon): ckptd.discover_cluster() groups the ranks
              by daemon and names rank 0's daemon the coordinator; then a
              CheckpointManager (cluster="auto") saves step 4 next to CKPT.
Prints "OK <scenario> <phase> rank <r>" on success.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import ckptd

N_ROWS, DIM = 37, 24
CLUSTER = None  # multinode: this node's ckptd.Cluster


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def ddp_step(model, optim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 16, generator=g)
    y = torch.randint(0, 8, (16,), generator=g)
    optim.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optim.step()


def fresh_net(seed):
    torch.manual_seed(seed)
    m = Net()
    return m, torch.optim.Adam(m.parameters(), lr=1e-2)


def rows(world, rank):
    """Uneven row split of the table: rank r gets [a, b)."""
    cuts = [round(N_ROWS * i * i / (world * world)) for i in range(world + 1)]
    cuts[-1] = N_ROWS
    return cuts[rank], cuts[rank + 1]


def replicated(phase, rank, ckpt, out):
    if phase == "save":
        model, optim = fresh_net(0)
        for step in range(3):
            ddp_step(model, optim, seed=100 * step + rank)
        st = ckptd.save({"model": model, "optim": optim, "step": 3}, ckpt)
        assert st.state == "COMMITTED", st
        if rank == 0:
            torch.save({"model": model.state_dict(), "optim": optim.state_dict()},
                       os.path.join(out, "ref.pt"))
        return
    ref = torch.load(os.path.join(out, "ref.pt"))
    model, optim = fresh_net(1000 + rank)
    state = {"model": model, "optim": optim, "step": 0}
    ckptd.load(state, ckpt)
    assert state["step"] == 3
    for k, v in ref["model"].items():
        assert torch.equal(model.state_dict()[k], v), k
    got = optim.state_dict()
    assert got["param_groups"] == ref["optim"]["param_groups"]
    for pid, s in ref["optim"]["state"].items():
        for name, v in s.items():
            assert torch.equal(got["state"][pid][name], v), (pid, name)
    ddp_step(model, optim, seed=7)  # trains on from the restored state


def sharded_state(world, rank, emb_local, head, optim, step):
    a, _ = rows(world, rank)
    s = optim.state
    p_emb, p_head = optim.param_groups[0]["params"]

    def shard(t):
        return ckptd.Shard(t, (a, 0), (N_ROWS, DIM))

    groups = [{k: v for k, v in g.items() if k != "params"} for g in optim.param_groups]
    groups[0]["params"] = ["model.emb", "model.head"]
    return {
        "model": {"emb": shard(emb_local), "head": head},
        "optim": {
            "state": {
                "model.emb": {"exp_avg": shard(s[p_emb]["exp_avg"]),
                              "exp_avg_sq": shard(s[p_emb]["exp_avg_sq"]),
                              "step": s[p_emb]["step"]},
                "model.head": {"exp_avg": s[p_head]["exp_avg"],
                               "exp_avg_sq": s[p_head]["exp_avg_sq"],
                               "step": s[p_head]["step"]},
            },
            "param_groups": groups,
        },
        "step": step,
    }


def make_sharded(world, rank, init):
    a, b = rows(world, rank)
    if init:
        full = torch.arange(N_ROWS * DIM, dtype=torch.float32).reshape(N_ROWS, DIM) / 100
        emb = torch.nn.Parameter(full[a:b].clone())
        head = torch.nn.Parameter(torch.linspace(-1, 1, DIM * 3).reshape(DIM, 3))
    else:
        emb = torch.nn.Parameter(torch.zeros(b - a, DIM))
        head = torch.nn.Parameter(torch.zeros(DIM, 3))
    optim = torch.optim.Adam([emb, head], lr=0.05)
    return emb, head, optim


def sharded_train_step(emb, head, optim, seed):
    g = torch.Generator().manual_seed(seed)
    optim.zero_grad()
    if emb.shape[0]:
        x = emb[torch.randint(0, emb.shape[0], (8,), generator=g)]
    else:
        x = torch.zeros(8, DIM)
    loss = (x @ head).pow(2).mean()
    loss.backward()
    dist.all_reduce(head.grad)
    head.grad /= dist.get_world_size()
    optim.step()


def sharded(phase, rank, world, ckpt, out, extra):
    if phase == "save":
        emb, head, optim = make_sharded(world, rank, init=True)
        for step in range(3):
            sharded_train_step(emb, head, optim, seed=step * 10 + rank)
        with torch.no_grad():
            state = sharded_state(world, rank, emb.detach(), head.detach(), optim, 3)
            ckptd.save(state, ckpt, cluster=CLUSTER)
            torch.save({"rows": rows(world, rank), "emb": emb.detach(),
                        "exp_avg": optim.state[emb]["exp_avg"],
                        "exp_avg_sq": optim.state[emb]["exp_avg_sq"], "head": head.detach(),
                        "head_exp_avg": optim.state[head]["exp_avg"],
                        "lr": optim.param_groups[0]["lr"]},
                       os.path.join(out, f"ref_rank{rank}.pt"))
        return
    # Load with this world size's sharding into fresh parameters and state.
    refs = [torch.load(os.path.join(out, f)) for f in sorted(os.listdir(out))
            if f.startswith("ref_rank")]
    full = {}
    for key in ("emb", "exp_avg", "exp_avg_sq"):
        t = torch.empty(N_ROWS, DIM)
        for r in refs:
            t[r["rows"][0]:r["rows"][1]] = r[key]
        full[key] = t
    emb, head, optim = make_sharded(world, rank, init=False)
    a, b = rows(world, rank)
    # Destination optimizer state: tensors of the new shapes, like a fresh
    # FSDP optimizer state dict.
    for p in (emb, head):
        optim.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                          "exp_avg_sq": torch.zeros_like(p)}
    optim.param_groups[0]["lr"] = 0.0
    with torch.no_grad():
        state = sharded_state(world, rank, emb.detach(), head.detach(), optim, 0)
        ckptd.load(state, ckpt)
    assert state["step"] == 3
    assert torch.equal(emb.detach(), full["emb"][a:b]), (rank, a, b)
    assert torch.equal(optim.state[emb]["exp_avg"], full["exp_avg"][a:b])
    assert torch.equal(optim.state[emb]["exp_avg_sq"], full["exp_avg_sq"][a:b])
    assert torch.equal(head.detach(), refs[0]["head"])
    assert torch.equal(optim.state[head]["exp_avg"], refs[0]["head_exp_avg"])
    assert int(optim.state[emb]["step"]) == 3
    assert state["optim"]["param_groups"][0]["lr"] == refs[0]["lr"]
    optim.param_groups[0]["lr"] = state["optim"]["param_groups"][0]["lr"]
    if extra:
        with torch.no_grad():
            ckptd.save(sharded_state(world, rank, emb.detach(), head.detach(), optim, 3), extra)
    sharded_train_step(emb, head, optim, seed=99)


def async_scenario(phase, rank, world, ckpt, out):
    model, optim = fresh_net(0)
    ddp_step(model, optim, seed=1 + rank)
    ddp_step(model, optim, seed=11 + rank)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    handle = ckptd.async_save({"model": model, "optim": optim, "step": 2}, ckpt)
    overlapped = 0
    for step in range(3, 200):
        ddp_step(model, optim, seed=step * 7 + rank)  # changes every parameter in place
        done = handle.done()
        overlapped += 0 if done else 1
        # Every rank must run the same number of steps (each is a
        # collective): stop once the checkpoint is final for all of them.
        all_done = torch.tensor([1 if done else 0])
        dist.all_reduce(all_done, op=dist.ReduceOp.MIN)
        if all_done.item():
            break
    st = handle.result(timeout=120)
    assert st.state == "COMMITTED"
    print(f"rank {rank}: {overlapped} training steps overlapped the write")
    # Enough overlap on rank 0 is asserted by the test (the daemon's write
    # rate limit makes the write last seconds).
    m2, o2 = fresh_net(500)
    state = {"model": m2, "optim": o2, "step": 0}
    ckptd.load(state, st.checkpoint_id)
    assert state["step"] == 2
    for k, v in m2.state_dict().items():
        assert torch.equal(v, snapshot[k]), f"torn: {k} differs from the step-2 value"
        assert not torch.equal(v, model.state_dict()[k]), f"{k} did not change after the save"
    assert int(o2.state_dict()["state"][0]["step"]) == 2
    print(f"OVERLAP {overlapped}")


def preempt_scenario(rank, ckpt_root):
    """Only rank 0 gets SIGTERM (at step 3); the ranks agree on the
    preemption step through the manager's all_reduce and save it together."""
    model, optim = fresh_net(0)
    mgr = ckptd.CheckpointManager(ckpt_root, save_interval_steps=1000, save_on_preemption=True)
    for step in range(1, 200):
        ddp_step(model, optim, seed=step * 3 + rank)
        if rank == 0 and step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        mgr.save_async(step, {"model": model, "optim": optim})
        if mgr.reached_preemption(step):
            break
    mgr.close()
    assert mgr.all_steps() == [step], mgr.all_steps()
    print(f"PREEMPTED_AT {step}")


def main():
    scenario, phase, rank, world, init_file, socket, ckpt, out = sys.argv[1:9]
    extra = sys.argv[9] if len(sys.argv) > 9 else ""
    rank, world = int(rank), int(world)
    os.environ["CKPTD_SOCKET"] = socket
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    t0 = time.time()
    if scenario == "replicated":
        replicated(phase, rank, ckpt, out)
    elif scenario == "sharded":
        sharded(phase, rank, world, ckpt, out, extra)
    elif scenario == "async":
        async_scenario(phase, rank, world, ckpt, out)
    elif scenario == "preempt":
        preempt_scenario(rank, ckpt)
    elif scenario == "multinode":
        global CLUSTER
        CLUSTER = ckptd.discover_cluster()
        assert CLUSTER is not None and rank in CLUSTER.local_ranks, CLUSTER
        print(f"CLUSTER rank {rank} {CLUSTER}")
        sharded(phase, rank, world, ckpt, out, extra)
        mgr = ckptd.CheckpointManager(os.path.join(os.path.dirname(ckpt), "mgr"), 1)
        assert mgr.cluster == CLUSTER, (mgr.cluster, CLUSTER)
        emb, head, optim = make_sharded(world, rank, init=True)
        sharded_train_step(emb, head, optim, seed=rank)
        with torch.no_grad():
            mgr.save(4, sharded_state(world, rank, emb.detach(), head.detach(), optim, 4))
        assert mgr.latest_step() == 4
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    dist.barrier()
    dist.destroy_process_group()
    print(f"OK {scenario} {phase} rank {rank} ({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
