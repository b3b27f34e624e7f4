#include "tools/trainer/keys.h"

const CfgKeySpec trainc_keys[] = {
    {"run.name", CFG_STRING, "trainc", 0, "name of the run, written into the summary", 0},
    {"run.device", CFG_ENUM, "cuda", "cuda|cpu", "train on the GPU or on the CPU", 0},
    {"run.gpu", CFG_INT, "0", 0, "CUDA device ordinal", "[0, 1023]"},
    {"run.seed", CFG_INT, "0", 0, "seed of parameter initialisation, shuffling and augmentation",
     "[0, 9223372036854775807]"},
    {"run.epochs", CFG_FLOAT, "3", 0,
     "passes over the training set; a fraction trains ceil(run.epochs x steps per epoch) optimizer steps in all, "
     "the last epoch stopping early (airbench's 9.9), the learning-rate schedule spanning those steps",
     "(0, 1000000]"},
    {"run.repeats", CFG_INT, "1", 0,
     "train this many runs in one process, run r from run.seed + r (weights, order and augmentation), the data, "
     "the convolution algorithms and the CUDA graphs kept; a line per run and the mean, std and min of the test "
     "accuracy and of the training time (train_s) in the summary", "[1, 100000]"},
    {"run.warmup_runs", CFG_INT, "0", 0,
     "untimed runs before the counted ones (airbench's warm-up run): the same run from run.seed, without "
     "evaluations or checkpoints, then everything reset but the captured CUDA graphs and loaded kernels, so "
     "the first counted run is timed as the later ones are; not with run.resume, run.init_from, "
     "run.checkpoint_every or mpirun", "[0, 100]"},
    {"run.max_steps", CFG_INT, "0", 0, "stop after this many optimizer steps (0: no limit)", "[0, 1000000000000]"},
    {"run.warmup_steps", CFG_INT, "20", 0, "steps left out of the timed throughput window", "[0, 1000000000]"},
    {"run.log_every", CFG_INT, "100", 0,
     "log a line every N steps (mean loss and training accuracy over them, lr, samples/s, time left)",
     "[1, 1000000000]"},
    {"run.metrics_file", CFG_STRING, "", 0, "JSON-lines metrics file (empty: none)", 0},
    {"run.tensorboard_dir", CFG_STRING, "", 0,
     "write TensorBoard event files here (created if missing; rank 0 alone under mpirun): loss, lr, "
     "samples/s, loss scale, GPU utilisation and memory at each log point, test accuracy at each epoch's "
     "end; view with tensorboard --logdir DIR (empty: off)", 0},
    {"run.eval", CFG_BOOL, "on", 0, "evaluate top-1 accuracy on the test split after each epoch", 0},
    {"run.eval_tta", CFG_ENUM, "off", "off|flip|flip_translate",
     "test-time augmentation of the evaluation: the logits of several views of each test image summed before the "
     "argmax: flip, the image and its mirror; flip_translate, airbench's 0.5 x that pair's mean plus 0.25 x the "
     "pair's mean for the image translated by one pixel up-left and by one down-right (reflect padding)", 0},
    {"run.checkpoint_every", CFG_INT, "0", 0,
     "write a checkpoint (weights, the optimizer's state, loss scaler, data position) every N steps (0: off; "
     "SIGINT/SIGTERM still write one)", "[0, 1000000000000]"},
    {"run.checkpoint_dir", CFG_STRING, "checkpoints", 0, "where checkpoints go: ckpt-<step>.trc", 0},
    {"run.save_final", CFG_BOOL, "on", 0,
     "write a checkpoint after the run's last step (its model: trainc eval, predict and export read it), and "
     "one of the last step reached when a fatal error stops the run (off: none unless run.checkpoint_every asks)", 0},
    {"run.keep_checkpoints", CFG_INT, "3", 0, "keep the newest N checkpoints, delete older ones (0: keep all)",
     "[0, 1000000]"},
    {"run.resume", CFG_STRING, "", 0,
     "continue from this checkpoint file, or latest (the newest valid one in run.checkpoint_dir); "
     "trainc --resume sets it", 0},
    {"run.init_from", CFG_STRING, "", 0,
     "start from the weights of this safetensors file (trainc export's, or PyTorch's under the same names): "
     "every tensor of the model by name, shape and dtype F32; the optimizer starts fresh (empty: off)", 0},
    {"run.max_bad_steps", CFG_INT, "20", 0,
     "stop (with a checkpoint) after this many steps in a row skipped for a non-finite loss or gradient "
     "(0: never)", "[0, 1000000000]"},
    {"run.inject_nan_step", CFG_INT, "0", 0,
     "for tests: make the loss gradient of this step (1-based) NaN, so the step is skipped (0: off)",
     "[0, 1000000000000]"},
    {"run.profile_steps", CFG_STRING, "", 0,
     "a:b: bracket optimizer steps a to b (1-based, inclusive) with cudaProfilerStart/Stop, for "
     "nsys profile --capture-range=cudaProfilerApi (empty: off; GPU)", 0},

    {"run.nvtx_layers", CFG_BOOL, "off", 0,
     "an NVTX range around each op of a layer's forward and backward, named by the layer (\"conv 3\", "
     "\"batchnorm 4\"), for nsys and ncu (an op hook, ops/op_context.h)", 0},

    {"monitor.sample_every_s", CFG_FLOAT, "1", 0,
     "append the NVML sample (GPU util, memory, temperature, power) to run.metrics_file as a gpu_sample "
     "line every N seconds (0: off; GPU)", "[0, 86400]"},
    {"monitor.prometheus_port", CFG_INT, "0", 0,
     "serve Prometheus gauges (throughput, loss, GPU) at http://127.0.0.1:PORT/metrics (0: off)", "[0, 65535]"},

    {"data.source", CFG_ENUM, "image_folder", "image_folder|shards|cifar_bin|synthetic",
     "image_folder: root/{train,test}/<class>/*.jpg (JPEG, PNG or BMP of any size); shards: WebDataset tar "
     "shards root/train-000000.tar ... and root/test-*.tar, each sample KEY.jpg (or .png) and KEY.cls, made by "
     "trainc pack; cifar_bin: the CIFAR-10 binary batches; synthetic: deterministic images from the seed", 0},
    {"data.path", CFG_STRING, ".data/cifar10-jpg", 0, "data set root (image_folder, shards, cifar_bin)", 0},
    {"data.cache", CFG_ENUM, "auto", "auto|decoded|stream",
     "image_folder and shards: decoded, every image decoded once into memory before training (all of one size; "
     "refused before it starts when they would not fit); stream, each batch's files read and decoded as it is "
     "made (any size, any number: memory does not grow with the data set); auto: decoded where the split's "
     "images at the first one's size take at most data.cache_mb and all have that size, else stream", 0},
    {"data.cache_mb", CFG_INT, "4096", 0, "data.cache = auto: the most a decoded training split may take",
     "[0, 1048576]"},
    {"data.decode", CFG_ENUM, "auto", "auto|cpu|gpu",
     "streamed JPEGs: cpu, decoded by the loader threads (libjpeg-turbo, with data.dct_scaling); gpu, by nvJPEG "
     "on the card (its hardware JPEG engines where it has them), a batch at a time, then cropped, resampled and "
     "normalised into the model's input by one kernel (PNG, BMP, CMYK and progressive files still decode on the "
     "CPU; needs data.crop = random_resized); auto: gpu where this trainc has nvJPEG, the run is on the GPU, the "
     "data streams and data.crop = random_resized, else cpu; the log says which ran and why", 0},
    {"data.crop", CFG_ENUM, "pad", "pad|random_resized",
     "pad: the CIFAR recipe (data.crop_pad, data.flip, data.cutout, then a resize of the whole image to "
     "data.image_size; one stored size); random_resized: the ImageNet recipe on images of any size, as "
     "torchvision's: training crops by RandomResizedCrop (data.crop_scale_*, data.crop_ratio_*) resampled to "
     "data.image_size (bilinear, antialiased as PIL's) then data.flip, evaluation resizes the shorter side to "
     "data.eval_resize and takes the centre crop", 0},
    {"data.crop_scale_min", CFG_FLOAT32, "0.08", 0, "data.crop = random_resized: the smallest crop, as a share of "
     "the image's area", "(0, 1]"},
    {"data.crop_scale_max", CFG_FLOAT32, "1", 0, "data.crop = random_resized: the largest crop's share of the area",
     "(0, 1]"},
    {"data.crop_ratio_min", CFG_FLOAT32, "0.75", 0, "data.crop = random_resized: the narrowest crop (width over "
     "height; log-uniform between the two)", "(0, 100]"},
    {"data.crop_ratio_max", CFG_FLOAT32, "1.3333333", 0, "data.crop = random_resized: the widest crop", "(0, 100]"},
    {"data.eval_resize", CFG_INT, "0", 0, "data.crop = random_resized: evaluation's shorter side before its centre "
     "crop of data.image_size (0: data.image_size / 0.875, rounded: 256 for 224)", "[0, 16384]"},
    {"data.gpu_cpu_share", CFG_FLOAT32, "0.15", 0, "data.decode = gpu: the share of each batch's JPEGs decoded "
     "by the loader threads instead of the GPU, spread evenly over the batch (beside a training step the card's "
     "JPEG engines decode about a quarter as fast as alone: on an H200, ResNet-50's step outran them)", "[0, 1]"},
    {"data.dct_scaling", CFG_BOOL, "on", 0, "data.crop = random_resized, decoded on the CPU: a JPEG is decoded at "
     "1/2, 1/4 or 1/8 of its size (libjpeg-turbo's DCT-domain scaling) where the crop stays at least "
     "data.image_size, and only its crop's rows and columns are decoded", 0},
    {"data.mean", CFG_STRING, "auto", 0, "the normalisation's channel means (of pixel / 255), three numbers "
     "\"r,g,b\"; auto: CIFAR-10's (0.4914,0.4822,0.4465) for cifar_bin, synthetic and a folder or shards of "
     "CIFAR-10's ten classes, ImageNet's (0.485,0.456,0.406) for the rest", 0},
    {"data.std", CFG_STRING, "auto", 0, "the normalisation's standard deviations, as data.mean; auto: CIFAR-10's "
     "(0.2470,0.2435,0.2616) or ImageNet's (0.229,0.224,0.225), as data.mean's", 0},
    {"data.val_split", CFG_FLOAT, "0", 0, "evaluate on this share of the training split, held out by a seeded "
     "choice (run.seed) and never trained on, instead of the test split (which may then be missing); 0: the "
     "test split", "[0, 0.5]"},
    {"data.skip_bad", CFG_BOOL, "off", 0, "a streamed file that cannot be read or decoded is passed over: named in "
     "the log once, counted in the summary (skipped_files), its place in the batch taken by the epoch's next "
     "sample; off: it stops the run with its path", 0},
    {"data.shuffle_shards", CFG_INT, "8", 0, "shards: each epoch shuffles the order of the shards and the samples "
     "of each run of this many shards together, so that reads stay within a few files (0: all samples together)",
     "[0, 1000000]"},
    {"data.image_size", CFG_INT, "224", 0, "images are resized (bilinear) to this square size", "[8, 4096]"},
    {"data.train_limit", CFG_INT, "0", 0, "use only this many training images (0: all)", "[0, 2147483647]"},
    {"data.test_limit", CFG_INT, "0", 0, "use only this many test images (0: all)", "[0, 2147483647]"},
    {"data.synthetic_train", CFG_INT, "50000", 0, "training images of the synthetic source", "[1, 10000000]"},
    {"data.synthetic_test", CFG_INT, "10000", 0, "test images of the synthetic source", "[1, 10000000]"},
    {"data.workers", CFG_INT, "0", 0, "loader threads (0: load on the training thread)", "[0, 256]"},
    {"data.prefetch", CFG_INT, "2", 0, "batches in the host ring, built ahead of the step", "[1, 64]"},
    {"data.pinned", CFG_BOOL, "off", 0, "ring slots in pinned (page-locked) host memory", 0},
    {"data.async_copy", CFG_BOOL, "off", 0,
     "copy batches on a copy stream ordered by events; off: synchronous copy, then a device sync", 0},
    {"data.shuffle", CFG_BOOL, "on", 0, "new order of the training set each epoch", 0},
    {"data.flip", CFG_ENUM, "off", "off|on|alternate",
     "horizontal flip of training images: on, each with probability 1/2; alternate, a random half in the first "
     "epoch and then each image in every other epoch", 0},
    {"data.crop_pad", CFG_INT, "0", 0, "random crop after padding by this many pixels (data.pad_mode) (0: off)",
     "[0, 4096]"},
    {"data.pad_mode", CFG_ENUM, "zero", "zero|reflect",
     "the padding of data.crop_pad: zero pixels, or the image mirrored about its edge pixels (PyTorch's "
     "reflect; the CIFAR-10 speed runs' translation)", 0},
    {"data.cutout", CFG_INT, "0", 0, "cutout: zero a random square of this side (0: off)", "[0, 4096]"},
    {"data.transform_on", CFG_ENUM, "cpu", "cpu|gpu",
     "cpu: workers resize and normalise, float batches cross the bus; gpu: uint8 batches of the "
     "stored size cross the bus and one kernel resizes, augments and normalises", 0},
    {"data.on_device", CFG_BOOL, "off", 0,
     "the whole training set, decoded uint8 at its stored size, uploaded to the device once; each step gathers "
     "its batch there by the epoch's permutation and augments and normalises it in one kernel, as data.transform_on "
     "= gpu does (no loader threads, no copies per step; on the CPU the kernel's reference does the same)", 0},
    {"data.resident", CFG_BOOL, "off", 0,
     "train on one batch kept on the device: the step's throughput without the input pipeline", 0},

    {"model.name", CFG_STRING, "simplenet", 0,
     "the shipped net to train, nets/NAME.net built into trainc (simplenet, resnet18, resnet34, resnet50, "
     "airbench, vgg, mobilenetv2; docs/nets.md); model.net: a file of your own. A ResNet takes the CIFAR stem "
     "(3x3 conv) below data.image_size 128 and the ImageNet stem (7x7 stride 2, 3x3 max-pool) from 128 on; "
     "airbench: airbench94's net (2x2 whitening conv, three conv-pool-BN-GELU blocks of 64, 256, 256, global "
     "max, scaled linear), data.image_size 32 only; vgg: VGG-16 with batch norm for CIFAR (one linear layer); "
     "mobilenetv2: MobileNetV2 for CIFAR (ReLU for ReLU6)", 0},
    {"model.net", CFG_STRING, "", 0,
     "a net file to train (docs/nets.md), relative to the folder of the config that sets it; empty: model.name's "
     "shipped net (nets/NAME.net, built into trainc); of model.net and model.name the one set later names the net "
     "(an including config's or a --set over a config's), both in one file or both by --set is an error", 0},
    {"model.num_classes", CFG_INT, "0", 0, "classes of the net's head: 0 takes the data set's (its class folders, "
     "CIFAR-10's 10, shards' classes.txt); another number must equal the data set's (synthetic: 0 makes 10)",
     "[0, 1000]"},
    {"model.fuse", CFG_ENUM, "off", "off|on|graphs",
     "on: a convolution's bias, the ReLU after it and a 2x2 max-pool after that run as one pass over the "
     "convolution's output, whose backward writes the gradient over that output (CPU and GPU), and on the GPU "
     "in f16 or bf16 NHWC the input's 3x3 convolution runs with them as one kernel that never stores its "
     "output; without the pool, bias and ReLU run in one pass; a ReLU after batch norm or a residual add, and "
     "a GELU after batch norm or after airbench's whitening convolution (with its bias, in one pass over the "
     "image), run in their pass, the activation's output in theirs; on the GPU in NHWC a max-pool after a batch "
     "norm and ReLU runs in the norm's pass, whose output is never stored. graphs: on, and a convolution right "
     "before a batch norm computes "
     "that norm's statistics in its epilogue (one cuDNN graph, in training; f16 or bf16, model.layout = nhwc; "
     "over the input padded to 8 channels, trainc's direct forward kernel where it times faster than the graph) "
     "where an engine takes the shape and, under perf.conv_benchmark, where it times faster at start-up; then a "
     "batch norm + ReLU that only such a convolution reads becomes its prologue (the convolution applies scale, "
     "bias and ReLU to the norm's input as it loads it, forward and filter gradient, and the norm's output is "
     "never written) where engines take both graphs and, under perf.conv_benchmark, where it times faster; and "
     "a batch norm + ReLU that only the convolution after it reads runs its backward in that convolution's data "
     "gradient (one cuDNN graph, then one pass making dx) where an engine takes it and, under "
     "perf.conv_benchmark, where the two layers' backward times faster; the log names each choice (not with "
     "dist.sync_bn or perf.deterministic on the GPU; on the CPU every pair, prologue and backward is taken, "
     "composed of the reference ops); a grouped (depthwise) convolution takes only the bias, ReLU and max-pool "
     "pass, none of the graphs nor the input's kernel", 0},
    {"model.layout", CFG_ENUM, "nchw", "nchw|nhwc",
     "nhwc: channels-last activations and weights, the input padded to 8 channels, for tensor-core convolutions", 0},
    {"model.bn_momentum", CFG_FLOAT32, "0.1", 0,
     "batch norm: the weight of each training batch's statistics in the running ones (PyTorch's momentum)", "[0, 1]"},
    {"model.bn_eps", CFG_FLOAT32, "1e-05", 0, "batch norm: added to the variance before its square root", "(0, 1]"},
    {"model.bn_weight", CFG_ENUM, "trained", "trained|fixed",
     "batch norm's weight (gamma): trained, or fixed at 1 and never updated (airbench)", 0},
    {"model.whiten_bias_epochs", CFG_FLOAT32, "3", 0,
     "airbench: the whitening convolution's bias trains for the optimizer steps of this many epochs "
     "(ceil(epochs x steps per epoch)), then is frozen; its weights, set from the training images' 2x2 "
     "patches at the start of the run, are never trained", "[0, 1000000]"},

    {"optim.lr", CFG_FLOAT32, "0.01", 0,
     "learning rate of the global batch (train.batch x memory.accumulate x ranks); never rescaled by trainc",
     "(0, inf)"},
    {"optim.name", CFG_ENUM, "sgd", "sgd|muon|adamw|adam",
     "the optimizer, on the device, as one fused pass over the parameters: sgd, SGD with momentum (PyTorch's "
     "torch.optim.SGD, no dampening); muon, the trained convolutions' filters by Muon and the rest by SGD "
     "(optim.muon); adamw, torch.optim.AdamW (decoupled weight decay); adam, torch.optim.Adam (L2 weight decay "
     "in the gradient); both without amsgrad, their step count on the device, a step the loss scaler skips not "
     "counted. A key of another optimizer away from its default is refused", 0},
    {"optim.momentum", CFG_FLOAT32, "0.9", 0, "SGD momentum (optim.name = sgd, muon)", "[0, 1)"},
    {"optim.nesterov", CFG_BOOL, "off", 0, "Nesterov momentum (optim.name = sgd, muon)", 0},
    {"optim.beta1", CFG_FLOAT32, "0.9", 0, "Adam's first-moment decay (optim.name = adamw, adam; PyTorch's betas[0])",
     "[0, 1)"},
    {"optim.beta2", CFG_FLOAT32, "0.999", 0,
     "Adam's second-moment decay (optim.name = adamw, adam; PyTorch's betas[1])", "[0, 1)"},
    {"optim.eps", CFG_FLOAT32, "1e-08", 0,
     "added to Adam's root of the bias-corrected second moment (optim.name = adamw, adam)", "(0, 1]"},
    {"optim.weight_decay", CFG_FLOAT32, "0", 0,
     "weight decay: sgd, muon and adam add weight_decay x w to the gradient (L2); adamw multiplies each weight by "
     "1 - lr x weight_decay before its step (decoupled; PyTorch's AdamW default is 0.01, trainc's 0)", "[0, inf)"},
    {"optim.decay_bn_bias", CFG_BOOL, "on", 0, "off: weight decay leaves out biases and batch-norm parameters", 0},
    {"optim.bn_bias_lr_scale", CFG_FLOAT32, "1", 0,
     "batch norm's bias (beta) steps with optim.lr times this, its weight decay per step unchanged (decoupled: "
     "PyTorch's group lr x s with weight_decay / s)", "(0, 1000000]"},
    {"optim.head_lr_scale", CFG_FLOAT32, "1", 0,
     "the last linear layer's weights and bias step with optim.lr times this, their weight decay per step "
     "unchanged (decoupled, as optim.bn_bias_lr_scale)", "(0, 1000000]"},
    {"optim.muon", CFG_BOOL, "off", 0,
     "Muon for the trained convolutions' filters: Nesterov momentum orthogonalised by a Newton-Schulz "
     "iteration, each filter first scaled to norm sqrt(output channels), no weight decay (ops/muon.h); every "
     "other parameter stays with SGD (the older spelling of optim.name = muon)", 0},
    {"optim.muon_lr", CFG_FLOAT32, "0.24", 0,
     "Muon's learning rate; the schedule scales it as it scales optim.lr", "(0, 1000]"},
    {"optim.muon_momentum", CFG_FLOAT32, "0.6", 0, "Muon's Nesterov momentum", "[0, 1)"},
    {"optim.muon_ns_steps", CFG_INT, "5", 0, "Muon: Newton-Schulz rounds per step", "[1, 20]"},
    {"optim.schedule", CFG_ENUM, "constant", "constant|cosine|onecycle|linear",
     "learning rate per optimizer step, computed on the device: constant; cosine from optim.lr to "
     "optim.final_lr after a linear warm-up; onecycle as PyTorch's OneCycleLR (warm-up = its pct_start); "
     "linear from optim.lr to optim.final_lr after the warm-up (with it, a triangle)", 0},
    {"optim.warmup_epochs", CFG_FLOAT32, "0", 0,
     "linear learning-rate warm-up from optim.lr x optim.warmup_start_factor over this many epochs (cosine, "
     "onecycle, linear)", "[0, 1000000]"},
    {"optim.warmup_start_factor", CFG_FLOAT32, "0.1", 0,
     "where the warm-up starts, as a fraction of optim.lr (not onecycle, whose start is lr / 25)", "[0, 1]"},
    {"optim.final_lr", CFG_FLOAT32, "0", 0, "where the cosine and linear schedules end", "[0, inf)"},
    {"optim.label_smoothing", CFG_FLOAT32, "0", 0,
     "cross-entropy against (1 - e) x one-hot + e / classes (PyTorch's label_smoothing)", "[0, 1)"},
    {"optim.lookahead_every", CFG_INT, "0", 0,
     "lookahead every N optimizer steps (0: off): a slow copy of the parameters and batch-norm running "
     "statistics moves to a x slow + (1 - a) x trained, a = optim.lookahead_alpha x (step / steps)^"
     "optim.lookahead_power, and the net takes it; after the last step the net takes the slow copy (on the "
     "device; not with dist.shard_optimizer)", "[0, 1000000000]"},
    {"optim.lookahead_alpha", CFG_FLOAT32, "0.7738", 0, "lookahead: the slow copy's weight at the run's end",
     "[0, 1]"},
    {"optim.lookahead_power", CFG_FLOAT32, "3", 0, "lookahead: how the slow copy's weight grows over the run",
     "[0, 100]"},
    {"optim.clip_norm", CFG_FLOAT32, "0", 0,
     "clip the gradient's global L2 norm (after loss-scale unscaling) to this value, on the device (0: off)",
     "[0, inf)"},

    {"precision.tf32", CFG_BOOL, "off", 0,
     "let fp32 convolutions and matrix products use TF32 tensor cores (PyTorch's default for cuDNN)", 0},

    {"precision.amp", CFG_ENUM, "off", "off|fp16|bf16",
     "activations, convolutions and matrix products in half precision with fp32 accumulation; "
     "fp32 master weights and optimizer state", 0},
    {"precision.loss_scale", CFG_FLOAT32, "65536", 0, "initial scale of the dynamic loss scaler (AMP)", "(0, inf)"},
    {"precision.loss_scale_growth", CFG_FLOAT32, "2", 0, "scale factor after loss_scale_interval good steps",
     "[1, inf)"},
    {"precision.loss_scale_backoff", CFG_FLOAT32, "0.5", 0, "scale factor on a step with inf/NaN gradients (skipped)",
     "(0, 1]"},
    {"precision.loss_scale_interval", CFG_INT, "2000", 0, "good steps before the scale grows", "[1, 2147483647]"},

    {"perf.conv_workspace_mb", CFG_INT, "256", 0,
     "scratch memory a convolution's cuDNN algorithm may use (the fast ones at large batches need more)",
     "[0, 1048576]"},
    {"perf.conv_benchmark", CFG_BOOL, "off", 0,
     "choose convolution algorithms by timing each at start-up (cudnnFind, twice: the second ranking "
     "counts) rather than by heuristics; f16 and bf16 in NHWC also time up to 16 plans of cuDNN's backend "
     "API per pass, and a 3x3 stride-1 convolution of the input padded to 8 channels (at most 64 outputs) also "
     "trainc's own direct kernels for its forward and filter gradient, and a depthwise 3x3 or 5x5 (stride 1 or 2) "
     "trainc's depthwise kernels for every pass; the fastest kept (logged per layer)", 0},
    {"perf.overlap_wgrad", CFG_BOOL, "off", 0,
     "backward runs each convolution's filter gradient on a second stream, beside the batch norms, ReLUs and "
     "adds before it (memory-bound passes beside a compute-bound one), and joins it back before the next layer "
     "of another kind; the same kernels and the same bits as off", 0},
    {"perf.deterministic", CFG_BOOL, "on", 0,
     "only convolution algorithms that give the same bits every run; off: the fastest", 0},

    {"memory.accumulate", CFG_INT, "1", 0,
     "micro-batches of train.batch per optimizer step (gradients as for one batch k times as large)", "[1, 4096]"},
    {"memory.checkpoint", CFG_ENUM, "off", "off|blocks",
     "blocks: forward keeps only block inputs and outputs, backward recomputes the rest", 0},

    {"perf.cuda_graph", CFG_BOOL, "off", 0,
     "capture the step (forward, loss, backward, optimizer) once as a CUDA graph and replay it (its small "
     "memsets rewritten as kernels: runtime/gpu_graph.h)", 0},
    {"perf.graph_node_priority", CFG_BOOL, "off", 0,
     "instantiate the step's CUDA graph with each node's own stream priority "
     "(cudaGraphInstantiateFlagUseNodePriority), so the data-parallel all-reduces keep their high-priority "
     "stream's precedence over backward's kernels; off: the whole graph runs at its launch stream's priority", 0},

    {"dist.bucket_mb", CFG_INT, "25", 0,
     "data-parallel (mpirun): gradients are all-reduced in buckets of this many MiB, each as soon as backward "
     "has finished it (0: one bucket after backward)", "[0, 1048576]"},
    {"dist.allreduce_dtype", CFG_ENUM, "auto", "auto|fp32|fp16|bf16",
     "data-parallel: the type gradients travel in; auto: their own (fp32, or precision.amp's half type)", 0},
    {"dist.copy_engine", CFG_ENUM, "auto", "auto|on|off",
     "data-parallel on 2 to 8 GPUs of one host: all-reduces of 1 MiB or more move through the copy engines "
     "(CUDA IPC) and leave the SMs to backward; auto: where every pair of GPUs has peer access, else NCCL "
     "alone; on: stop if they cannot; off: NCCL alone", 0},
    {"dist.shard_optimizer", CFG_ENUM, "auto", "auto|on|off",
     "data-parallel through the copy engines: each rank updates only its part (1 / ranks) of what they average "
     "(master weights and the optimizer's state, ZeRO stage 1) and puts its updated weights into the other ranks' "
     "memory under the next forward pass; auto: wherever the copy engines average and optim.clip_norm is 0; on: stop if not; "
     "off: every rank updates every parameter", 0},
    {"dist.socket_threads", CFG_INT, "4", 0,
     "data-parallel over NCCL's socket transport (hosts without InfiniBand): helper threads per connection "
     "(NCCL_SOCKET_NTHREADS; NCCL's own default is 1); 0: NCCL's default; the environment variable, where set, "
     "wins", "[0, 16]"},
    {"dist.sockets_per_thread", CFG_INT, "4", 0,
     "data-parallel over NCCL's socket transport: sockets per helper thread (NCCL_NSOCKS_PERTHREAD; NCCL's own "
     "default is 1), at most 64 with dist.socket_threads multiplied in; 0: NCCL's default; the environment "
     "variable, where set, wins", "[0, 64]"},
    {"dist.sync_bn", CFG_BOOL, "off", 0,
     "data-parallel: batch norm normalises with the statistics of the global batch (all ranks), as PyTorch's "
     "SyncBatchNorm; off: each rank's own", 0},

    {"train.batch", CFG_INT, "32", 0, "samples per micro-batch and rank (train.batch x memory.accumulate x ranks per step)",
     "[1, 1048576]"},
    {"train.sync_after_step", CFG_BOOL, "on", 0, "wait for the device after every step (the lab's baseline)", 0},
    {"train.read_loss_every", CFG_INT, "1", 0,
     "copy the loss to the host every N steps (a host sync each time); 0: only when logging", "[0, 1000000000]"},
};

const int trainc_n_keys = (int)(sizeof trainc_keys / sizeof trainc_keys[0]);
