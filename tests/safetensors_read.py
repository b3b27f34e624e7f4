#!/usr/bin/env python3
"""Reads a file trainc export wrote with the standard library alone.

A 2-step CPU run on synthetic data writes a checkpoint of ResNet-18 (CIFAR
stem); trainc export writes it as safetensors. The file must be: an 8-byte
little-endian header length, a JSON header padded with spaces to 8 bytes,
every tensor F32 with data_offsets back to back from 0 to the end of the file,
sizes that match the shapes, torchvision's key names, and __metadata__ of
strings with the class names and the input preparation.

    tests/safetensors_read.py TRAINC SCRATCH_DIR
Exit 0: passed, 1: failed."""
import json
import math
import os
import shutil
import struct
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main():
    trainc, scratch = sys.argv[1], sys.argv[2]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    ckdir = os.path.join(scratch, "ck")
    sets = ["run.device=cpu", "data.source=synthetic", "data.image_size=16", "data.synthetic_train=32",
            "data.synthetic_test=16", "train.batch=16", "run.epochs=1", "run.max_steps=2",
            "run.checkpoint_every=2", "model.name=resnet18", "run.checkpoint_dir=" + ckdir]
    ini = os.path.join(scratch, "run.ini")
    open(ini, "w").close()
    cmd = [trainc, "--config", ini, "--quiet"] + [a for s in sets for a in ("--set", s)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    out = os.path.join(scratch, "r18.safetensors")
    subprocess.run([trainc, "export", "--checkpoint", os.path.join(ckdir, "ckpt-00000002.trc"),
                    "--format", "safetensors", "--out", out], check=True)

    blob = open(out, "rb").read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len % 8 or 8 + header_len > len(blob):
        fail(f"header length {header_len} (file {len(blob)} bytes)")
    text = blob[8:8 + header_len].decode("utf-8")
    if not text.rstrip(" ").endswith("}") or len(text) - len(text.rstrip(" ")) > 7:
        fail("the header is not JSON padded with at most 7 spaces")
    header = json.loads(text)
    meta = header.pop("__metadata__")
    data = len(blob) - 8 - header_len
    end = 0
    for name, t in header.items():  # in file order, back to back
        a, b = t["data_offsets"]
        if t["dtype"] != "F32" or a != end or b - a != 4 * math.prod(t["shape"]):
            fail(f"{name}: {t}, expected F32 from {end}")
        end = b
    if end != data:
        fail(f"tensors end at {end}, the data is {data} bytes")
    names = list(header)
    want = ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
            "layer1.0.conv1.weight"]
    if names[:6] != want or names[-2:] != ["fc.weight", "fc.bias"] or len(names) != 102:
        fail(f"names {names[:6]} ... {names[-2:]} ({len(names)})")
    if header["conv1.weight"]["shape"] != [64, 3, 3, 3] or header["fc.weight"]["shape"] != [10, 512]:
        fail("conv1 or fc shape")
    if "layer2.0.downsample.0.weight" not in header:
        fail("no downsample")
    if not all(isinstance(v, str) for v in meta.values()):
        fail(f"metadata values must be strings: {meta}")
    classes = json.loads(meta["class_names"])
    if meta["model"] != "resnet18" or meta["image_size"] != "16" or len(classes) != 10 or classes[0] != "class0":
        fail(f"metadata {meta}")
    if len(json.loads(meta["mean"])) != 3 or len(json.loads(meta["std"])) != 3:
        fail(f"mean/std {meta}")
    var = struct.unpack_from("<64f", blob, 8 + header_len + header["bn1.running_var"]["data_offsets"][0])
    if not all(v > 0 for v in var):
        fail("bn1.running_var is not positive")
    print(f"ok: {len(names)} tensors, {data} bytes of data, metadata {sorted(meta)}")


if __name__ == "__main__":
    main()
