/* trainc find-batch: the batch size that trains fastest on this card. */
#ifndef TRAINC_TOOLS_FIND_BATCH_H
#define TRAINC_TOOLS_FIND_BATCH_H

/* argv[0] is "find-batch"; the rest: --config FILE [--set k=v]... [--device D]
 * [--max-batch N]. Returns the exit status. */
int find_batch_main(int argc, char **argv);

#endif
