/* trainc pack: an image folder into WebDataset tar shards (data/shards.h),
 * for data.source = shards. */
#ifndef TRAINC_TOOLS_TRAINER_PACK_H
#define TRAINC_TOOLS_TRAINER_PACK_H

/* argv[0] is "pack"; the rest: --from ROOT --to DIR [--split train,test]
 * [--shard-mb N] [--seed S] [--no-shuffle]. Returns the exit status (0, 1 on
 * bad input, 2 on a bad command line). */
int pack_main(int argc, char **argv);

#endif
