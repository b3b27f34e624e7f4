#!/usr/bin/env python3
"""PyTorch's reference for `trainc bench-infer`: inference throughput and latency of
one model at several batch sizes, on the same card, printing trainc's line:

  infer impl=torch-graph model=resnet18 image=32 batch=256 images_per_s=183900.0 p50_ms=0.310 p99_ms=0.350

  python3 tools/torch_infer.py --model resnet18 --image-size 32 --batch 1,32,256 --mode graph
  python3 tools/torch_infer.py --model resnet50 --image-size 224 --mode compile

Models are tools/torch_common.py's build_model (the CIFAR stem below 128 pixels, the
ImageNet stem from 128 on), with PyTorch's default initialisation and 10 classes.
Every mode runs the model in eval(), its weights in --dtype and --channels-last,
under torch.inference_mode(), with cudnn.benchmark on:

  graph    the forward captured as a CUDA graph (torch.cuda.graph), after warm-up
           forwards on a side stream as PyTorch's CUDA-graph docs do; a step is a replay
  compile  torch.compile(model, mode=--compile-mode, dynamic=False), warmed up
           (the first forward of each batch size compiles; its time goes to stderr)
  eager    the forward called plainly

The input is random normal, already on the GPU in the model's dtype and memory format;
the logits stay there. Per batch size: --warmup untimed steps, then throughput
(images/s) from --iters steps back to back between two CUDA events, then latency from
--latency-iters single steps, each timed on the host with time.perf_counter() around
the step and torch.cuda.synchronize(); p50 and p99 are nearest-rank percentiles.
The torch and cuDNN versions and the GPU go to stderr once.
"""
import argparse
import math
import os
import sys
import time


def batch_list(text):
    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--batch {text!r} is not a list of positive integers like 1,32,256")
    return sizes


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18", help="simplenet, resnet18, resnet34 or resnet50")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch", type=batch_list, default=[1, 32, 256], help="batch sizes, comma-separated")
    ap.add_argument("--mode", choices=["graph", "compile", "eager"], default="graph")
    ap.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune"], default="max-autotune",
                    help="torch.compile's mode for --mode compile (impl torch-compile; another mode is "
                         "torch-compile-<mode>)")
    ap.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default="fp16", help="weights and input")
    ap.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps per batch size")
    ap.add_argument("--iters", type=int, default=200, help="steps timed for throughput")
    ap.add_argument("--latency-iters", type=int, default=200, help="steps timed one by one for latency")
    args = ap.parse_args(argv)
    for name in ("warmup", "iters", "latency_iters"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def impl_name(args):
    if args.mode == "compile" and args.compile_mode != "max-autotune":
        return f"torch-compile-{args.compile_mode}"
    return f"torch-{args.mode}"


def percentile(sorted_values, q):
    """Nearest-rank percentile q (0..100] of an ascending list."""
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def make_step(torch, model, x, mode):
    """A function running one forward of `model` on `x` as `mode` does (graph: captured here)."""
    if mode == "eager":
        return lambda: model(x)
    if mode == "compile":
        mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
        return (lambda: (mark(), model(x))) if mark else (lambda: model(x))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(x)
    return graph.replay


def measure(torch, step, batch, args):
    """(images/s, p50 ms, p99 ms) of `step` after the warm-up."""
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.iters):
        step()
    end.record()
    end.synchronize()
    images_per_s = batch * args.iters / (start.elapsed_time(end) / 1e3)
    latencies = []
    for _ in range(args.latency_iters):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        latencies.append((time.perf_counter() - t0) * 1e3)
    latencies.sort()
    return images_per_s, percentile(latencies, 50), percentile(latencies, 99)


def main():
    args = parse_args()
    import torch  # after the options: --help needs no torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_common import build_model, memory_format

    if not torch.cuda.is_available():
        sys.exit("torch_infer.py: no CUDA device visible to PyTorch")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, GPU {torch.cuda.get_device_name()}",
          file=sys.stderr, flush=True)
    torch.backends.cudnn.benchmark = True
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    mf = memory_format(args.channels_last)
    model = build_model(args.model, args.image_size).to("cuda", dtype=dtype, memory_format=mf).eval()
    if args.mode == "compile":
        model = torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode, dynamic=False)
    impl = impl_name(args)
    with torch.inference_mode():
        for batch in args.batch:
            x = torch.randn(batch, 3, args.image_size, args.image_size, device="cuda", dtype=dtype)
            x = x.contiguous(memory_format=mf)
            t0 = time.perf_counter()
            step = make_step(torch, model, x, args.mode)
            if args.mode == "compile":
                step()
                torch.cuda.synchronize()
                print(f"batch {batch}: compiled in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            images_per_s, p50, p99 = measure(torch, step, batch, args)
            print(f"infer impl={impl} model={args.model} image={args.image_size} batch={batch} "
                  f"images_per_s={images_per_s:.1f} p50_ms={p50:.3f} p99_ms={p99:.3f}", flush=True)
            del step, x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
