/* Replays the graph fuzzer's kept inputs (fuzz/crashes/: every crash it found, fixed since;
 * fuzz/corpus/: the seeds) through the same decoder and runner as native/fuzz/fuzz_graph.c, so
 * the ordinary, aarch64 and sanitized builds all check that none crashes again. Run from native/
 * (the Makefile does); directories given as arguments replace the default two. */
#define _DEFAULT_SOURCE /* DT_REG */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/graph_decode.h"

/* COACTO_FUZZ_VERBOSE=1: each input's verdict too (to check that a new seed is accepted). */
static int verbose;

static int replay_dir(const char *dir, coacto_runtime *rt, int *accepted) {
    DIR *dp = opendir(dir);
    if (!dp) {
        printf("%s: not found, nothing to replay\n", dir);
        return 0;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        uint8_t *data = malloc(1 << 20);
        size_t size = data ? fread(data, 1, 1 << 20, f) : 0;
        fclose(f);
        /* the printed name first: a crash below leaves it as the last line of the log */
        printf("  %s\n", path);
        fflush(stdout);
        char err[256] = "";
        coacto_status st = fuzz_graph_run(data, size, rt, err, sizeof err);
        if (st == COACTO_OK) (*accepted)++;
        if (verbose) printf("    %s%s%s\n", coacto_status_string(st), err[0] ? ": " : "", err);
        free(data);
        n++;
    }
    closedir(dp);
    return n;
}

int main(int argc, char **argv) {
    static const char *defaults[] = {"fuzz/crashes", "fuzz/corpus"};
    const char **dirs = argc > 1 ? (const char **)argv + 1 : defaults;
    int n_dirs = argc > 1 ? argc - 1 : 2;
    verbose = getenv("COACTO_FUZZ_VERBOSE") != NULL;
    coacto_runtime *rt = NULL;
    if (coacto_runtime_create(2, &rt) != COACTO_OK) {
        fprintf(stderr, "FAIL: runtime_create\n");
        return 1;
    }
    int total = 0, accepted = 0;
    for (int i = 0; i < n_dirs; i++) total += replay_dir(dirs[i], rt, &accepted);
    coacto_runtime_destroy(rt);
    printf("test_fuzz_graph: %d inputs replayed (%d graphs accepted and run), none crashed\n",
           total, accepted);
    return 0;
}
