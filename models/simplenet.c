/* SimpleNet, the lab's net: three blocks of conv3x3 (pad 1) + ReLU + 2x2
 * max-pool with 64, 128 and 256 channels, then fc 256*(s/8)^2 -> 512, ReLU,
 * fc 512 -> classes. At 224x224 fc1 has 200,704 inputs. Layers carry the
 * module names of the PyTorch reference (tools/torch_common.py's SimpleNet:
 * features.0/3/6, classifier.1/3). */
#include "models/zoo.h"

void simplenet_build(Model *m, int image_size) {
    static const int widths[3] = {64, 128, 256};
    int x = model_input(m, 3, image_size, image_size);
    for (int block = 0; block < 3; block++) {
        model_block_begin(m);
        x = model_conv(m, x, widths[block], 3, 1, 1);
        model_name_last(m, "features.%d", 3 * block);
        x = model_relu(m, x);
        x = model_maxpool2(m, x);
        model_block_end(m);
    }
    x = model_linear(m, x, 512);
    model_name_last(m, "classifier.1");
    x = model_relu(m, x);
    model_linear(m, x, m->num_classes);
    model_name_last(m, "classifier.3");
}
