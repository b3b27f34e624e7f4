/* Small file-system helpers shared by the runtime and the tools, and the one
 * place through which trainc writes its outputs.
 *
 * Outputs never write over what the user has:
 *   - an output that is the same file (device and inode) as a file the command
 *     reads (files_note_input: configs, checkpoints, run.init_from, predict's
 *     images, CIFAR batches) is refused, and so is one that holds a trainc
 *     checkpoint (its magic bytes): checkpoints are written only by the
 *     checkpoint writer, into new names;
 *   - a symlink is written through (the file it names is the output; the link
 *     stays);
 *   - a stream (files_open_output: CSV, metrics, traces, TensorBoard) may be a
 *     FIFO that a process reads or a character device (/dev/null, a terminal,
 *     /dev/full, whose writes then fail with ENOSPC): it is written through,
 *     never replaced; a FIFO no one reads, a directory, a socket and a block
 *     device are refused;
 *   - a whole file (files_whole_begin: export's safetensors, caches) is written
 *     beside its target and renamed into place; it replaces only a regular file
 *     that the caller's 'ours' test says is of the kind it writes, and never a
 *     file that appeared during the write; anything else is refused.
 * Refusals are one reason in err (the caller names the file and its key); the
 * functions never end the process. */
#ifndef TRAINC_RUNTIME_FILES_H
#define TRAINC_RUNTIME_FILES_H

#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

/* mkdir -p (mode 0777 less the umask): 0, or -1 with errno from the component
 * that failed (ENOTDIR when dir exists as a file). */
int files_make_dirs(const char *dir);

/* Notes a file this command reads (by its device and inode, taken from fd when
 * fd >= 0, else by stat of path), so that no output is written over it.
 * Thread-safe; a path that cannot be stat'ed is not noted. */
void files_note_input(const char *path, int fd);
/* Opens path to read, refusing (without ever blocking on a FIFO) what is not a
 * regular file: the fd (blocking, close-on-exec; its stat in *st when st is not
 * NULL; the caller notes it as an input where an output could name it), or -1
 * with *why the reason ("it is a directory", "it is a FIFO, not a regular
 * file", strerror's) and errno set (EISDIR for a
 * directory, EINVAL for the other kinds). Every reader of a file the user
 * names opens it through here. */
int files_open_input(const char *path, struct stat *st, const char **why);
/* What a file of this mode is, for messages: "a directory", "a FIFO", ... "not a regular file". */
const char *files_kind_name(mode_t mode);
/* Forgets every noted input (a test running several commands in one process). */
void files_forget_inputs(void);

/* Whether path may be an output: 0, or -1 with the reason in err (an input of
 * this command, a checkpoint, a directory...). Writes nothing; the open
 * functions check again. */
int files_check_output(const char *path, char *err, size_t errlen);

/* Opens a stream output, appending (append) or from its start (the file is
 * truncated only after the checks). NULL with the reason in err. */
FILE *files_open_output(const char *path, int append, char *err, size_t errlen);

/* A whole-file output in the making: write to f, then commit or abort. */
typedef struct {
    FILE *f;
    char target[4096]; /* the file renamed over: path, or the file its symlink names */
    char tmp[4200];
    int replaces;      /* the target existed (and passed the checks) at the start */
} FilesWhole;

/* ours(fd): whether an existing regular file is of the kind the caller writes
 * (then it may be replaced); NULL: no existing file is replaced. */
int files_whole_begin(FilesWhole *w, const char *path, int (*ours)(int fd), char *err, size_t errlen);
/* Flushes, syncs and renames into place (the checks once more); 0, or -1 with
 * the reason in err and the temporary file removed. */
int files_whole_commit(FilesWhole *w, int (*ours)(int fd), char *err, size_t errlen);
void files_whole_abort(FilesWhole *w);

/* Renames from to to, never replacing a file at to (EEXIST then):
 * renameat2(RENAME_NOREPLACE), or where the file system lacks it link() and
 * unlink(), or where it lacks hard links too, a check then rename(). 0 or -1
 * with errno. */
int files_rename_noreplace(const char *from, const char *to);

#endif
