/*
 * check.h — what the C ABI tests share: CHECK (print the failed condition with its place
 * and exit 1), MiB, and a byte pattern to fill objects with and verify later.
 */
#ifndef TERRACE_TEST_CHECK_H
#define TERRACE_TEST_CHECK_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#define MiB ((size_t)1 << 20)

/* Fills [p, p+n) with a pattern that depends on seed and position. */
static inline void fill_pattern(void *p, size_t n, unsigned seed) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)(seed + i * 13u);
}

/* Whether [p, p+n) holds fill_pattern(p, n, seed). */
static inline int has_pattern(const void *p, size_t n, unsigned seed) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(seed + i * 13u))
            return 0;
    return 1;
}

#endif
