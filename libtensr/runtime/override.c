/*
 * override.c - buffer type override lists: parsing llama.cpp's -ot syntax
 * ("pattern=BUFT,pattern=BUFT"), and matching tensor names during placement
 * (POSIX extended regex, search anywhere in the name, first match wins).
 *
 * Parsing rules: entries are separated by ',' except inside {...} (so
 * "blk\.[0-9]{1,2}\.=CPU" keeps its repetition), the buffer type is after the
 * LAST '=' of an entry (buffer type names never contain one), surrounding
 * spaces of the buffer type name are ignored, and an -ot flag given several
 * times is the same list joined with ','. The list and its pattern strings
 * are one allocation, freed by tsr_buft_overrides_free.
 */
#include "core.h"

#include <stdio.h>

/* Length of the entry starting at s: up to the next ',' outside braces. */
static size_t entry_len(const char *s) {
    int depth = 0;
    size_t i = 0;
    for (; s[i] && !(s[i] == ',' && depth == 0); i++) {
        if (s[i] == '\\' && s[i + 1]) {
            i++;
            continue;
        }
        if (s[i] == '{')
            depth++;
        else if (s[i] == '}' && depth > 0)
            depth--;
    }
    return i;
}

static size_t count_entries(const char *spec) {
    size_t n = 0;
    for (const char *s = spec; *s;) {
        size_t len = entry_len(s);
        n++;
        s += len + (s[len] == ',');
    }
    return n;
}

/* A repetition operator right after another ("a++", "a*{9}") is undefined
 * in POSIX ERE, and glibc's regcomp copies the subtree once per operator:
 * forty of them took gigabytes (found by tests/fuzz/fuzz-overrides.c). */
static int stacked_repetition(const char *p) {
    int prev_rep = 0;
    for (; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++, prev_rep = 0;
            continue;
        }
        if (*p == '[') { /* a bracket expression: its * + ? { are literal */
            p += p[1] == '^' ? 2 : 1;
            p += *p == ']';
            while (*p && *p != ']') p++;
            if (!*p)
                return 0; /* unbalanced: regcomp reports it */
            prev_rep = 0;
            continue;
        }
        int rep = *p == '*' || *p == '+' || *p == '?' || *p == '{';
        if (rep && prev_rep)
            return 1;
        if (*p == '{')
            while (p[1] && *p != '}') p++;
        prev_rep = rep;
    }
    return 0;
}

static tsr_status check_regex(const char *pattern, const char *entry) {
    regex_t re;
    if (stacked_repetition(pattern))
        return tsr__error(TSR_E_INVALID,
                          "tsr_buft_overrides_parse: entry '%s': regular expression '%s' repeats a repetition "
                          "('a++', 'a*{2}'): not supported",
                          entry, pattern);
    int rc = regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char msg[128];
        regerror(rc, &re, msg, sizeof msg);
        return tsr__error(TSR_E_INVALID, "tsr_buft_overrides_parse: entry '%s': invalid regular expression '%s': %s",
                          entry, pattern, msg);
    }
    regfree(&re);
    return TSR_OK;
}

/* Parses one entry [s, s+len) into list[i]; the pattern goes to *text. */
static tsr_status parse_entry(const char *s, size_t len, tsr_buft_override *out, char **text) {
    char entry[512];
    snprintf(entry, sizeof entry, "%.*s", (int)(len < 500 ? len : 500), s);
    const char *eq = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == '=')
            eq = s + i;
    if (!eq || eq == s)
        return tsr__error(TSR_E_INVALID, "tsr_buft_overrides_parse: entry '%s' is not pattern=BUFFER_TYPE", entry);
    char name[64];
    const char *nb = eq + 1, *ne = s + len;
    while (nb < ne && *nb == ' ') nb++;
    while (ne > nb && ne[-1] == ' ') ne--;
    snprintf(name, sizeof name, "%.*s", (int)(ne - nb < 60 ? ne - nb : 60), nb);
    tsr_buffer_type *bt = tsr_buffer_type_by_name(name);
    if (!bt) {
        tsr__error_prefix("tsr_buft_overrides_parse: entry '%s'", entry);
        return TSR_E_NOT_FOUND;
    }
    size_t plen = (size_t)(eq - s);
    memcpy(*text, s, plen);
    (*text)[plen] = '\0';
    tsr_status st = check_regex(*text, entry);
    if (st != TSR_OK)
        return st;
    out->pattern = *text;
    out->buft = bt;
    *text += plen + 1;
    return TSR_OK;
}

tsr_status tsr_buft_overrides_parse(const char *spec, tsr_buft_override **out) {
    if (!out)
        return tsr__error(TSR_E_INVALID, "tsr_buft_overrides_parse: NULL out");
    *out = NULL;
    if (!spec)
        return tsr__error(TSR_E_INVALID, "tsr_buft_overrides_parse: NULL spec");
    size_t n = count_entries(spec), len = strlen(spec), bytes;
    if (tsr__mul_overflow(n + 1, sizeof(tsr_buft_override), &bytes) || tsr__add_overflow(bytes, len + n + 1, &bytes))
        return tsr__error(TSR_E_INVALID, "tsr_buft_overrides_parse: spec too long");
    tsr_buft_override *list = tsr__calloc(1, bytes);
    if (!list)
        return tsr__error(TSR_E_NOMEM, "tsr_buft_overrides_parse: out of host memory");
    char *text = (char *)(list + n + 1);
    size_t i = 0;
    for (const char *s = spec; *s; i++) {
        size_t elen = entry_len(s);
        tsr_status st = parse_entry(s, elen, &list[i], &text);
        if (st != TSR_OK) {
            tsr__free(list);
            return st;
        }
        s += elen + (s[elen] == ',');
    }
    list[i] = (tsr_buft_override){NULL, NULL};
    *out = list;
    return TSR_OK;
}

void tsr_buft_overrides_free(tsr_buft_override *list) { tsr__free(list); }

/* ---- matching -------------------------------------------------------------------- */

tsr_status tsr__overrides_compile(const tsr_buft_override *list, tsr_override_set *out) {
    memset(out, 0, sizeof *out);
    size_t n = 0;
    while (list && list[n].pattern) {
        if (n >= 4096)
            return tsr__error(TSR_E_INVALID, "override list: not NULL-terminated (more than 4096 entries)");
        n++;
    }
    if (n == 0)
        return TSR_OK;
    out->re = tsr__calloc(n, sizeof *out->re);
    out->buft = tsr__calloc(n, sizeof *out->buft);
    out->pattern = tsr__calloc(n, sizeof *out->pattern);
    out->n_matched = tsr__calloc(n, sizeof *out->n_matched);
    if (!out->re || !out->buft || !out->pattern || !out->n_matched) {
        tsr__overrides_release(out);
        return tsr__error(TSR_E_NOMEM, "out of host memory compiling the override list");
    }
    for (size_t i = 0; i < n; i++) {
        if (!list[i].buft) {
            tsr__overrides_release(out);
            return tsr__error(TSR_E_INVALID, "override list: entry %zu ('%s') has no buffer type", i, list[i].pattern);
        }
        int rc = regcomp(&out->re[i], list[i].pattern, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            char msg[128];
            regerror(rc, &out->re[i], msg, sizeof msg);
            tsr__overrides_release(out);
            return tsr__error(TSR_E_INVALID, "override list: invalid regular expression '%s': %s", list[i].pattern,
                              msg);
        }
        out->buft[i] = list[i].buft;
        out->pattern[i] = list[i].pattern;
        out->n++; /* compiled ones are freed by release */
    }
    return TSR_OK;
}

tsr_buffer_type *tsr__overrides_match(tsr_override_set *set, const char *name) {
    for (size_t i = 0; i < set->n; i++)
        if (regexec(&set->re[i], name, 0, NULL, 0) == 0) {
            set->n_matched[i]++;
            return set->buft[i];
        }
    return NULL;
}

void tsr__overrides_warn_unmatched(const tsr_override_set *set) {
    for (size_t i = 0; i < set->n; i++)
        if (set->n_matched[i] == 0)
            tsr__log(TSR_LOG_WARN, "buffer type override matched no tensor", 2, "pattern", set->pattern[i],
                     "buffer_type", set->buft[i]->name);
}

void tsr__overrides_release(tsr_override_set *set) {
    for (size_t i = 0; i < set->n; i++) regfree(&set->re[i]);
    tsr__free(set->re);
    tsr__free(set->buft);
    tsr__free(set->pattern);
    tsr__free(set->n_matched);
    memset(set, 0, sizeof *set);
}
