/*
 * replay_main.c - runs a libFuzzer driver over files without libFuzzer.
 *
 * Linked with each fuzz driver so that `make test` replays the committed seed
 * corpora (and the crash regressions kept there) on every build, including the
 * sanitizer builds. Arguments are files or directories of files.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mapped_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    char *buf = NULL;
    size_t size = 0;
    pjs_error err;
    if (pjs_read_file(path, 64u << 20, &buf, &size, &err) != 0) {
        fprintf(stderr, "replay: %s\n", err.msg);
        return 1;
    }
    LLVMFuzzerTestOneInput((const uint8_t *)buf, size);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, failures = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            failures += replay_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            failures += replay_file(path);
            files++;
        }
        if (d != NULL)
            closedir(d);
    }
    printf("replayed %d inputs, %d unreadable\n", files, failures);
    return files > 0 && failures == 0 ? 0 : 1;
}
