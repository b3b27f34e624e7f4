/* trainc summary --config F: the net the config builds, layer by layer with
 * its output shape, parameters and forward FLOPs, and the totals (as
 * torchinfo or Keras's summary print them). On the CPU: no GPU, no data. */
#ifndef TRAINC_TOOLS_TRAINER_SUMMARY_H
#define TRAINC_TOOLS_TRAINER_SUMMARY_H

#include <stdio.h>

#include "models/model.h"
#include "runtime/config.h"
#include "tools/trainer/settings.h"

/* The table of m (built, not finalized), FLOPs per image. */
void summary_print(const Model *m, const char *title, FILE *f);
/* The same as one JSON line, what tools/torch_net.py builds PyTorch's module from: {"net", "input": [c, h, w],
 * "classes", "params", "bn_eps", "bn_momentum", "bn_weight_fixed", "layers": [{"id" (its module name, or its
 * label when it has none), "module", "kind", "inputs": [ids, "input" for the image], "output": [c, h, w],
 * "params", "block", and its kind's arguments: conv out_channels kernel stride pad groups bias whiten dirac;
 * linear in_features out_features bias; maxpool, avgpool kernel stride pad (global avgpool: global); scale
 * factor; dropout p}], "tensors": [{"name", "shape"}] in trainc export's order}. */
void summary_print_json(const Model *m, const char *title, const TrainSettings *s, FILE *f);
/* Builds the config's net (NCHW, one image; model.num_classes 0: 10) and prints its table (json: the JSON
 * line); returns 0. */
int summary_main(const Config *cfg, int json);

#endif
