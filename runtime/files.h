/* Small file-system helpers shared by the runtime and the tools. */
#ifndef TRAINC_RUNTIME_FILES_H
#define TRAINC_RUNTIME_FILES_H

/* mkdir -p (mode 0777 less the umask): 0, or -1 with errno from the component
 * that failed (ENOTDIR when dir exists as a file). */
int files_make_dirs(const char *dir);

#endif
