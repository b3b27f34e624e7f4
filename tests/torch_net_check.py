#!/usr/bin/env python3
"""tools/torch_net.py against trainc, on the CPU.

Without torch: `trainc summary --json` of every shipped net, and torch_net's plan of PyTorch modules from it:
the state_dict keys it would register, in order and with their shapes, are the tensors trainc lists (and
export writes), and their sizes add up to trainc's parameter count (VGG-16-BN's and MobileNetV2's also to
the figures counted by hand in tests/test_netfile.c). A 2-step CPU run of MobileNetV2 exported as safetensors
carries the net's text in its __metadata__, and its keys are the plan's. With --torch (exit 77 where torch
is not importable): the module built from that text loads the file with strict=True and gives finite logits.

    tests/torch_net_check.py TRAINC SCRATCH_DIR [--torch]
Exit 0: passed, 1: failed, 77: skipped (--torch without torch)."""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import torch_net  # noqa: E402

SHIPPED = {"simplenet": [32, 64], "resnet18": [32, 128], "resnet34": [32], "resnet50": [32, 224],
           "airbench": [32], "vgg": [32, 16], "mobilenetv2": [32, 16]}
HAND_COUNTED = {"vgg": 14724042, "mobilenetv2": 2236682}  # at 32 px, 10 classes


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check_spec(trainc, name, size):
    spec = torch_net.net_spec(name, size, 10, trainc)
    keys = torch_net.state_keys(spec)
    tensors = [(t["name"], t["shape"]) for t in spec["tensors"]]
    if keys != tensors:
        first = next(i for i, (a, b) in enumerate(zip(keys + [None] * len(tensors), tensors + [None] * len(keys)))
                     if a != b)
        fail(f"{name} at {size}: key {first}: torch_net's {keys[first:first + 1]}, trainc's {tensors[first:first + 1]}")
    params = sum(math.prod(shape) for key, shape in keys if not key.endswith(("running_mean", "running_var")))
    if params != spec["params"]:
        fail(f"{name} at {size}: {params} parameters in torch_net's plan, {spec['params']} in trainc's")
    if size == 32 and name in HAND_COUNTED and params != HAND_COUNTED[name]:
        fail(f"{name}: {params} parameters, PyTorch's {HAND_COUNTED[name]}")
    if spec["layers"][-1]["output"] != [10, 1, 1] or spec["input"] != [3, size, size]:
        fail(f"{name} at {size}: input {spec['input']}, output {spec['layers'][-1]['output']}")
    ids = {"input"}
    for layer in spec["layers"]:
        if not set(layer["inputs"]) <= ids or not layer["inputs"]:
            fail(f"{name}: layer {layer['id']} reads {layer['inputs']}, not all defined before it")
        if layer["id"] in ids:
            fail(f"{name}: layer id {layer['id']} twice")
        ids.add(layer["id"])
    return spec


def read_header(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    return header, header.pop("__metadata__", {})


def export_mobilenet(trainc, scratch):
    ckdir = os.path.join(scratch, "ck")
    sets = ["run.device=cpu", "data.source=synthetic", "data.image_size=16", "data.synthetic_train=32",
            "data.synthetic_test=16", "train.batch=16", "run.epochs=1", "run.max_steps=2", "run.checkpoint_every=2",
            "model.name=mobilenetv2", "run.checkpoint_dir=" + ckdir, "run.eval=off"]
    ini = os.path.join(scratch, "run.ini")
    open(ini, "w").close()
    subprocess.run([trainc, "--config", ini, "--quiet"] + [a for s in sets for a in ("--set", s)], check=True,
                   stdout=subprocess.DEVNULL)
    out = os.path.join(scratch, "mobilenetv2.safetensors")
    subprocess.run([trainc, "export", "--checkpoint", os.path.join(ckdir, "ckpt-00000002.trc"), "--format",
                    "safetensors", "--out", out], check=True, stdout=subprocess.DEVNULL)
    header, meta = read_header(out)
    text = open(os.path.join(ROOT, "nets", "mobilenetv2.net")).read()
    if meta.get("net") != text:
        fail(f"{out}: __metadata__ net is not nets/mobilenetv2.net's text: {str(meta.get('net'))[:80]!r}")
    keys = torch_net.state_keys(torch_net.net_spec(meta["model"], int(meta["image_size"]), int(meta["num_classes"]),
                                                   trainc, meta["net"]))
    got = [(k, v["shape"]) for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])]
    if got != keys:
        fail(f"{out}: its tensors are not torch_net's keys ({len(got)} against {len(keys)})")
    return out, meta


def check_torch(trainc, path, meta):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from torch_load_safetensors import read_safetensors
    state, _ = read_safetensors(path, torch)
    model = torch_net.build(meta["model"], int(meta["image_size"]), int(meta["num_classes"]), trainc, meta["net"])
    for key, v in model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            state[key] = torch.zeros_like(v)
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(2, 3, int(meta["image_size"]), int(meta["image_size"])))
    if tuple(logits.shape) != (2, 10) or not torch.isfinite(logits).all():
        fail(f"logits {tuple(logits.shape)}, finite: {bool(torch.isfinite(logits).all())}")
    model.train()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.arange(4))
    loss.backward()
    print(f"torch: {path} loaded with strict=True; logits finite; a backward ran (loss {loss.item():.4f})")


def main():
    trainc, scratch = sys.argv[1], sys.argv[2]
    with_torch = "--torch" in sys.argv[3:]
    if with_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("SKIP: no torch importable: the module itself is checked on a machine with PyTorch")
            sys.exit(77)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    for name, sizes in SHIPPED.items():
        for size in sizes:
            check_spec(trainc, name, size)
    print(f"summary --json and torch_net's plan agree on {sum(map(len, SHIPPED.values()))} shipped nets and sizes")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "torch_net.py"), "--spec", "--model", "nosuch",
                          "--trainc", trainc], capture_output=True, text=True)
    if run.returncode == 0 or "unknown model 'nosuch' (known: airbench, mobilenetv2," not in run.stderr:
        fail(f"--spec --model nosuch: exit {run.returncode}, {run.stderr.strip()}")
    run = subprocess.run([trainc, "--json", "--config", os.path.join(ROOT, "configs", "vgg.ini")],
                         capture_output=True, text=True)
    if run.returncode != 2 or "--json belongs to trainc summary" not in run.stderr:
        fail(f"trainc --json: exit {run.returncode}, {run.stderr.strip()}")
    path, meta = export_mobilenet(trainc, scratch)
    print(f"{path}: the net's text in its metadata, its keys torch_net's")
    if with_torch:
        check_torch(trainc, path, meta)
    print("torch_net_check: passed")


if __name__ == "__main__":
    main()
