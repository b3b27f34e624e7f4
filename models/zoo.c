/* The nets trainc knows, by the name model.name gives: the shipped net files (nets/NAME.net). */
#include "models/zoo.h"

#include "models/netfile.h"

#include <stdio.h>
#include <string.h>

/* The stem follows the image: CIFAR's for small images, ImageNet's from 128. */
int model_build(Model *m, const char *name, int batch, int image_size, int num_classes, int nhwc,
                char *err, size_t errlen) {
    int depth = strcmp(name, "resnet18") == 0 ? 18 : strcmp(name, "resnet34") == 0 ? 34
              : strcmp(name, "resnet50") == 0 ? 50 : 0;
    int imagenet_stem = image_size >= 128, airbench = strcmp(name, "airbench") == 0;
    int simplenet = strcmp(name, "simplenet") == 0;
    if (!netfile_shipped(name)) {
        snprintf(err, errlen, "model.name: unknown model '%s' (known: %s)", name, netfile_shipped_names());
        return -1;
    }
    if (airbench && image_size != 32) {
        snprintf(err, errlen, "data.image_size = %d: airbench is built for 32x32 images only", image_size);
        return -1;
    }
    if (simplenet && (image_size < 8 || image_size % 8)) {
        snprintf(err, errlen, "data.image_size = %d: SimpleNet needs a size divisible by 8 (32, 224, ...)",
                 image_size);
        return -1;
    }
    if (depth && (image_size < 8 || image_size % (imagenet_stem ? 32 : 8))) {
        snprintf(err, errlen, "data.image_size = %d: %s needs a size divisible by 8 below 128 (CIFAR stem) "
                 "and by 32 from 128 on (ImageNet stem): 32, 224, ...", image_size, name);
        return -1;
    }
    if (batch < 1 || num_classes < 2) {
        snprintf(err, errlen, "train.batch must be >= 1 and model.num_classes >= 2");
        return -1;
    }
    char path[64];
    snprintf(path, sizeof path, "nets/%s.net", name);
    NetShape shape = {batch, image_size, num_classes, nhwc};
    return netfile_build(m, path, netfile_shipped(name), &shape, err, errlen);
}
