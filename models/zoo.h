/* The model zoo: the nets a config names by model.name, each a shipped net
 * file (nets/NAME.net, built into trainc, read by models/netfile.c). model.c
 * knows none of them. */
#ifndef TRAINC_MODELS_ZOO_H
#define TRAINC_MODELS_ZOO_H

#include <stddef.h>

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds a shipped net by its name (simplenet, resnet18, resnet34, resnet50, airbench, vgg, mobilenetv2:
 * netfile_shipped_names()) from its file (nets/NAME.net, models/netfile.h); returns 0, or -1 with a message
 * for an unknown name or an impossible input size. */
int model_build(Model *m, const char *name, int batch, int image_size, int num_classes, int nhwc,
                char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
