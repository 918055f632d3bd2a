/*
 * libterrace.so loads with dlopen after program start, as a JVM (FFM) or Python (ctypes)
 * loads it: no environment variable, no link-time dependency. Before jemalloc's
 * initial-exec TLS was disabled this failed with "cannot allocate memory in static TLS
 * block". Usage: dlopen PATH_OF_LIBTERRACE SCRATCH_DIR
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef struct terrace_kind *terrace_kind_t;

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIBTERRACE [SCRATCH]\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    terrace_kind_t (*kind_default)(void);
    void *(*do_malloc)(terrace_kind_t, size_t);
    void (*do_free)(void *);
    /* POSIX: a data pointer converted to a function pointer, through memcpy as advised. */
    void *symbol = dlsym(lib, "terrace_kind_default");
    memcpy(&kind_default, &symbol, sizeof symbol);
    symbol = dlsym(lib, "terrace_malloc");
    memcpy(&do_malloc, &symbol, sizeof symbol);
    symbol = dlsym(lib, "terrace_free");
    memcpy(&do_free, &symbol, sizeof symbol);
    if (kind_default == NULL || do_malloc == NULL || do_free == NULL) {
        printf("dlsym failed: %s\n", dlerror());
        return 1;
    }
    /* Allocate on this thread and on the allocator's fast path, then free. */
    for (size_t size = 8; size <= ((size_t)1 << 20); size *= 4) {
        char *p = do_malloc(kind_default(), size);
        if (p == NULL) {
            printf("terrace_malloc(%zu) failed\n", size);
            return 1;
        }
        memset(p, 0xA5, size);
        do_free(p);
    }
    if (dlclose(lib) != 0) {
        printf("dlclose failed: %s\n", dlerror());
        return 1;
    }
    printf("dlopen: ok\n");
    return 0;
}
