/* trainc find-batch: the batch size that trains fastest on this card. */
#ifndef TRAINC_TOOLS_TRAINER_FIND_BATCH_H
#define TRAINC_TOOLS_TRAINER_FIND_BATCH_H

#include <stddef.h>

/* argv[0] is "find-batch"; the rest: --config FILE [--set k=v]... [--device D]
 * [--max-batch N]. Returns the exit status. */
int find_batch_main(int argc, char **argv);

/* Reads samples_per_s and peak_mem_bytes from a run's summary line; 0, or -1
 * when the line is not a JSON object with both as numbers. */
int find_batch_read_summary(const char *line, double *samples_per_s, double *peak_mem_bytes);
/* Why doubling stopped when batch gave samples_per_s against prev_samples_per_s
 * at batch / 2 (less than 5% more): "... 3.2% more samples/s ..." or, for a
 * slowdown, "... 30.0% slower ...". */
void find_batch_gain_reason(char *out, size_t n, long batch, double samples_per_s, double prev_samples_per_s);

#endif
