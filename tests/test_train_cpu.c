/* SimpleNet at 32x32 learns real CIFAR-10 on the CPU: a few thousand images,
 * a few epochs, loss well below ln 10 and accuracy well above chance. */
#include <math.h>
#include <stdio.h>

#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/keys.h"
#include "tools/train.h"

static void set(Config *c, const char *assignment) {
    char err[512];
    if (config_set(c, assignment, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        CHECK(0);
    }
}

int main(void) {
    const char *root = test_cifar10_jpg_root();
    if (!root) {
        printf("no ../shared/data/cifar10-jpg.tar.gz: skipped\n");
        return 77;
    }
    Config *c = config_new(trainc_keys, trainc_n_keys);
    char path[600];
    snprintf(path, sizeof path, "data.path=%s", root);
    set(c, path);
    set(c, "run.device=cpu");
    set(c, "run.epochs=3");
    set(c, "run.seed=1");
    set(c, "run.log_every=50");
    set(c, "data.image_size=32");
    set(c, "data.train_limit=3000");
    set(c, "data.test_limit=1000");
    set(c, "data.workers=2");
    set(c, "train.batch=32");
    set(c, "optim.lr=0.02");

    TrainSummary s;
    train_run(c, &s);
    train_summary_print_json(&s, stdout);
    CHECK(s.steps == 3 * (3000 / 32));
    CHECK_MSG(s.final_loss < 1.9, "final loss %.3f, ln 10 = 2.303", s.final_loss);
    CHECK_MSG(s.test_acc > 0.30, "test accuracy %.3f, chance = 0.1", s.test_acc);
    CHECK(s.samples_per_s > 0);
    config_free(c);
    return test_finish("test_train_cpu");
}
