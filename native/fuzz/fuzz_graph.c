/* libFuzzer target: coacto_graph_create on a description decoded from the input (graph_decode.h),
 * and one inference on each small graph it accepts, under AddressSanitizer and UBSan. A graph the
 * validator accepts must run inside its buffers: an op whose parameters read beyond its input is
 * the validator's bug as much as a crash in the validator itself.
 *
 *   make -C native fuzz FUZZ_SECONDS=600     (build/fuzz/fuzz_graph; crashes land in fuzz/crashes/)
 */
#include <stddef.h>
#include <stdint.h>

#include "graph_decode.h"

static coacto_runtime *rt;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    /* one computing thread: a second would only add scheduling noise to the coverage signal */
    return coacto_runtime_create(1, &rt) == COACTO_OK ? 0 : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)fuzz_graph_run(data, size, rt, NULL, 0);
    return 0;
}
