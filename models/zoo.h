/* The model zoo: the nets a config names, each a short composition of
 * models/model.h's builder calls. model.c knows none of them. */
#ifndef TRAINC_MODELS_ZOO_H
#define TRAINC_MODELS_ZOO_H

#include <stddef.h>

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds a named model (simplenet, resnet18, resnet34, resnet50, airbench) from its shipped net file
 * (nets/NAME.net, models/netfile.h); returns 0, or -1 with a message for an unknown name or an impossible
 * input size. */
int model_build(Model *m, const char *name, int batch, int image_size, int num_classes, int nhwc,
                char *err, size_t errlen);
/* The same net from its C builder below (tests/test_netfile.c compares the two); -1: no such name. */
int model_build_c(Model *m, const char *name, int batch, int image_size, int num_classes, int nhwc);
/* SimpleNet: 3 x (conv3x3 + ReLU + maxpool2), fc 256*(s/8)^2 -> 512, ReLU, fc -> classes. */
void simplenet_build(Model *m, int image_size);
/* ResNet-18/34 (basic blocks) and -50 (bottlenecks), torchvision's layout:
 * the CIFAR stem (3x3 conv, no max-pool) when imagenet_stem is 0, else the
 * ImageNet stem (7x7 stride 2, 3x3 stride-2 max-pool). Each residual block is
 * a checkpoint block. depth is 18, 34 or 50. */
void resnet_build(Model *m, int depth, int image_size, int imagenet_stem);
/* airbench94's net at 32x32 (models/airbench.c), blocks of the given widths
 * (the recipe's: AIRBENCH_WIDTHS); its first layer is the 2x2 whitening convolution. */
#define AIRBENCH_WIDTHS ((const int[3]){64, 256, 256})
void airbench_build(Model *m, const int widths[3]);

#ifdef __cplusplus
}
#endif
#endif
