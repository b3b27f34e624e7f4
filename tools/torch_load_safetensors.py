#!/usr/bin/env python3
"""Loads a file trainc export wrote into the PyTorch module of its net (tools/torch_net.py: built from the
net's text in the file's __metadata__ "net", or for a file without it from the shipped net its "model"
names; the same module names as trainc's tensors) with strict=True,
runs CIFAR-10's test set and prints accuracy and the first logits; --onnx FILE
also exports the loaded model with torch.onnx.export and, where onnxruntime is
importable, compares its logits with PyTorch's; with --predict-json FILE (the
output of `trainc predict --json` on 32x32 images, which predict only
normalises) also onnxruntime's probabilities of each image's listed classes
with predict's. Needs PyTorch (the GPU machine).

    tools/torch_load_safetensors.py model.safetensors [--data .data/cifar10-jpg] [--limit N] [--onnx m.onnx]
        [--predict-json predict.jsonl ...] [--trainc build/trainc]
"""
import argparse
import json
import struct
import sys


def read_safetensors(path, torch):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + n:]
    state = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {t['dtype']}, not F32")
        a, b = t["data_offsets"]
        state[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(t["shape"]).clone()
    return state, meta


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--data", default=".data/cifar10-jpg")
    p.add_argument("--limit", type=int, default=0, help="test images (0: all)")
    p.add_argument("--onnx", default="", help="export the loaded model to this ONNX file")
    p.add_argument("--device", default="cuda")
    p.add_argument("--predict-json", nargs="*", default=[],
                   help="outputs of trainc predict --json to compare (with --onnx)")
    p.add_argument("--trainc", help="the trainc binary whose summary --json gives the net (tools/torch_net.py)")
    args = p.parse_args()
    try:
        import torch
        import torch_common as tc
        import torch_net
    except ImportError as e:
        sys.exit(f"torch_load_safetensors: needs PyTorch ({e}); run it on the GPU machine")
    state, meta = read_safetensors(args.file, torch)
    size, classes = int(meta["image_size"]), int(meta["num_classes"])
    model = torch_net.build(meta["model"], size, classes, args.trainc, meta.get("net"))
    for key, v in model.state_dict().items():  # trainc writes no num_batches_tracked
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = torch.zeros_like(v)
    model.load_state_dict(state, strict=True)
    model = model.to(args.device).eval()
    x, y = tc.load_split(args.data, "test")
    if args.limit:
        x, y = x[:args.limit], y[:args.limit]
    x, y = x.to(args.device), y.to(args.device)
    def batches(n):
        return tc.gpu_batches(x, y, n, size, False, 0, False, False, None)
    correct, first = 0, None
    with torch.no_grad():
        for batch, labels in batches(256):
            logits = model(batch)
            first = logits[:4].float().cpu() if first is None else first
            correct += (logits.argmax(1) == labels).sum().item()
    print(json.dumps({"test_acc": correct / len(y), "images": len(y), "logits_first4": first.tolist()}))
    if args.onnx:
        sample = torch.zeros(1, 3, size, size, device=args.device)
        torch.onnx.export(model, sample, args.onnx, input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
        try:
            import onnxruntime as ort
        except ImportError:
            print(f"wrote {args.onnx}; onnxruntime not importable, no comparison")
            return
        batch = next(iter(batches(32)))[0]
        ref = model(batch).detach().cpu().numpy()
        session = ort.InferenceSession(args.onnx)
        got = session.run(None, {"image": batch.cpu().numpy()})[0]
        print(json.dumps({"onnx_max_abs_diff": float(abs(ref - got).max())}))
        for path in args.predict_json:
            compare_predict(session, path, meta, size)


def compare_predict(session, path, meta, size):
    """onnxruntime's softmax against trainc predict's probabilities, image by image."""
    import numpy as np
    from PIL import Image
    mean = np.array(json.loads(meta["mean"]), dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.array(json.loads(meta["std"]), dtype=np.float32).reshape(1, 3, 1, 1)
    rows = [json.loads(line) for line in open(path) if line.strip()]
    worst, same_top1 = 0.0, 0
    for row in rows:
        with Image.open(row["image"]) as im:
            if im.size != (size, size):
                sys.exit(f"{row['image']}: {im.size}, not {size}x{size}: predict would resize it")
            x = np.asarray(im.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)[None] / 255.0
        logits = session.run(None, {"image": (x - mean) / std})[0][0].astype(np.float64)
        prob = np.exp(logits - logits.max())
        prob /= prob.sum()
        worst = max(worst, max(abs(prob[t["index"]] - t["p"]) for t in row["top"]))
        same_top1 += int(prob.argmax()) == row["top"][0]["index"]
    print(json.dumps({"predict_json": path, "predict_images": len(rows), "predict_vs_onnx_max_abs_p_diff": worst,
                      "predict_vs_onnx_same_top1": same_top1}))


if __name__ == "__main__":
    main()
