/*
 * log.c - structured logging: records (level, message, key/value fields)
 * go to a callback; the default one writes logfmt lines to stderr. The level
 * comes from TSR_LOG_LEVEL or tsr_log_set_level(). Formatting uses stack
 * memory only, so logging never allocates.
 */
#include "internal.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

static tsr_log_fn tsr_log_cb;
static void *tsr_log_user;
static atomic_int tsr_log_level_v = -1; /* -1: not read from the environment yet */

static const char *const tsr_level_names[] = {"debug", "info", "warn", "error", "none"};

static int level_from_env(void) {
    const char *e = getenv("TSR_LOG_LEVEL");
    if (e) {
        for (int i = 0; i <= TSR_LOG_NONE; i++)
            if (strcasecmp(e, tsr_level_names[i]) == 0)
                return i;
        if (strcasecmp(e, "warning") == 0)
            return TSR_LOG_WARN;
        if (e[0] >= '0' && e[0] <= '4' && e[1] == '\0')
            return e[0] - '0';
    }
    return TSR_LOG_WARN;
}

tsr_log_level tsr_log_get_level(void) {
    int v = atomic_load(&tsr_log_level_v);
    if (v < 0) {
        v = level_from_env();
        atomic_store(&tsr_log_level_v, v);
    }
    return (tsr_log_level)v;
}

void tsr_log_set_level(tsr_log_level level) {
    if ((int)level < 0 || level > TSR_LOG_NONE)
        level = TSR_LOG_WARN;
    atomic_store(&tsr_log_level_v, (int)level);
}

void tsr_log_set(tsr_log_fn fn, void *user) {
    tsr_log_cb = fn;
    tsr_log_user = user;
}

bool tsr__log_enabled(tsr_log_level level) { return level >= tsr_log_get_level() && level < TSR_LOG_NONE; }

/* Appends a logfmt value: quoted when it holds spaces, quotes or '='. */
static size_t append_value(char *out, size_t pos, size_t cap, const char *v) {
    bool quote = v[0] == '\0';
    for (const char *p = v; *p; p++)
        if (isspace((unsigned char)*p) || *p == '"' || *p == '=')
            quote = true;
    if (quote && pos + 1 < cap)
        out[pos++] = '"';
    for (const char *p = v; *p && pos + 2 < cap; p++) {
        if (*p == '"' || *p == '\\')
            out[pos++] = '\\';
        out[pos++] = *p == '\n' ? ' ' : *p;
    }
    if (quote && pos + 1 < cap)
        out[pos++] = '"';
    out[pos] = '\0';
    return pos;
}

static void default_log(tsr_log_level level, const char *msg, const tsr_log_field *fields, size_t n_fields,
                        void *user) {
    (void)user;
    char line[2048];
    size_t pos = (size_t)snprintf(
        line, sizeof line, "level=%s lib=tensr msg=", tsr_level_names[level <= TSR_LOG_NONE ? level : TSR_LOG_ERROR]);
    pos = append_value(line, pos, sizeof line, msg);
    for (size_t i = 0; i < n_fields && pos + 4 < sizeof line; i++) {
        int n = snprintf(line + pos, sizeof line - pos, " %s=", fields[i].key);
        if (n < 0 || (size_t)n >= sizeof line - pos)
            break;
        pos += (size_t)n;
        pos = append_value(line, pos, sizeof line, fields[i].value ? fields[i].value : "");
    }
    fprintf(stderr, "%s\n", line);
}

void tsr__log(tsr_log_level level, const char *msg, size_t n_fields, ...) {
    if (!tsr__log_enabled(level))
        return;
    const char *kv[64];
    if (n_fields > 32)
        n_fields = 32;
    va_list ap;
    va_start(ap, n_fields);
    for (size_t i = 0; i < 2 * n_fields; i++) kv[i] = va_arg(ap, const char *);
    va_end(ap);
    tsr__log_fields(level, msg, n_fields, kv);
}

void tsr__log_fields(tsr_log_level level, const char *msg, size_t n_fields, const char *const *kv) {
    if (!tsr__log_enabled(level))
        return;
    tsr_log_field fields[32];
    if (n_fields > 32)
        n_fields = 32;
    for (size_t i = 0; i < n_fields; i++) {
        fields[i].key = kv[2 * i];
        fields[i].value = kv[2 * i + 1];
    }
    if (tsr_log_cb)
        tsr_log_cb(level, msg, fields, n_fields, tsr_log_user);
    else
        default_log(level, msg, fields, n_fields, NULL);
}

const char *tsr__fmt(char *buf, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return buf;
}
