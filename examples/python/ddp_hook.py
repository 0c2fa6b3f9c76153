"""examples/python/ddp_hook.py — PyTorch's DistributedDataParallel reducing its gradients through Tessera.

Every rank runs this file; the launcher says where it sits:

    PYTHONPATH=build/python build/tessera run -n 2 python3 examples/python/ddp_hook.py
    PYTHONPATH=build/python torchrun --nproc_per_node 2 examples/python/ddp_hook.py

tessera.torch.init_process_group joins Tessera's group (shared memory between the ranks of a host, TCP between
hosts) and torch's gloo group, which DDP uses for its set-up only; the hook then all-reduces (averages) each
25 MB gradient bucket through Tessera as soon as backward has filled it. The sampler gives each rank its share
of the data as torch.utils.data.DistributedSampler does, index for index.
"""
import torch

import tessera.distributed as dist
import tessera.torch as tt

group = tt.init_process_group("gloo")
rank, world = group.rank, group.world_size

torch.manual_seed(0)  # the same start on every rank (DDP also broadcasts rank 0's parameters)
net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=25)
model.register_comm_hook(group, tt.allreduce_hook)

# a toy data set: the label says whether the features sum above zero
gen = torch.Generator().manual_seed(1)
x = torch.randn(2048, 20, generator=gen)
y = (x.sum(1) > 0).long()
data = torch.utils.data.TensorDataset(x, y)
sampler = dist.DistributedSampler(data, shuffle=True, seed=0)
loader = torch.utils.data.DataLoader(data, batch_size=32, sampler=sampler)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

for epoch in range(3):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()  # buckets averaged over the ranks by Tessera during backward
        opt.step()
    stats = torch.tensor([loss.item(), (model(x).argmax(1) == y).float().mean().item()])
    dist.all_reduce(stats, op="avg")  # a collective of our own: the ranks' mean loss and accuracy
    if rank == 0:
        print(f"epoch {epoch}: loss {stats[0]:.4f}, accuracy {100 * stats[1]:.1f}% ({world} ranks, {group.links})")
