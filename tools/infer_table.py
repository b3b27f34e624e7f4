#!/usr/bin/env python3
"""The inference benchmark's markdown table, from the `infer ...` lines of
`trainc bench-infer` and tools/torch_infer.py (other lines are skipped):

  python3 tools/infer_table.py [FILE]      (stdin without FILE)
  python3 tools/infer_table.py --self-test

One row per model, image size and batch: each implementation's images/s and
p50/p99 latency (ms), then trainc's throughput over torch-graph's and trainc's p50
over torch-graph's. Columns follow the implementations present (trainc, torch-graph,
torch-compile first); a later line for the same implementation and case wins.
"""
import sys

FIRST = ["trainc", "torch-graph", "torch-compile"]
KEYS = {"impl": str, "model": str, "image": int, "batch": int, "images_per_s": float, "p50_ms": float,
        "p99_ms": float}


def parse(lines, source="input"):
    """{(model, image, batch): {impl: record}} and the implementations in column order."""
    rows, impls = {}, []
    for n, line in enumerate(lines, 1):
        if not line.startswith("infer "):
            continue
        fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
        rec = {}
        for key, conv in KEYS.items():
            try:
                rec[key] = conv(fields[key])
            except (KeyError, ValueError):
                sys.exit(f"infer_table.py: {source} line {n}: {key} missing or bad: {line.strip()}")
        rows.setdefault((rec["model"], rec["image"], rec["batch"]), {})[rec["impl"]] = rec
        if rec["impl"] not in impls:
            impls.append(rec["impl"])
    order = [i for i in FIRST if i in impls] + [i for i in impls if i not in FIRST]
    return rows, order


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "-"


def table(rows, impls):
    head = ["model", "image", "batch"] + [f"{i} img/s" for i in impls] + ["trainc / graph"]
    head += [f"{i} p50/p99 ms" for i in impls] + ["p50 trainc / graph"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, image, batch), by in sorted(rows.items()):
        get = lambda impl, key: by[impl][key] if impl in by else None  # noqa: E731
        cells = [model, str(image), str(batch)]
        cells += [f"{by[i]['images_per_s']:,.0f}" if i in by else "-" for i in impls]
        cells.append(ratio(get("trainc", "images_per_s"), get("torch-graph", "images_per_s")))
        cells += [f"{by[i]['p50_ms']:.3f} / {by[i]['p99_ms']:.3f}" if i in by else "-" for i in impls]
        cells.append(ratio(get("trainc", "p50_ms"), get("torch-graph", "p50_ms")))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def self_test():
    text = """torch 2.5, cuDNN 90100
infer impl=torch-compile model=resnet18 image=32 batch=256 images_per_s=150000.0 p50_ms=0.400 p99_ms=0.500
infer impl=trainc model=resnet18 image=32 batch=256 images_per_s=200000.0 p50_ms=0.300 p99_ms=0.320
infer impl=torch-graph model=resnet18 image=32 batch=256 images_per_s=100000.0 p50_ms=0.600 p99_ms=0.700
infer impl=torch-graph model=resnet18 image=32 batch=1 images_per_s=5000.0 p50_ms=0.200 p99_ms=0.250
"""
    rows, impls = parse(text.splitlines())
    assert impls == ["trainc", "torch-graph", "torch-compile"], impls
    lines = table(rows, impls).splitlines()
    assert len(lines) == 4, lines
    assert lines[2] == "| resnet18 | 32 | 1 | - | 5,000 | - | - | - | 0.200 / 0.250 | - | - |", lines[2]
    assert lines[3] == ("| resnet18 | 32 | 256 | 200,000 | 100,000 | 150,000 | 2.00 | 0.300 / 0.320 | "
                        "0.600 / 0.700 | 0.400 / 0.500 | 0.50 |"), lines[3]
    print("infer_table.py: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) > 2 or sys.argv[1:2] in (["-h"], ["--help"]):
        sys.exit(__doc__)
    source = sys.argv[1] if len(sys.argv) == 2 else "stdin"
    try:
        lines = open(source).readlines() if source != "stdin" else sys.stdin.readlines()
    except OSError as e:
        sys.exit(f"infer_table.py: cannot read {source}: {e.strerror}")
    rows, impls = parse(lines, source)
    if not rows:
        sys.exit(f"infer_table.py: no `infer ...` lines in {source}")
    print(table(rows, impls))


if __name__ == "__main__":
    main()
