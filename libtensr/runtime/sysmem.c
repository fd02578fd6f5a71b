/*
 * sysmem.c - the system memory a process may still take, for tsr_fit:
 * MemAvailable of /proc/meminfo, capped by the process's cgroup limit less
 * its usage (v2: memory.max - memory.current; v1: memory.limit_in_bytes -
 * memory.usage_in_bytes), whichever is smaller. Test hooks (read at each
 * call): TSR_FIT_SYSMEM=SIZE replaces the answer outright; TSR_FIT_PROC_ROOT
 * is a folder standing for "/" (its proc/meminfo, proc/self/cgroup and
 * sys/fs/cgroup/...), so that a cgroup limit can be simulated.
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

/* "123", "64MiB", "2G" -> bytes; false when malformed. */
bool tsr__parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0))
        return false;
    double mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1024.0;
    else if (*end == 'M' || *end == 'm')
        mult = 1048576.0;
    else if (*end == 'G' || *end == 'g')
        mult = 1073741824.0;
    if (mult > 1) {
        end++;
        if (*end == 'i')
            end++;
        if (*end == 'B')
            end++;
    } else if (*end == 'B')
        end++;
    if (*end != '\0' || v * mult >= 18446744073709551615.0)
        return false;
    *out = (size_t)(v * mult);
    return true;
}

static FILE *open_under(const char *root, const char *path) {
    char full[4096];
    if ((size_t)snprintf(full, sizeof full, "%s%s", root, path) >= sizeof full)
        return NULL;
    return fopen(full, "r");
}

/* The first number of a file ("max" reads as unlimited); false when absent. */
static bool read_number(const char *root, const char *path, size_t *out) {
    FILE *f = open_under(root, path);
    if (!f)
        return false;
    char line[64] = {0};
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok)
        return false;
    if (strncmp(line, "max", 3) == 0) {
        *out = SIZE_MAX;
        return true;
    }
    char *end;
    unsigned long long v = strtoull(line, &end, 10);
    if (end == line)
        return false;
    *out = v > SIZE_MAX ? SIZE_MAX : (size_t)v;
    return true;
}

static size_t mem_available(const char *root) {
    FILE *f = open_under(root, "/proc/meminfo");
    size_t avail = SIZE_MAX;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kib;
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            avail = (size_t)kib * 1024;
            break;
        }
    }
    if (f)
        fclose(f);
    return avail;
}

/* limit - usage of the cgroup at dir (files limit_name, usage_name); SIZE_MAX when unlimited or unknown. */
static size_t cgroup_room(const char *root, const char *dir, const char *limit_name, const char *usage_name) {
    char path[4096];
    size_t limit, usage = 0;
    snprintf(path, sizeof path, "%s/%s", dir, limit_name);
    if (!read_number(root, path, &limit) || limit == SIZE_MAX || limit >= ((size_t)1 << 60))
        return SIZE_MAX; /* v1 writes "unlimited" as a huge page-rounded number */
    snprintf(path, sizeof path, "%s/%s", dir, usage_name);
    read_number(root, path, &usage);
    return limit > usage ? limit - usage : 0;
}

/* The tightest room of the process's cgroups (v2 "0::/path", v1 "N:...memory...:/path"). */
static size_t cgroup_available(const char *root) {
    FILE *f = open_under(root, "/proc/self/cgroup");
    size_t room = SIZE_MAX;
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *ctrl = c1 + 1, *cg = c2 + 1;
        char dir[2048];
        size_t r = SIZE_MAX;
        if (*ctrl == '\0') { /* v2 */
            snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", strcmp(cg, "/") == 0 ? "" : cg);
            r = cgroup_room(root, dir, "memory.max", "memory.current");
        } else if (strstr(ctrl, "memory")) { /* v1 */
            snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", strcmp(cg, "/") == 0 ? "" : cg);
            r = cgroup_room(root, dir, "memory.limit_in_bytes", "memory.usage_in_bytes");
        }
        if (r < room)
            room = r;
    }
    if (f)
        fclose(f);
    return room;
}

size_t tsr__system_memory_available(void) {
    const char *env = getenv("TSR_FIT_SYSMEM");
    size_t n;
    if (env && *env && tsr__parse_size(env, &n))
        return n;
    const char *root = getenv("TSR_FIT_PROC_ROOT");
    if (!root)
        root = "";
    size_t avail = mem_available(root), cg = cgroup_available(root);
    if (avail == SIZE_MAX) { /* no meminfo: what the CPU device reports */
        size_t fr = 0, tot = 0;
        tsr_device_memory(tsr__host_device(), &fr, &tot);
        avail = fr;
    }
    return cg < avail ? cg : avail;
}
