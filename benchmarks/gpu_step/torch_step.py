"""PyTorch eager baseline of benchmarks/gpu_step: the seed's MLP training step on the GPU.

The same model, loss, optimizer and batch flow as loom's side: 784 -> hidden (relu) -> 10
softmax, cross entropy -sum(y_ * log(clip(y, 1e-10, 1))), Adam, each step's batch copied from
host memory. Prints one line: "torch_step_seconds <median>".

    python3 torch_step.py --batch 1024 --hidden 1024 --steps 200 --reps 7
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products, as cuBLAS's default in loom
    dev = torch.device("cuda:0")
    g = torch.Generator().manual_seed(1)
    w1 = (torch.randn(784, a.hidden, generator=g) / 28).to(dev).requires_grad_()
    b1 = torch.zeros(a.hidden, device=dev, requires_grad=True)
    w2 = (torch.randn(a.hidden, 10, generator=g) / a.hidden**0.5).to(dev).requires_grad_()
    b2 = torch.zeros(10, device=dev, requires_grad=True)
    opt = torch.optim.Adam([w1, b1, w2, b2], lr=0.001)
    # A few host batches, rotated: random pixels and one-hot labels (never zeros).
    batches = []
    for _ in range(4):
        x = torch.rand(a.batch, 784, generator=g)
        y = torch.nn.functional.one_hot(torch.randint(0, 10, (a.batch,), generator=g), 10).float()
        batches.append((x, y))

    def step(i):
        x, y_ = batches[i % len(batches)]
        x, y_ = x.to(dev), y_.to(dev)
        y = torch.softmax(torch.relu(x @ w1 + b1) @ w2 + b2, dim=1)
        loss = -(y_ * torch.log(torch.clamp(y, 1e-10, 1.0))).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()  # the fetch: waits for the step, as loom's session.run does

    for i in range(20):
        step(i)
    times = []
    for r in range(a.reps):
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(i)
        times.append((time.perf_counter() - t0) / a.steps)
    print(f"torch_step_seconds {statistics.median(times):.9f}")


if __name__ == "__main__":
    main()
