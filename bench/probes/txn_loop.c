/*
 * txn_loop.c — what one pool transaction costs from C, thread-bound (terrace_pool_tx_*)
 * against by handle (terrace_pool_txn_*): an empty transaction, and a 108-byte zeroed
 * allocation plus a 100-byte write, in batches of 256 freed between batches (outside
 * the timing). One thread, a 256 MiB pool in DIR (default /dev/shm).
 *
 *   cc -O2 -Iinclude bench/probes/txn_loop.c -Ltarget/release -lterrace \
 *      -Wl,-rpath,$PWD/target/release -o /tmp/txn_loop && /tmp/txn_loop [DIR]
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "terrace_pool.h"

enum { BATCH = 256, BATCHES = 4000 };

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/txn_loop.pool", argc > 1 ? argv[1] : "/dev/shm");
    unlink(path);
    terrace_pool *p = terrace_pool_create(path, (size_t)256 << 20, "txn_loop");
    if (!p) {
        perror("terrace_pool_create");
        return 1;
    }
    char data[100];
    memset(data, 7, sizeof data);
    uint64_t offs[BATCH];
    for (int round = 0; round < 3; round++) {
        double t[4] = {0};
        for (int b = 0; b < BATCHES; b++) {
            double t0 = now_ns();
            for (int i = 0; i < BATCH; i++) {
                terrace_pool_tx_begin(p);
                terrace_pool_tx_commit(p);
            }
            double t1 = now_ns();
            for (int i = 0; i < BATCH; i++) {
                terrace_pool_txn_commit(terrace_pool_txn_begin(p, 0));
            }
            double t2 = now_ns();
            for (int i = 0; i < BATCH; i++) {
                terrace_pool_tx_begin(p);
                offs[i] = terrace_pool_tx_zalloc(p, 108, 1);
                memcpy((char *)terrace_pool_direct(p, offs[i]) + 8, data, sizeof data);
                terrace_pool_tx_commit(p);
            }
            double t3 = now_ns();
            for (int i = 0; i < BATCH; i++)
                terrace_pool_free_off(p, offs[i]);
            double t4 = now_ns();
            for (int i = 0; i < BATCH; i++) {
                terrace_pool_txn *txn = terrace_pool_txn_begin(p, 0);
                offs[i] = terrace_pool_txn_alloc(txn, 108, 1, TERRACE_POOL_TXN_ZERO);
                memcpy((char *)terrace_pool_direct(p, offs[i]) + 8, data, sizeof data);
                terrace_pool_txn_commit(txn);
            }
            double t5 = now_ns();
            for (int i = 0; i < BATCH; i++)
                terrace_pool_free_off(p, offs[i]);
            t[0] += t1 - t0;
            t[1] += t2 - t1;
            t[2] += t3 - t2;
            t[3] += t5 - t4;
        }
        double n = (double)BATCH * BATCHES;
        printf("empty: tx %.1f ns, txn %.1f ns | zalloc+write: tx %.1f ns, txn %.1f ns\n",
               t[0] / n, t[1] / n, t[2] / n, t[3] / n);
    }
    terrace_pool_close(p);
    unlink(path);
    return 0;
}
