/* tok-unicode.c - UTF-8 coding, Unicode letter/number/whitespace classes and
 * the hand-written pre-tokenizer splitting (no regex library) of the model
 * example's tokenizer. The splitting rules follow what llama.cpp does for
 * the same tokenizer.ggml.pre, including its quirks, because token ids must
 * be identical to llama.cpp's for the same text. */
#include "tok-unicode.h"

#include "unicode-data.h"

size_t tku_len_utf8(unsigned char b) {
    static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[b >> 4];
}

static int is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

uint32_t tku_decode(const char *s, size_t len, size_t *pos) {
    const unsigned char *u = (const unsigned char *)s + *pos;
    size_t left = len - *pos;
    uint32_t cp = 0;
    size_t n;

    if (!(u[0] & 0x80)) {
        *pos += 1;
        return u[0];
    }
    if (!(u[0] & 0x40)) {
        n = 0;
    } else if (!(u[0] & 0x20)) {
        n = (left >= 2 && is_cont(u[1])) ? 2 : 0;
        cp = n ? ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F) : 0;
    } else if (!(u[0] & 0x10)) {
        n = (left >= 3 && is_cont(u[1]) && is_cont(u[2])) ? 3 : 0;
        cp = n ? ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F) : 0;
    } else if (!(u[0] & 0x08)) {
        n = (left >= 4 && is_cont(u[1]) && is_cont(u[2]) && is_cont(u[3])) ? 4 : 0;
        cp = n ? ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
                     (u[3] & 0x3F)
               : 0;
    } else {
        n = 0;
    }
    /* llama.cpp cannot re-encode codepoints past U+10FFFF; treat them as
     * malformed rather than fail. */
    if (n == 0 || cp > 0x10FFFF) {
        *pos += 1;
        return TKU_REPLACEMENT;
    }
    *pos += n;
    return cp;
}

size_t tku_encode(uint32_t cp, char out[4]) {
    if (cp <= 0x7F) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp <= 0x7FF) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp <= 0xFFFF) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | ((cp >> 18) & 0x07));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

int tku_is_letter(uint32_t cp) {
    if (cp < 0x80)
        return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(ucd_letter_ranges, sizeof ucd_letter_ranges / sizeof ucd_letter_ranges[0], cp);
}

int tku_is_number(uint32_t cp) {
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    return in_ranges(ucd_number_ranges, sizeof ucd_number_ranges / sizeof ucd_number_ranges[0], cp);
}

/* The Unicode White_Space property (the set llama.cpp uses for \s). */
int tku_is_whitespace(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* GPT-2's printable bytes stand for themselves; the others are shifted to
 * 256 + their rank among the non-printable ones. */
static int byte_is_printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); }

uint32_t tku_byte_to_cp(unsigned char b) {
    unsigned n = 0;
    if (byte_is_printable(b))
        return b;
    for (unsigned c = 0; c < b; c++) n += !byte_is_printable(c);
    return 256 + n;
}

int tku_cp_to_byte(uint32_t cp) {
    unsigned n = 0;
    if (cp < 256)
        return byte_is_printable(cp) ? (int)cp : -1;
    for (unsigned c = 0; c < 256; c++) {
        if (!byte_is_printable(c)) {
            if (256 + n == cp)
                return (int)c;
            n++;
        }
    }
    return -1;
}

/* Character classes as llama.cpp's flags see them; positions outside the
 * current piece have no class at all. */
enum { C_NONE = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 4, C_OTHER = 8 };

typedef struct span {
    const uint32_t *cps;
    size_t end;
} span;

static unsigned cls(const span *s, size_t pos) {
    uint32_t cp;
    if (pos >= s->end)
        return C_NONE;
    cp = s->cps[pos];
    if (tku_is_whitespace(cp))
        return C_SPACE;
    if (tku_is_letter(cp))
        return C_LETTER;
    if (tku_is_number(cp))
        return C_NUMBER;
    return C_OTHER;
}

static uint32_t at(const span *s, size_t pos) { return pos < s->end ? s->cps[pos] : 0xFFFFFFFFu; }

static uint32_t lower_ascii(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at pos: returns the match length or 0. */
static size_t contraction(const span *s, size_t pos, int fold) {
    uint32_t a, b;
    if (at(s, pos) != '\'' || pos + 1 >= s->end)
        return 0;
    a = fold ? lower_ascii(at(s, pos + 1)) : at(s, pos + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (pos + 2 >= s->end)
        return 0;
    b = fold ? lower_ascii(at(s, pos + 2)) : at(s, pos + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at pos: whitespace run, leaving the last one to the next
 * word when something follows it inside the piece. */
static size_t spaces(const span *s, size_t pos) {
    size_t n = 0;
    while (cls(s, pos + n) == C_SPACE) n++;
    if (n > 1 && pos + n < s->end)
        return n - 1;
    return n > 0 ? n : 1;
}

/* Length of the gpt2-rule word starting at pos. */
static size_t gpt2_word(const span *s, size_t pos) {
    size_t n = contraction(s, pos, 0), p;
    unsigned c2;
    if (n)
        return n;
    c2 = at(s, pos) == ' ' ? cls(s, pos + 1) : cls(s, pos);
    p = pos + (at(s, pos) == ' ');
    if (c2 == C_LETTER || c2 == C_NUMBER || c2 == C_OTHER) {
        while (cls(s, p) == c2) p++;
        return p - pos;
    }
    return spaces(s, pos);
}

/* Length of the llama3-rule word starting at pos. */
static size_t llama3_word(const span *s, size_t pos) {
    size_t n = contraction(s, pos, 1), p = pos;
    uint32_t cp = at(s, pos);
    unsigned c = cls(s, pos), c2;
    if (n)
        return n;
    if (!(cp == '\r' || cp == '\n' || c == C_NUMBER) && (c == C_LETTER || cls(s, pos + 1) == C_LETTER)) {
        p++;
        while (cls(s, p) == C_LETTER) p++;
        return p - pos;
    }
    if (c == C_NUMBER) {
        while (cls(s, p) == C_NUMBER && p - pos < 3) p++;
        return p - pos;
    }
    c2 = cp == ' ' ? cls(s, pos + 1) : c;
    if (c2 == C_OTHER) {
        p += (cp == ' ');
        while (cls(s, p) == C_OTHER) p++;
        while (at(s, p) == '\r' || at(s, p) == '\n') p++;
        return p - pos;
    }
    /* \s*[\r\n]+ takes the run up to its last newline */
    for (n = 0, p = 0; cls(s, pos + n) == C_SPACE; n++)
        if (at(s, pos + n) == '\r' || at(s, pos + n) == '\n')
            p = n + 1;
    return p ? p : spaces(s, pos);
}

static size_t split_piece(tku_pre pre, const uint32_t *cps, size_t beg, size_t end, size_t *lens) {
    span s = {cps, end};
    size_t n = 0;
    for (size_t pos = beg; pos < end;) {
        size_t len = pre == TKU_PRE_LLAMA3 ? llama3_word(&s, pos) : gpt2_word(&s, pos);
        lens[n++] = len;
        pos += len;
    }
    return n;
}

size_t tku_split(tku_pre pre, const uint32_t *cps, size_t n, size_t *lens) {
    size_t n_words = 0, beg = 0;
    if (pre != TKU_PRE_SMOLLM)
        return split_piece(pre, cps, 0, n, lens);
    /* smollm first isolates every \p{N} codepoint, then applies the gpt2
     * rules inside each remaining run. */
    for (size_t i = 0; i <= n; i++) {
        if (i < n && !tku_is_number(cps[i]))
            continue;
        n_words += split_piece(TKU_PRE_GPT2, cps, beg, i, lens + n_words);
        if (i < n)
            lens[n_words++] = 1;
        beg = i + 1;
    }
    return n_words;
}
