/* The served-mode worker's executor (exec.h). */
#include <stdio.h>

#include "exec.h"

int sv_prepare(const char *libpath, int ordinal, char *err, size_t errlen) {
    (void)libpath;
    (void)ordinal;
    snprintf(err, errlen, "served mode: not built yet");
    return -1;
}

int sv_serve(int sock, char *err, size_t errlen) {
    (void)sock;
    snprintf(err, errlen, "served mode: not built yet");
    return -1;
}
