"""PyTorch baselines of benchmarks/gpu_step: the seed's MLP training step on the GPU.

The same model, loss, optimizer and batch flow as loom's side: 784 -> hidden (relu) -> 10
softmax, cross entropy -sum(y_ * log(clip(y, 1e-10, 1))), Adam, each step's batch copied from
host memory, the loss fetched. Two ways, each as PyTorch's documentation advises:

- eager: the step as written, `Adam` as constructed by default;
- captured: the step captured once in a CUDA graph and replayed (torch.cuda.graphs, "whole
  network capture"), fused Adam (`fused=True, capturable=True`), the batch copied from pinned
  host memory into the graph's static input with `non_blocking=True`.

Then the two ceilings of the step's floor, measured on the same GPU: the fp32 matrix rate
(TF32 off, 8192^3 products) and the host-to-device rate from pinned memory (256 MiB copies).
Prints one line each:

    torch_step_seconds <median>  torch_graph_step_seconds <median>
    fp32_matmul_flops_per_s <median>  h2d_bytes_per_s <median>

    python3 torch_step.py --batch 1024 --hidden 1024 --steps 200 --reps 7
"""
import argparse
import statistics
import time

import torch


def timed_median(fn, reps, steps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


def make_model(a, dev, g, fused):
    w1 = (torch.randn(784, a.hidden, generator=g) / 28).to(dev).requires_grad_()
    b1 = torch.zeros(a.hidden, device=dev, requires_grad=True)
    w2 = (torch.randn(a.hidden, 10, generator=g) / a.hidden**0.5).to(dev).requires_grad_()
    b2 = torch.zeros(10, device=dev, requires_grad=True)
    params = [w1, b1, w2, b2]
    opt = (torch.optim.Adam(params, lr=0.001, fused=True, capturable=True) if fused
           else torch.optim.Adam(params, lr=0.001))

    def loss_of(x, y_):
        y = torch.softmax(torch.relu(x @ w1 + b1) @ w2 + b2, dim=1)
        return -(y_ * torch.log(torch.clamp(y, 1e-10, 1.0))).sum()

    return opt, loss_of


def eager_step_seconds(a, dev, g, batches):
    opt, loss_of = make_model(a, dev, g, fused=False)
    i = 0

    def step():
        nonlocal i
        x, y_ = batches[i % len(batches)]
        i += 1
        loss = loss_of(x.to(dev), y_.to(dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()  # the fetch: waits for the step, as loom's session.run does

    for _ in range(20):
        step()
    return timed_median(step, a.reps, a.steps)


def graph_step_seconds(a, dev, g, batches):
    opt, loss_of = make_model(a, dev, g, fused=True)
    pinned = [(x.pin_memory(), y_.pin_memory()) for x, y_ in batches]
    static_x = torch.empty(a.batch, 784, device=dev)
    static_y = torch.empty(a.batch, 10, device=dev)
    static_x.copy_(pinned[0][0])
    static_y.copy_(pinned[0][1])
    # Warm-up on a side stream before capture, as the documentation's example does.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_of(static_x, static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_of(static_x, static_y)
        static_loss.backward()
        opt.step()
    i = 0

    def step():
        nonlocal i
        x, y_ = pinned[i % len(pinned)]
        i += 1
        static_x.copy_(x, non_blocking=True)
        static_y.copy_(y_, non_blocking=True)
        graph.replay()
        return static_loss.item()

    for _ in range(20):
        step()
    return timed_median(step, a.reps, a.steps)


def event_median_seconds(fn, reps):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def fp32_matmul_rate(dev):
    n = 8192
    # Three operand sets rotated, random (never zeros).
    mats = [torch.randn(n, n, device=dev) for _ in range(3)]
    out = torch.empty(n, n, device=dev)
    k = [0]

    def product():
        torch.mm(mats[k[0] % 3], mats[(k[0] + 1) % 3], out=out)
        k[0] += 1

    for _ in range(3):
        product()
    return 2.0 * n**3 / event_median_seconds(product, 10)


def h2d_rate(dev):
    nbytes = 256 << 20
    host = torch.rand(nbytes // 4).pin_memory()
    device = torch.empty(nbytes // 4, device=dev)
    for _ in range(3):
        device.copy_(host, non_blocking=True)
    return nbytes / event_median_seconds(lambda: device.copy_(host, non_blocking=True), 10)


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
    # A few host batches, rotated: random pixels and one-hot labels (never zeros).
    batches = []
    for _ in range(4):
        x = torch.rand(a.batch, 784, generator=g)
        y = torch.nn.functional.one_hot(torch.randint(0, 10, (a.batch,), generator=g), 10).float()
        batches.append((x, y))
    print(f"torch_step_seconds {eager_step_seconds(a, dev, g, batches):.9f}", flush=True)
    print(f"torch_graph_step_seconds {graph_step_seconds(a, dev, g, batches):.9f}", flush=True)
    print(f"fp32_matmul_flops_per_s {fp32_matmul_rate(dev):.6e}", flush=True)
    print(f"h2d_bytes_per_s {h2d_rate(dev):.6e}", flush=True)


if __name__ == "__main__":
    main()
