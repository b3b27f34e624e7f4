#ifndef TRAINC_TOOLS_TRAINER_BENCH_LOADER_H
#define TRAINC_TOOLS_TRAINER_BENCH_LOADER_H

#include "runtime/config.h"

/* The lab's task 2.1 grid of loader throughputs, printed as a table. */
int bench_loader_main(const Config *cfg);

#endif
