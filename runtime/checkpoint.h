/* A checkpoint file: named binary sections, versioned and checksummed, written
 * atomically. runtime/ knows nothing of what the sections mean; the trainer
 * names them ("params", "momentum", ...).
 *
 * Layout (integers little-endian, as the host writes them on x86-64 and ARM):
 *
 *   magic     8 bytes  "TRAINCK\n"
 *   version   u32      CKPT_VERSION
 *   sections  u32      how many follow
 *   per section:
 *     name    32 bytes NUL-padded
 *     size    u64      bytes of data
 *     data    size bytes
 *     crc     u32      CRC-32 (zlib's) of the data
 *   end       8 bytes  "TRCKEND\n"
 *   crc       u32      CRC-32 of every byte before it (every format version ends so: a
 *                      version newer than CKPT_VERSION is believed only when it matches)
 *
 * Writing goes to "<path>.tmp.<pid>" in the same directory, then fflush, fsync,
 * a rename to path that never replaces a file there (files_rename_noreplace)
 * and fsync of the directory: a reader sees no file or the whole new one,
 * never a part, and no existing file is written over. Every file opened is
 * noted as an input (files_note_input), so no output goes over it. A process killed mid-write leaves its temporary
 * file; ckpt_remove_stale_temporaries removes those of processes that no longer
 * run, and ckpt_remove_pending (from a signal handler or a fatal error) the one
 * being written.
 *
 * Opening checks the layout against the file's length before anything is read
 * from it (every size and count read from the file is checked against the
 * length before use; nothing is allocated from them), then reads the file once
 * end to end for every section's CRC and the file's CRC. Errors name the file
 * and say what it is: a directory, empty, not a checkpoint, truncated (its size
 * and the size expected), written by a newer trainc, a checksum mismatch. */
#ifndef TRAINC_CHECKPOINT_H
#define TRAINC_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_MAGIC "TRAINCK\n" /* the file's first 8 bytes */
#define CKPT_VERSION 1
#define CKPT_NAME_LEN 32
#define CKPT_MAX_SECTIONS 64

typedef struct CkptWriter CkptWriter;
typedef struct CkptFile CkptFile;

/* Starts a file of n_sections sections; NULL with a message in err when the
 * temporary file cannot be made. */
CkptWriter *ckpt_write_begin(const char *path, int n_sections, char *err, size_t errlen);
/* Sections are written in call order; names are unique, shorter than 32 bytes. */
int ckpt_write_section(CkptWriter *w, const char *name, const void *data, size_t bytes, char *err,
                       size_t errlen);
/* Finishes, syncs and renames into place; frees w. On failure the temporary
 * file is removed and the file at path (if any) is untouched. */
int ckpt_write_commit(CkptWriter *w, char *err, size_t errlen);
/* Removes the temporary file and frees w. */
void ckpt_write_abort(CkptWriter *w);

/* Removes the temporary file of the write in progress, if there is one (the
 * last begun). Async-signal-safe: for a handler that ends the process at once.
 * Writers also register it with tc_on_fatal. */
void ckpt_remove_pending(void);

/* A folder of checkpoints is one run's: the run holds CKPT_LOCK_FILE in it (an
 * flock, which the kernel drops when the process ends, however it ends) for as
 * long as it may write there. ckpt_lock_dir makes the folder when it is
 * missing (so a folder that cannot be written fails here, at the start) and
 * takes the lock; -1 with the reason in err: it cannot be made, or another
 * process holds it (err names its pid and host, from the file). Taking a lock
 * this process holds already is a no-op. */
#define CKPT_LOCK_FILE ".trainc.lock"
int ckpt_lock_dir(const char *dir, char *err, size_t errlen);
/* Whether this process holds dir's lock. */
int ckpt_dir_locked(const char *dir);
void ckpt_unlock_dir(const char *dir);
/* Removes from dir the temporary files "<prefix>*<suffix>.tmp.<pid>" but the
 * one this process is writing, regular files only, each with a warning naming
 * it; finished files are never touched. Only while this process holds dir's
 * lock: no one else writes there then, whatever pid namespace it runs in.
 * Returns how many were removed; 0 when dir does not exist or is not held. */
int ckpt_remove_stale_temporaries(const char *dir, const char *prefix, const char *suffix);
/* Deletes a finished checkpoint of this run: one it committed, or one that was
 * in the folder when it took the lock (the run it resumes). Any other file is
 * left, with errno EPERM. 0, or -1 with errno. */
int ckpt_remove_own(const char *path);

/* What is wrong with a file ckpt_open refused. */
typedef enum {
    CKPT_OK = 0,
    CKPT_ERR_IO,       /* cannot be opened or read (missing, permissions, I/O error) */
    CKPT_ERR_NOT_FILE, /* a directory or another kind of non-regular file */
    CKPT_ERR_NEWER,    /* a format version newer than this trainc reads: not damaged */
    CKPT_ERR_CORRUPT,  /* damaged: empty, not a checkpoint, truncated, a checksum mismatch */
} CkptStatus;

/* Opens and verifies a whole file; NULL with "FILE: what is wrong" in err. */
CkptFile *ckpt_open(const char *path, char *err, size_t errlen);
/* ckpt_open that also says in *status (when not NULL) what kind of failure. */
CkptFile *ckpt_open_status(const char *path, CkptStatus *status, char *err, size_t errlen);
/* Bytes of a section, or -1 when there is none of that name. */
int64_t ckpt_section_size(const CkptFile *f, const char *name);
/* Reads a section whose size must be exactly 'bytes' (checks its CRC again). */
int ckpt_read_section(CkptFile *f, const char *name, void *out, size_t bytes, char *err, size_t errlen);
/* How many sections the file holds, and the name of section i (in file order). */
int ckpt_section_count(const CkptFile *f);
const char *ckpt_section_name(const CkptFile *f, int i);
const char *ckpt_path(const CkptFile *f);
void ckpt_close(CkptFile *f);

/* CRC-32 (zlib's crc32: the polynomial of zlib, gzip and PNG); crc starts at 0. */
uint32_t ckpt_crc32(uint32_t crc, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
