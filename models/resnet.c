/* ResNet (He et al. 2015) in torchvision's layout: basic blocks for 18 and 34
 * layers, bottlenecks (stride on the 3x3, "v1.5") for 50; convolutions
 * without bias, each followed by batch norm; a 1x1 convolution with batch
 * norm on the shortcut where the shape changes; global average pooling and
 * one fully connected layer. Every residual block is a checkpoint block.
 * Layers carry torchvision's module names ("layer2.0.downsample.0"), so the
 * tensors have its state_dict keys. */
#include "models/zoo.h"

#include <stdio.h>

/* A convolution named "<block>conv<k>" and its batch norm "<block>bn<k>"
 * (k = 0: the shortcut's, "<block>downsample.0" and ".1"). */
static int conv_bn(Model *m, int x, int channels, int kernel, int stride, const char *block, int k) {
    x = model_conv_no_bias(m, x, channels, kernel, kernel / 2, stride);
    if (k) model_name_last(m, "%sconv%d", block, k);
    else model_name_last(m, "%sdownsample.0", block);
    x = model_batchnorm(m, x);
    if (k) model_name_last(m, "%sbn%d", block, k);
    else model_name_last(m, "%sdownsample.1", block);
    return x;
}

static int shortcut(Model *m, int x, int channels, int stride, const char *block) {
    if (stride == 1 && m->acts[x].c == channels) return x;
    return conv_bn(m, x, channels, 1, stride, block, 0);
}

static int basic_block(Model *m, int x, int channels, int stride, const char *block) {
    model_block_begin(m);
    int y = model_relu(m, conv_bn(m, x, channels, 3, stride, block, 1));
    y = conv_bn(m, y, channels, 3, 1, block, 2);
    y = model_relu(m, model_add(m, y, shortcut(m, x, channels, stride, block)));
    model_block_end(m);
    return y;
}

static int bottleneck(Model *m, int x, int channels, int stride, const char *block) {
    model_block_begin(m);
    int y = model_relu(m, conv_bn(m, x, channels, 1, 1, block, 1));
    y = model_relu(m, conv_bn(m, y, channels, 3, stride, block, 2));
    y = conv_bn(m, y, 4 * channels, 1, 1, block, 3);
    y = model_relu(m, model_add(m, y, shortcut(m, x, 4 * channels, stride, block)));
    model_block_end(m);
    return y;
}

void resnet_build(Model *m, int depth, int image_size, int imagenet_stem) {
    static const int blocks18[4] = {2, 2, 2, 2}, blocks34[4] = {3, 4, 6, 3};
    const int *blocks = depth == 18 ? blocks18 : blocks34; /* 50 has 34's counts */
    int x = model_input(m, 3, image_size, image_size);
    if (imagenet_stem) {
        x = model_conv_no_bias(m, x, 64, 7, 3, 2);
        model_name_last(m, "conv1");
        x = model_batchnorm(m, x);
        model_name_last(m, "bn1");
        x = model_maxpool(m, model_relu(m, x), 3, 2, 1);
    } else {
        x = model_relu(m, conv_bn(m, x, 64, 3, 1, "", 1));
    }
    for (int stage = 0; stage < 4; stage++) {
        int channels = 64 << stage;
        for (int b = 0; b < blocks[stage]; b++) {
            int stride = stage > 0 && b == 0 ? 2 : 1;
            char block[24];
            snprintf(block, sizeof block, "layer%d.%d.", stage + 1, b);
            x = depth == 50 ? bottleneck(m, x, channels, stride, block) : basic_block(m, x, channels, stride, block);
        }
    }
    x = model_avgpool(m, x);
    model_linear(m, x, m->num_classes);
    model_name_last(m, "fc");
}
