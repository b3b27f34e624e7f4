/* trainc summary --config F: the net the config builds, layer by layer with
 * its output shape, parameters and forward FLOPs, and the totals (as
 * torchinfo or Keras's summary print them). On the CPU: no GPU, no data. */
#ifndef TRAINC_TOOLS_TRAINER_SUMMARY_H
#define TRAINC_TOOLS_TRAINER_SUMMARY_H

#include <stdio.h>

#include "models/model.h"
#include "runtime/config.h"

/* The table of m (built, not finalized), FLOPs per image. */
void summary_print(const Model *m, const char *title, FILE *f);
/* Builds the config's net (NCHW, one image; model.num_classes 0: 10) and prints its table; returns 0. */
int summary_main(const Config *cfg);

#endif
