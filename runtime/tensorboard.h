/* TensorBoard event files, written without TensorFlow: TFRecord framing
 * around a hand-encoded Event protobuf holding scalars.
 *   record: uint64 length, masked CRC32C of the length, data, masked CRC32C of the data
 *   Event:  wall_time (1, double), step (2, int64), file_version (3, string),
 *           summary (5, Summary { value (1, Value { tag (1, string), simple_value (2, float) }) })
 * The file is DIR/events.out.tfevents.<unix seconds>.<hostname>[.<rank>], as
 * TensorBoard looks for; its first record is the "brain.Event:2" version event.
 * Writes go into the FILE's buffer: tb_flush at log points, tb_close at the end. */
#ifndef TRAINC_TENSORBOARD_H
#define TRAINC_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TbWriter TbWriter;

/* Creates dir (and its parents) where missing and opens a new event file in
 * it; rank < 0: no rank in the name. NULL with the reason (path and system
 * error) in err when it cannot. */
TbWriter *tb_open(const char *dir, int rank, char *err, size_t errlen);
/* One scalar at step, as its own event. 0, or -1 when the write failed. */
int tb_scalar(TbWriter *w, const char *tag, int64_t step, float value);
/* 0, or -1 (errno set) when the buffered records could not be written. */
int tb_flush(TbWriter *w);
/* Flushes and closes; 0, or -1 when the last writes failed. NULL: nothing. */
int tb_close(TbWriter *w);
const char *tb_path(const TbWriter *w);

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's masked form of a CRC. */
uint32_t tb_crc32c(const void *data, size_t n);
uint32_t tb_mask_crc(uint32_t crc);

#ifdef __cplusplus
}
#endif
#endif
