/* Growth of the runtime's FIFO ring buffers (ready-pool queues, send queue, report queue) and of
 * its growable arrays (the activation arena's lists: a ring whose head stays 0). */
#ifndef COACTO_RING_H
#define COACTO_RING_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Makes room for one more element in a ring of `elem`-byte items (*items, *cap, *head, count):
 * doubles the capacity (at least `min_cap`) and unwraps the ring to start at 0. Returns 0 when
 * out of memory (the ring is then unchanged). */
static inline int ring_reserve(void **items, uint32_t *cap, uint32_t *head, uint32_t count,
                               size_t elem, uint32_t min_cap) {
    if (count < *cap) return 1;
    uint32_t new_cap = *cap ? *cap * 2 : min_cap;
    char *grown = malloc(elem * new_cap);
    if (!grown) return 0;
    for (uint32_t i = 0; i < count; i++)
        memcpy(grown + i * elem, (char *)*items + ((*head + i) % *cap) * elem, elem);
    free(*items);
    *items = grown;
    *cap = new_cap;
    *head = 0;
    return 1;
}

#endif
