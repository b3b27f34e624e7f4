/* Every config key trainc knows, with its type, default, help and, for every
 * number, its range: the one place a value alone is checked (generous for real
 * use, small enough that no int narrows or overflows). Rules that join keys
 * (perf.cuda_graph needs run.device = cuda) are in settings.c. */
#ifndef TRAINC_TOOLS_TRAINER_KEYS_H
#define TRAINC_TOOLS_TRAINER_KEYS_H

#include "runtime/config.h"

extern const CfgKeySpec trainc_keys[];
extern const int trainc_n_keys;

#endif
