"""DistributedDataParallel: two CPU processes (gloo, loopback only) training ASCenderAttention
reach the same parameters as one process on the same global batch."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ascender_torch import ASCenderAttention

STEPS, BATCH, N, D = 3, 4, 12, 16


def _model():
    torch.manual_seed(0)
    return ASCenderAttention(D, 2, k=3).double()


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, N, D, generator=g, dtype=torch.float64), torch.randn(
        BATCH, N, D, generator=g, dtype=torch.float64)


def _train(model, x, target, steps=STEPS):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        y, _ = model(x, is_causal=True)
        loss = (y - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _worker(rank, world, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        ddp = torch.nn.parallel.DistributedDataParallel(_model())
        x, target = _data()
        shard = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        _train(ddp, x[shard], target[shard])  # mean loss per shard; DDP averages the gradients
        if rank == 0:
            torch.save(ddp.module.state_dict(), out_path)
        del ddp  # release the reducer's hold on the process group before tearing it down
        dist.barrier()  # no rank tears gloo down while a peer still uses its connection
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_match_one(tmp_path):
    out_path = str(tmp_path / "ddp.pt")
    mp.spawn(_worker, args=(2, _free_port(), out_path), nprocs=2, join=True)
    ddp_state = torch.load(out_path)
    single = _train(_model(), *_data())
    for name, p in single.state_dict().items():
        torch.testing.assert_close(ddp_state[name], p, rtol=1e-10, atol=1e-12, msg=name)
