/*
 * fuzz-replay.h - the main() shared by the fuzz targets of tests/fuzz/ when
 * they are not built with libFuzzer: it replays the committed seed corpus
 * tests/fuzz/corpus-NAME/ (or the files and directories given as
 * arguments) through LLVMFuzzerTestOneInput, so that make check runs every
 * seed (and every regression input) under the normal build, without clang.
 *
 * A target includes this file last and defines FUZZ_NAME ("gguf", ...).
 * With -DTSR_FUZZ_LIBFUZZER (make fuzz) it is empty: libFuzzer brings main.
 */
#ifndef TSR_FUZZ_LIBFUZZER
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../tsrtest.h"

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    uint8_t *data = NULL;
    size_t size = 0, cap = 0, r;
    do {
        if (size == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nd = realloc(data, cap);
            if (!nd) {
                free(data);
                fclose(f);
                return 1;
            }
            data = nd;
        }
        r = fread(data + size, 1, cap - size, f);
        size += r;
    } while (r > 0);
    fclose(f);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

static int replay(const char *path, int *count) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        perror(path);
        return 1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        ++*count;
        return replay_file(path);
    }
    DIR *dir = opendir(path);
    if (!dir) {
        perror(path);
        return 1;
    }
    int rc = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.') continue;
        char child[4096];
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        rc |= replay(child, count);
    }
    closedir(dir);
    return rc;
}

int main(int argc, char **argv) {
    char def[4096];
    const char *top = getenv("top_srcdir");
    snprintf(def, sizeof def, "%s/tests/fuzz/corpus-%s", top ? top : ".", FUZZ_NAME);
    int rc = 0, count = 0;
    if (argc < 2) rc = replay(def, &count);
    for (int i = 1; i < argc; i++) rc |= replay(argv[i], &count);
    printf("fuzz-%s: replayed %d inputs\n", FUZZ_NAME, count);
    CHECK(rc == 0, "an input could not be read (see above)");
    CHECK(count > 0, "no inputs");
    return tsrtest_done("fuzz-" FUZZ_NAME);
}
#endif
