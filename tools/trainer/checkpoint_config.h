/* What eval and bench-infer take from a checkpoint instead of the training
 * config: the net (its "net" section's text, or for a checkpoint written
 * before it kept one, meta's model name) and how its input was made. A config
 * given beside the checkpoint may set what does not change the net or its
 * input (the data path and source, train.batch, the device, workers, limits);
 * a key it sets that the checkpoint fixes must agree with the checkpoint. */
#ifndef TRAINC_TOOLS_TRAINER_CHECKPOINT_CONFIG_H
#define TRAINC_TOOLS_TRAINER_CHECKPOINT_CONFIG_H

#include "runtime/config.h"

typedef struct {
    char name[32];  /* meta's model: model.name, or the net file's name */
    char *net_text; /* the "net" section (malloc'ed); NULL: an older checkpoint's, built by model.name */
} CheckpointNet;

/* Sets in cfg, from the checkpoint at path, the keys it fixes: data.image_size, model.num_classes,
 * model.layout, data.mean, data.std, data.crop, data.eval_resize, model.bn_eps,
 * precision.amp (on a GPU), model.name (an older checkpoint's); and data.source, run.seed and train.batch
 * where cfg leaves them at their defaults. Their origin (config_origin) is "the checkpoint PATH". A key cfg sets
 * that contradicts the checkpoint (model.name or model.net naming another net among them) ends the
 * process naming the key, where it was set and both values; a checkpoint that cannot be read or holds
 * no meta section ends it with "OPTION PATH: why" (option: "--checkpoint"). */
void checkpoint_config_apply(Config *cfg, const char *option, const char *path, CheckpointNet *net);
void checkpoint_net_free(CheckpointNet *net);

#endif
