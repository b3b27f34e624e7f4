#include "ops/lr_schedule.h"

#include "runtime/check.h"

static __global__ void lr_schedule_step_kernel(LrSchedule s, int64_t *step_counter, float *lr) {
    int64_t step = *step_counter;
    *lr = (float)lr_schedule_value(&s, (long)step);
    *step_counter = step + 1;
}

void lr_schedule_step_cuda(const LrSchedule *s, int64_t *step_counter_dev, float *lr_dev,
                           cudaStream_t stream) {
    lr_schedule_check(s);
    lr_schedule_step_kernel<<<1, 1, 0, stream>>>(*s, step_counter_dev, lr_dev);
    CUDA_CHECK_LAUNCH();
}
