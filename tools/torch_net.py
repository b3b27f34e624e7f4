#!/usr/bin/env python3
"""PyTorch's nn.Module of any trainc net (a shipped one by its model.name, or a net file), with trainc's
tensor names as its state_dict keys, so that load_state_dict(strict=True) takes a `trainc export` file.
There is no second reader of net files: `trainc summary --json` prints the net trainc builds (each layer's
kind, module name, inputs by name, arguments and output shape, and the tensors in export's order), and the
module is built from that line.

  # the layer list as JSON (no torch needed)
  python3 tools/torch_net.py --spec --model mobilenetv2 --image-size 32
  # the training step alone, as tools/torch_resnet.py --mode step (eager, or --compile default|max-autotune)
  python3 tools/torch_net.py --mode step --model mobilenetv2 --image-size 32 --batch 512 --amp fp16 \\
      --channels-last --lr 0.01 [--compile default]
  # a whole run with configs/vgg.ini's (= resnet18.ini's) recipe, as tools/torch_resnet.py --mode train
  python3 tools/torch_net.py --mode train --data .data/cifar10-jpg --model vgg --image-size 32 --epochs 30 \\
      --batch 512 --lr 0.2 --momentum 0.9 --nesterov --weight-decay 5e-4 --no-decay-bn-bias --schedule cosine \\
      --warmup-epochs 2 --flip --crop-pad 4 --amp fp16 --channels-last --seed 0

--model is a shipped net's name (trainc's model.name) or a path ending in .net (trainc's model.net); --trainc
the binary that prints the JSON (default: $TRAINC, else build/trainc, else build-cpu/trainc). Every other
option is tools/torch_resnet.py's, whose train and step loops run the module.

The module mirrors trainc's layers one for one: conv (nn.Conv2d with its groups, bias, stride and padding;
dirac=yes starts its first min(out, in) filters as the identity; whiten=yes freezes its weight, which trainc
sets from the data: train such a net with tools/torch_airbench.py), batchnorm (nn.BatchNorm2d with the
config's model.bn_eps and model.bn_momentum, the weight frozen under model.bn_weight = fixed), linear (over
the flattened input), relu (in place, as trainc's), gelu, silu, max and average pooling (the padding counted
in the average), global pools, add, concat, flatten, scale and dropout. Initialisation is PyTorch's default,
as trainc's. Every activation keeps trainc's c x h x w shape (a linear layer's output is c x 1 x 1); the
logits are flattened at the end.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # --spec, and the tests' checks of the JSON, need no torch
    torch = None


def find_trainc(trainc=None):
    for path in [trainc, os.environ.get("TRAINC"), os.path.join(ROOT, "build", "trainc"),
                 os.path.join(ROOT, "build-cpu", "trainc")]:
        if path and os.access(path, os.X_OK):
            return path
    sys.exit("torch_net: no trainc binary (--trainc PATH, $TRAINC, build/trainc or build-cpu/trainc)")


def net_spec(model, image_size=32, classes=10, trainc=None, net_text=None):
    """The JSON of `trainc summary --json` for a shipped net's name, a .net file, or a net's text (net_text,
    as a checkpoint or export carries it; model then only names it)."""
    with tempfile.TemporaryDirectory(prefix="torch_net-") as tmp:
        if net_text is not None:
            net = os.path.join(tmp, (model or "net") + ".net")
            with open(net, "w") as f:
                f.write(net_text)
            line = "net = " + net
        elif model.endswith(".net"):
            line = "net = " + os.path.abspath(model)
        else:
            line = "name = " + model
        ini = os.path.join(tmp, "summary.ini")
        with open(ini, "w") as f:
            f.write(f"[data]\nimage_size = {image_size}\n[model]\nnum_classes = {classes}\n{line}\n")
        run = subprocess.run([find_trainc(trainc), "summary", "--json", "--config", ini], capture_output=True,
                             text=True)
    if run.returncode != 0:
        sys.exit(f"torch_net: trainc summary of {model}: {run.stderr.strip()}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def plan(spec):
    """Each layer with parameters as (module name, PyTorch class, keyword arguments, its state_dict keys with
    their shapes), in trainc's order: what the module registers, checkable without torch."""
    shape = {"input": spec["input"]}
    out = []
    for layer in spec["layers"]:
        c_in = shape[layer["inputs"][0]][0]
        kind, name = layer["kind"], layer["module"]
        if kind == "conv":
            k, groups = layer["kernel"], layer["groups"]
            kw = {"in_channels": c_in, "out_channels": layer["out_channels"], "kernel_size": k,
                  "stride": layer["stride"], "padding": layer["pad"], "groups": groups, "bias": layer["bias"]}
            keys = [("weight", [layer["out_channels"], c_in // groups, k, k])]
            keys += [("bias", [layer["out_channels"]])] if layer["bias"] else []
            out.append((name, "Conv2d", kw, keys))
        elif kind == "linear":
            kw = {"in_features": layer["in_features"], "out_features": layer["out_features"], "bias": layer["bias"]}
            keys = [("weight", [layer["out_features"], layer["in_features"]])]
            keys += [("bias", [layer["out_features"]])] if layer["bias"] else []
            out.append((name, "Linear", kw, keys))
        elif kind == "batchnorm":
            kw = {"num_features": c_in, "eps": spec["bn_eps"], "momentum": spec["bn_momentum"]}
            keys = [(k, [c_in]) for k in ("weight", "bias", "running_mean", "running_var")]
            out.append((name, "BatchNorm2d", kw, keys))
        elif layer["params"]:
            sys.exit(f"torch_net: layer {layer['id']}: a {kind} with parameters, which this tool does not know")
        shape[layer["id"]] = layer["output"]
    return out


def state_keys(spec):
    """The state_dict keys trainc export writes, with their shapes (no num_batches_tracked)."""
    return [(f"{name}.{key}", shape) for name, _, _, keys in plan(spec) for key, shape in keys]


if torch is not None:
    class TraincNet(nn.Module):
        """The net of a `trainc summary --json` line."""

        def __init__(self, spec):
            super().__init__()
            modules = {}
            for name, cls, kw, _ in plan(spec):
                modules[name] = self._place(name, getattr(nn, cls)(**kw))
            index = {"input": 0}
            self.steps = []  # (kind, module or None, input value indices, the layer's JSON)
            for i, layer in enumerate(spec["layers"]):
                mod = modules.get(layer["module"]) if layer["params"] else None
                if layer["kind"] == "conv":
                    self._conv_options(mod, layer)
                if layer["kind"] == "batchnorm" and spec["bn_weight_fixed"]:
                    mod.weight.requires_grad_(False)
                self.steps.append((layer["kind"], mod, [index[n] for n in layer["inputs"]], layer))
                index[layer["id"]] = i + 1
            last = {}
            for i, (_, _, ins, _) in enumerate(self.steps):
                for j in ins:
                    last[j] = i
            self.frees = [[j for j in ins if last[j] == i] for i, (_, _, ins, _) in enumerate(self.steps)]

        def _place(self, name, module):
            """Registers module under its dotted name ("layer1.0.conv1"), with plain containers above it."""
            parent, *path = self, *name.split(".")
            for part in path[:-1]:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.Module())
                parent = getattr(parent, part)
            parent.add_module(path[-1], module)
            return module

        @staticmethod
        def _conv_options(conv, layer):
            if layer["dirac"]:
                with torch.no_grad():
                    n = min(conv.out_channels, conv.in_channels)
                    nn.init.dirac_(conv.weight[:n])
            if layer["whiten"]:
                conv.weight.requires_grad_(False)

        def forward(self, x):
            vals = [x] + [None] * len(self.steps)
            for i, (kind, mod, ins, layer) in enumerate(self.steps):
                a = vals[ins[0]]
                if kind in ("conv", "batchnorm"):
                    y = mod(a)
                elif kind == "linear":
                    y = mod(a.flatten(1))[:, :, None, None]
                elif kind == "relu":
                    y = F.relu(a, inplace=ins[0] > 0)  # trainc's works in place: its input feeds nothing else
                elif kind == "gelu":
                    y = F.gelu(a)
                elif kind == "silu":
                    y = F.silu(a)
                elif kind == "maxpool":
                    y = F.max_pool2d(a, layer["kernel"], layer["stride"], layer["pad"])
                elif kind == "avgpool":
                    y = (a.mean((2, 3), keepdim=True) if layer.get("global")
                         else F.avg_pool2d(a, layer["kernel"], layer["stride"], layer["pad"]))
                elif kind == "add":
                    y = a + vals[ins[1]]
                elif kind == "concat":
                    y = torch.cat([a, vals[ins[1]]], 1)
                elif kind == "flatten":
                    y = a.flatten(1)[:, :, None, None]
                elif kind == "scale":
                    y = a * layer["factor"]
                elif kind == "dropout":
                    y = F.dropout(a, layer["p"], self.training)
                else:
                    raise ValueError(f"torch_net: layer {layer['id']}: unknown kind {kind}")
                for j in self.frees[i]:
                    vals[j] = None
                vals[i + 1] = y
            return vals[-1].flatten(1)


def build(model, image_size=32, classes=10, trainc=None, net_text=None):
    """The nn.Module of a shipped net's name, a .net file or a net's text (see net_spec)."""
    if torch is None:
        sys.exit("torch_net: needs PyTorch to build the module (--spec needs none)")
    return TraincNet(net_spec(model, image_size, classes, trainc, net_text))


def main():
    if "--spec" in sys.argv:
        import argparse
        ap = argparse.ArgumentParser(description="print the net's JSON (trainc summary --json)")
        ap.add_argument("--spec", action="store_true")
        ap.add_argument("--model", required=True)
        ap.add_argument("--image-size", type=int, default=32)
        ap.add_argument("--classes", type=int, default=10)
        ap.add_argument("--trainc")
        args = ap.parse_args()
        print(json.dumps(net_spec(args.model, args.image_size, args.classes, args.trainc)))
        return
    if torch is None:
        sys.exit("torch_net: needs PyTorch for --mode train and step (the GPU machine); --spec needs none")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_resnet
    ap = torch_resnet.make_parser(models=None, description=__doc__.split("\n\n")[0],
                                  model_help="a shipped net's name (trainc's model.name) or a .net file")
    ap.add_argument("--trainc", help="the trainc binary that prints the net's JSON")
    ap.set_defaults(model="mobilenetv2")

    def make_model(args):
        spec = net_spec(args.model, args.image_size, 10, args.trainc)
        if any(layer.get("whiten") for layer in spec["layers"]):
            sys.exit("torch_net: the net has a whitening convolution, set from the data: tools/torch_airbench.py "
                     "trains airbench")
        return TraincNet(spec)

    torch_resnet.main(ap, make_model)


if __name__ == "__main__":
    main()
