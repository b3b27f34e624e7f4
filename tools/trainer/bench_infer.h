/* trainc bench-infer: the inference path's throughput and latency (models/infer.h).
 * Without --checkpoint the config names the net, its input size and classes,
 * the precision and layout it was trained in (precision.amp, model.layout:
 * inference runs in the same), and the weights are random ones of PyTorch's
 * default initialisation. With --checkpoint the net is rebuilt from the
 * checkpoint (its net section; an older one's by its meta's model name) with
 * its weights, its input size, classes and precision are the checkpoint's
 * (checkpoint_config.h: a config that sets them otherwise is refused), and a
 * config is optional. Either way the config gives perf.cuda_graph and how
 * convolutions are chosen (perf.*).
 * For each batch size, on one net of that size:
 *   images/s   batch * R / the time of R forwards back to back (CUDA events,
 *              R filling about half a second);
 *   latency    one forward at a time, from its launch to its end seen by the
 *              host (launch + stream sync), p50 and p99 over many.
 * The input is on the GPU and the logits stay there, as in
 * tools/torch_infer.py, the PyTorch reference. One line per batch on stdout:
 *   infer impl=trainc model=resnet18 image=32 batch=256 images_per_s=... p50_ms=... p99_ms=... */
#ifndef TRAINC_TOOLS_TRAINER_BENCH_INFER_H
#define TRAINC_TOOLS_TRAINER_BENCH_INFER_H

#include "runtime/config.h"

/* batches: "1,32,256"; checkpoint NULL: random weights; by_layer: each
 * batch's forward also run eagerly, op by op between CUDA events, and
 * printed by layer. Returns the exit status; bad input ends the process
 * with a message naming the key or file. */
int bench_infer_main(Config *cfg, const char *batches, const char *checkpoint, int by_layer);

#endif
