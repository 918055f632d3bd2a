/*
 * numa_kinds.c — memkind's NUMA kinds through libterrace.so, checked against the kernel's
 * own record of where each page went (get_mempolicy with MPOL_F_ADDR). Run by
 * tests/c_abi.rs (argv[1], a scratch directory, is unused).
 *
 * Where the machine has CPU-less memory nodes (PMem or CXL onlined as system RAM; the
 * guest of tests/vm/run has node 1), MEMKIND_DAX_KMEM and MEMKIND_DAX_KMEM_ALL are
 * available and place every page on such a node, and MEMKIND_HIGHEST_CAPACITY and
 * MEMKIND_HIGHEST_CAPACITY_LOCAL (the same selection here) on the largest node. Where it
 * has none, the DAX_KMEM kinds are unavailable and allocate nothing, as in memkind.
 * Either way MEMKIND_REGULAR places pages on nodes with CPUs, and
 * MEMKIND_LOWEST_LATENCY_LOCAL on the node of the CPU the program runs on (pinned to its
 * first CPU for the check). Prints "DAX_KMEM on node N" when there are CPU-less nodes.
 */
#include <memkind.h>
#include "check.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_NODES 64
#define MPOL_F_NODE (1 << 0)
#define MPOL_F_ADDR (1 << 1)
#define PAGE 4096
#define LEN (4 * MiB)

static int cpu_less[MAX_NODES], has_cpus[MAX_NODES];
static unsigned long long mem_kib[MAX_NODES];

/* Reads /sys/devices/system/node: which nodes have memory, CPUs, how much memory. */
static int read_nodes(void) {
    int count = 0;
    for (int n = 0; n < MAX_NODES; n++) {
        char path[128], line[4096];
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", n);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        line[0] = 0;
        if (!fgets(line, sizeof line, f))
            line[0] = 0;
        fclose(f);
        has_cpus[n] = line[0] != '\n' && line[0] != 0;
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d/meminfo", n);
        f = fopen(path, "r");
        CHECK(f != NULL);
        while (fgets(line, sizeof line, f)) {
            char *total = strstr(line, "MemTotal:");
            if (total)
                mem_kib[n] = strtoull(total + strlen("MemTotal:"), NULL, 10);
        }
        fclose(f);
        cpu_less[n] = !has_cpus[n] && mem_kib[n] > 0;
        count += cpu_less[n];
    }
    return count;
}

/* The node holding the page at addr (it must have been touched). */
static int node_of(void *addr) {
    int node = -1;
    CHECK(syscall(SYS_get_mempolicy, &node, NULL, 0UL, addr, MPOL_F_NODE | MPOL_F_ADDR) == 0);
    return node;
}

/* Allocates LEN bytes of kind, touches every page and returns the node all pages are on
 * (failing if they are spread). */
static int placed(memkind_t kind) {
    char *p = memkind_malloc(kind, LEN);
    CHECK(p != NULL);
    memset(p, 0x5a, LEN);
    int node = node_of(p);
    for (size_t off = PAGE; off < LEN; off += PAGE)
        CHECK(node_of(p + off) == node);
    memkind_free(kind, p);
    return node;
}

/* The node of the CPU this thread runs on (pinned, so it stays). */
static int pin_to_first_cpu(void) {
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &set))
        cpu++;
    CHECK(cpu < CPU_SETSIZE);
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    CHECK(sched_setaffinity(0, sizeof set, &set) == 0);
    unsigned got_cpu = 0, node = 0;
    CHECK(syscall(SYS_getcpu, &got_cpu, &node, NULL) == 0);
    CHECK((int)got_cpu == cpu);
    return (int)node;
}

int main(void) {
    int cpu_less_nodes = read_nodes();
    int local = pin_to_first_cpu();
    int regular = placed(MEMKIND_REGULAR);
    CHECK(regular >= 0 && regular < MAX_NODES && has_cpus[regular]);
    CHECK(placed(MEMKIND_LOWEST_LATENCY_LOCAL) == local);
    if (cpu_less_nodes == 0) {
        CHECK(memkind_check_available(MEMKIND_DAX_KMEM) != MEMKIND_SUCCESS);
        CHECK(memkind_check_available(MEMKIND_DAX_KMEM_ALL) != MEMKIND_SUCCESS);
        CHECK(memkind_malloc(MEMKIND_DAX_KMEM, 4096) == NULL);
        printf("numa_kinds: ok (no CPU-less node: MEMKIND_DAX_KMEM unavailable)\n");
        return 0;
    }
    CHECK(memkind_check_available(MEMKIND_DAX_KMEM) == MEMKIND_SUCCESS);
    int dax_kmem = placed(MEMKIND_DAX_KMEM);
    CHECK(dax_kmem >= 0 && dax_kmem < MAX_NODES && cpu_less[dax_kmem]);
    printf("DAX_KMEM on node %d\n", dax_kmem);
    int dax_kmem_all = placed(MEMKIND_DAX_KMEM_ALL);
    CHECK(dax_kmem_all >= 0 && dax_kmem_all < MAX_NODES && cpu_less[dax_kmem_all]);
    int largest = 0;
    for (int n = 1; n < MAX_NODES; n++)
        if (mem_kib[n] > mem_kib[largest])
            largest = n;
    CHECK(placed(MEMKIND_HIGHEST_CAPACITY) == largest);
    CHECK(placed(MEMKIND_HIGHEST_CAPACITY_LOCAL) == largest);
    printf("numa_kinds: ok (%d CPU-less node(s))\n", cpu_less_nodes);
    return 0;
}
