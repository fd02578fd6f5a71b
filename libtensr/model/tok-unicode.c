/* tok-unicode.c - UTF-8 coding, Unicode letter/number/whitespace classes and
 * the hand-written pre-tokenizer splitting (no regex library) of the model
 * example's tokenizer. The splitting rules follow what llama.cpp does for
 * the same tokenizer.ggml.pre, including its quirks, because token ids must
 * be identical to llama.cpp's for the same text. */
#include "tok-unicode.h"

#include "unicode-data.h"

size_t tsr__tku_len_utf8(unsigned char b) {
    static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[b >> 4];
}

static int is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

uint32_t tsr__tku_decode(const char *s, size_t len, size_t *pos) {
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

size_t tsr__tku_encode(uint32_t cp, char out[4]) {
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

int tsr__tku_is_letter(uint32_t cp) {
    if (cp < 0x80)
        return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(ucd_letter_ranges, sizeof ucd_letter_ranges / sizeof ucd_letter_ranges[0], cp);
}

int tsr__tku_is_number(uint32_t cp) {
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    return in_ranges(ucd_number_ranges, sizeof ucd_number_ranges / sizeof ucd_number_ranges[0], cp);
}

/* The Unicode White_Space property (the set llama.cpp uses for \s). */
int tsr__tku_is_whitespace(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

int tsr__tku_is_punct(uint32_t cp) {
    return in_ranges(ucd_punct_ranges, sizeof ucd_punct_ranges / sizeof ucd_punct_ranges[0], cp);
}
int tsr__tku_is_symbol(uint32_t cp) {
    return in_ranges(ucd_symbol_ranges, sizeof ucd_symbol_ranges / sizeof ucd_symbol_ranges[0], cp);
}
int tsr__tku_is_mark(uint32_t cp) {
    return in_ranges(ucd_mark_ranges, sizeof ucd_mark_ranges / sizeof ucd_mark_ranges[0], cp);
}
int tsr__tku_is_control(uint32_t cp) {
    return in_ranges(ucd_control_ranges, sizeof ucd_control_ranges / sizeof ucd_control_ranges[0], cp);
}

uint32_t tsr__tku_tolower(uint32_t cp) {
    size_t lo = 0, hi = sizeof ucd_lower_map / sizeof ucd_lower_map[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < ucd_lower_map[mid][0])
            hi = mid;
        else if (cp > ucd_lower_map[mid][0])
            lo = mid + 1;
        else
            return ucd_lower_map[mid][1];
    }
    return cp;
}

uint32_t tsr__tku_nfd_first(uint32_t cp) {
    size_t lo = 0, hi = sizeof ucd_nfd_ranges / sizeof ucd_nfd_ranges[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < ucd_nfd_ranges[mid][0])
            hi = mid;
        else if (cp > ucd_nfd_ranges[mid][1])
            lo = mid + 1;
        else
            return ucd_nfd_ranges[mid][2];
    }
    return cp;
}

/* GPT-2's printable bytes stand for themselves; the others are shifted to
 * 256 + their rank among the non-printable ones. */
static int byte_is_printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); }

uint32_t tsr__tku_byte_to_cp(unsigned char b) {
    unsigned n = 0;
    if (byte_is_printable(b))
        return b;
    for (unsigned c = 0; c < b; c++) n += !byte_is_printable(c);
    return 256 + n;
}

int tsr__tku_cp_to_byte(uint32_t cp) {
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

#define IN_TABLE(t, cp) in_ranges(t, sizeof t / sizeof t[0], cp)

/* ---- character classes ----------------------------------------------------
 * Coarse classes as llama.cpp's hand-written splitters see them (letter,
 * number, whitespace, anything else); positions outside the current piece
 * have no class at all. The fine class splits "anything else" into the
 * \p{P}, \p{S}, \p{M} and other categories that the regex-driven splitters
 * (llama.cpp's std::regex on "collapsed" text) distinguish. */
enum { C_NONE = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 4, C_OTHER = 8 };
enum { F_NONE = 0, F_LETTER = 1, F_NUMBER = 2, F_SPACE = 4, F_PUNCT = 8, F_SYMBOL = 16, F_MARK = 32, F_OTHER = 64 };

typedef struct span {
    const uint32_t *cps;
    size_t end;
} span;

static unsigned cls(const span *s, size_t pos) {
    uint32_t cp;
    if (pos >= s->end)
        return C_NONE;
    cp = s->cps[pos];
    if (tsr__tku_is_whitespace(cp))
        return C_SPACE;
    if (tsr__tku_is_letter(cp))
        return C_LETTER;
    if (tsr__tku_is_number(cp))
        return C_NUMBER;
    return C_OTHER;
}

static unsigned fine(const span *s, size_t pos) {
    unsigned c = cls(s, pos);
    uint32_t cp;
    if (c != C_OTHER)
        return c; /* the same bits for letter, number, space, none */
    cp = s->cps[pos];
    if (tsr__tku_is_punct(cp))
        return F_PUNCT;
    if (tsr__tku_is_symbol(cp))
        return F_SYMBOL;
    if (tsr__tku_is_mark(cp))
        return F_MARK;
    return F_OTHER;
}

static uint32_t at(const span *s, size_t pos) { return pos < s->end ? s->cps[pos] : 0xFFFFFFFFu; }

static int is_nl(uint32_t cp) { return cp == '\r' || cp == '\n'; }

static int is_ascii_upper(uint32_t c) { return c >= 'A' && c <= 'Z'; }
static int is_ascii_lower(uint32_t c) { return c >= 'a' && c <= 'z'; }

static uint32_t lower_ascii(uint32_t c) { return is_ascii_upper(c) ? c + 32 : c; }

/* Length of the run of positions from pos whose fine class is in mask. */
static size_t run_of(const span *s, size_t pos, unsigned mask) {
    size_t p = pos;
    while (fine(s, p) & mask) p++;
    return p - pos;
}

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

/* \s*[\r\n]+ at pos: the whitespace run up to its last newline, or 0. */
static size_t spaces_to_newline(const span *s, size_t pos) {
    size_t n, last = 0;
    for (n = 0; cls(s, pos + n) == C_SPACE; n++)
        if (is_nl(at(s, pos + n)))
            last = n + 1;
    return last;
}

/* ---- the splitters ----------------------------------------------------------
 * Each splitter gives the length of the next word of the piece starting at
 * pos (a piece ends at s->end). llama.cpp runs a list of regexes, each
 * splitting the pieces the previous one made; text between two matches of
 * a regex stays a piece of its own (see next_of). */

typedef size_t (*match_fn)(const span *s, size_t pos);

/* The next piece for a regex-driven pass: the match at pos, or else the
 * text up to the next position where the regex matches. */
static size_t next_of(const span *s, size_t pos, match_fn m) {
    size_t len = m(s, pos), p;
    if (len)
        return len;
    for (p = pos + 1; p < s->end && !m(s, p); p++) continue;
    return p - pos;
}

/* gpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
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

/* The llama3 family: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
 * \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ with, as its
 * variants ask, the number of digits per word, marks (\p{M}) taken as
 * letters, and the leading contractions. */
typedef struct l3_rules {
    size_t max_digits;
    int marks, contractions;
    int no_newline_tail; /* seed-coder: no [\r\n]* after a punctuation run */
} l3_rules;

/* The llama3 rules after the letter words: \p{N}{1,max_digits},
 *  ?[^\s\p{L}\p{N}]+[\r\n]* (marks excluded too with marks), \s*[\r\n]+,
 * \s+(?!\S), \s+ */
static size_t l3_rest(const span *s, size_t pos, const l3_rules *r) {
    uint32_t cp = at(s, pos);
    unsigned c2, word = F_LETTER | F_NUMBER | F_SPACE | (r->marks ? F_MARK : 0);
    size_t p = pos, n;
    if (cls(s, pos) == C_NUMBER) {
        while (cls(s, p) == C_NUMBER && p - pos < r->max_digits) p++;
        return p - pos;
    }
    c2 = cp == ' ' ? fine(s, pos + 1) : fine(s, pos);
    if (c2 & ~word) {
        p += (cp == ' ');
        while (fine(s, p) & ~word) p++;
        while (!r->no_newline_tail && is_nl(at(s, p))) p++;
        return p - pos;
    }
    n = spaces_to_newline(s, pos);
    return n ? n : spaces(s, pos);
}

static size_t l3_word(const span *s, size_t pos, const l3_rules *r) {
    size_t n = r->contractions ? contraction(s, pos, 1) : 0, p = pos;
    uint32_t cp = at(s, pos);
    unsigned word = F_LETTER | (r->marks ? F_MARK : 0);
    if (n)
        return n;
    if (!(is_nl(cp) || cls(s, pos) == C_NUMBER) && ((fine(s, pos) & word) || (fine(s, pos + 1) & word))) {
        p++;
        while (fine(s, p) & word) p++;
        return p - pos;
    }
    return l3_rest(s, pos, r);
}

static size_t llama3_word(const span *s, size_t pos) {
    static const l3_rules r = {3, 0, 1, 0};
    return l3_word(s, pos, &r);
}

static size_t qwen2_word(const span *s, size_t pos) {
    static const l3_rules r = {1, 0, 1, 0};
    return l3_word(s, pos, &r);
}

static size_t seed_coder_word(const span *s, size_t pos) {
    static const l3_rules r = {1, 0, 1, 1};
    return l3_word(s, pos, &r);
}

static size_t ufakzeka_word(const span *s, size_t pos) { /* qwen2 without the contractions */
    static const l3_rules r = {1, 0, 0, 0};
    return l3_word(s, pos, &r);
}

static size_t minicpm5_word(const span *s, size_t pos) { /* \p{N}+ after a \p{N}{1,3} pass */
    static const l3_rules r = {(size_t)-1, 0, 1, 0};
    return l3_word(s, pos, &r);
}

static size_t qwen35_word(const span *s, size_t pos) {
    static const l3_rules r = {1, 1, 1, 0};
    return l3_word(s, pos, &r);
}

/* Han characters as llama.cpp's kimi-k2 splitter counts them. */
static int is_han(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2EBEF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static int kimi_letter(const span *s, size_t pos) { return cls(s, pos) == C_LETTER && !is_han(at(s, pos)); }

/* kimi-k2: [\p{Han}]+, then the llama3 rules with non-Han letter words
 * that may end in a contraction (no leading contractions). */
static size_t kimi_word(const span *s, size_t pos) {
    static const l3_rules r = {3, 0, 0, 0};
    uint32_t cp = at(s, pos);
    size_t p = pos;
    unsigned c = cls(s, pos);
    if (is_han(cp)) {
        while (is_han(at(s, p))) p++;
        return p - pos;
    }
    if (kimi_letter(s, pos) || (!(is_nl(cp) || c == C_LETTER || c == C_NUMBER) && kimi_letter(s, pos + 1))) {
        p++;
        while (kimi_letter(s, p)) p++;
        return p - pos + contraction(s, p, 1);
    }
    return l3_rest(s, pos, &r);
}

/* The letter words of gpt-4o and tekken, on llama.cpp's collapsed text:
 * "upper" is a letter but not a-z, "lower" a letter but not A-Z (so a
 * non-ASCII letter is both). [^\r\n\p{L}\p{N}]?U*L+ | [^\r\n\p{L}\p{N}]?U+L*,
 * with ECMAScript's backtracking; 0 when neither matches. */
static int is_up(const span *s, size_t p) { return cls(s, p) == C_LETTER && !is_ascii_lower(at(s, p)); }
static int is_lo(const span *s, size_t p) { return cls(s, p) == C_LETTER && !is_ascii_upper(at(s, p)); }

static size_t lo_run(const span *s, size_t p) {
    size_t n = 0;
    while (is_lo(s, p + n)) n++;
    return n;
}

static size_t cased_letters(const span *s, size_t pos) {
    uint32_t cp = at(s, pos);
    unsigned c = cls(s, pos);
    size_t q = pos + (c != C_NONE && !is_nl(cp) && c != C_LETTER && c != C_NUMBER), u = 0;
    while (is_up(s, q + u)) u++;
    for (size_t j = u + 1; j-- > 0;) /* U*L+: give back upper letters until a lower one follows */
        if (is_lo(s, q + j))
            return q - pos + j + lo_run(s, q + j);
    if (u > 0) /* U+L* */
        return q - pos + u + lo_run(s, q + u);
    return 0;
}

/* gpt-4o (tekken when digits is 1 and with_contraction 0): the cased
 * letter words (with a trailing contraction), \p{N}{1,3},
 *  ?[^\s\p{L}\p{N}]+[\r\n/]*, \s*[\r\n]+, \s+(?!\S), \s+ */
static size_t cased_word(const span *s, size_t pos, size_t digits, int with_contraction) {
    size_t n = cased_letters(s, pos), p = pos;
    uint32_t cp = at(s, pos);
    unsigned c2;
    if (n)
        return n + (with_contraction ? contraction(s, pos + n, 1) : 0);
    if (cls(s, pos) == C_NUMBER) {
        while (cls(s, p) == C_NUMBER && p - pos < digits) p++;
        return p - pos;
    }
    c2 = cp == ' ' ? cls(s, pos + 1) : cls(s, pos);
    if (c2 == C_OTHER) {
        p += (cp == ' ');
        while (cls(s, p) == C_OTHER) p++;
        while (is_nl(at(s, p)) || at(s, p) == '/') p++;
        return p - pos;
    }
    n = spaces_to_newline(s, pos);
    return n ? n : spaces(s, pos);
}

static size_t gpt4o_word(const span *s, size_t pos) { return cased_word(s, pos, 3, 1); }
static size_t tekken_word(const span *s, size_t pos) { return cased_word(s, pos, 1, 0); }

/* ---- regex passes (llama.cpp runs these through std::regex) ---------------- */

/* llama.cpp's std::wregex sees non-ASCII whitespace as U+000B. */
static uint32_t wide_cp(const span *s, size_t pos) {
    uint32_t cp = at(s, pos);
    return (cp > 0x7F && cp != 0xFFFFFFFFu && tsr__tku_is_whitespace(cp)) ? 0x0B : cp;
}

/* [\r\n] */
static size_t m_newline(const span *s, size_t pos) { return is_nl(at(s, pos)); }

/* \p{N} and \p{N}+ and \p{N}{1,3} */
static size_t m_digit(const span *s, size_t pos) { return cls(s, pos) == C_NUMBER; }
static size_t m_digits(const span *s, size_t pos) { return run_of(s, pos, F_NUMBER); }
static size_t m_digits3(const span *s, size_t pos) {
    size_t n = run_of(s, pos, F_NUMBER);
    return n < 3 ? n : 3;
}

/* [0-9][0-9][0-9] */
static size_t m_ascii3(const span *s, size_t pos) {
    for (size_t k = 0; k < 3; k++)
        if (at(s, pos + k) < '0' || at(s, pos + k) > '9')
            return 0;
    return 3;
}

/* falcon's [\p{P}\$\+<=>\^~\|`]+ and the default's [\p{P}\$\+<=>\^~\|]+ */
static int falcon_punct(const span *s, size_t p, int backtick) {
    uint32_t cp = at(s, p);
    unsigned f = fine(s, p);
    return f == F_PUNCT || (f == F_SYMBOL && cp < 0x80 && (backtick || cp != '`'));
}

static size_t m_falcon_punct(const span *s, size_t pos) {
    size_t p = pos;
    while (falcon_punct(s, p, 1)) p++;
    return p - pos;
}

static size_t m_default_punct(const span *s, size_t pos) {
    size_t p = pos;
    while (falcon_punct(s, p, 0)) p++;
    return p - pos;
}

/* \s?X+ for a class X: one whitespace may lead the run. */
static size_t ws_then_run(const span *s, size_t pos, int (*in)(const span *, size_t)) {
    size_t p = pos + (cls(s, pos) == C_SPACE && in(s, pos + 1));
    if (!in(s, p))
        return 0;
    while (in(s, p)) p++;
    return p - pos;
}

/* deepseek-llm's Latin, Greek, Cyrillic, ... letters (its regex's class). */
static const uint32_t ds_letters[][2] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

/* deepseek-llm's [!-/:-~！-／：-～‘-‟　-。] (ASCII and full-width punctuation) */
static const uint32_t ds_punct[][2] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0x2018, 0x201F},
                                       {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}};

/* [一-龥ࠀ-一가-퟿] (deepseek-llm, deepseek-coder) and [一-龥぀-ゟ゠-ヿ] (deepseek-v3) */
static const uint32_t ds_cjk[][2] = {{0x800, 0x4E00}, {0x4E00, 0x9FA5}, {0xAC00, 0xD7FF}};
static const uint32_t ds3_cjk[][2] = {{0x3040, 0x309F}, {0x30A0, 0x30FF}, {0x4E00, 0x9FA5}};

static int in_ds_letters(const span *s, size_t p) { return p < s->end && IN_TABLE(ds_letters, wide_cp(s, p)); }
static int in_ds_punct(const span *s, size_t p) { return p < s->end && IN_TABLE(ds_punct, wide_cp(s, p)); }
static int is_letter_at(const span *s, size_t p) { return cls(s, p) == C_LETTER; }
static int is_punct_at(const span *s, size_t p) { return fine(s, p) == F_PUNCT; }

static size_t m_ds_letters(const span *s, size_t pos) { return ws_then_run(s, pos, in_ds_letters); }
static size_t m_ds_punct(const span *s, size_t pos) { return ws_then_run(s, pos, in_ds_punct); }
static size_t m_ws_letters(const span *s, size_t pos) { return ws_then_run(s, pos, is_letter_at); }
static size_t m_ws_punct(const span *s, size_t pos) { return ws_then_run(s, pos, is_punct_at); }

static size_t table_run(const span *s, size_t pos, const uint32_t (*t)[2], size_t n) {
    size_t p = pos;
    while (p < s->end && in_ranges(t, n, wide_cp(s, p))) p++;
    return p - pos;
}

static size_t m_ds_cjk(const span *s, size_t pos) { return table_run(s, pos, ds_cjk, 3); }
static size_t m_ds3_cjk(const span *s, size_t pos) { return table_run(s, pos, ds3_cjk, 3); }

/* \s+$: the whitespace that ends the piece, or the text before it (one
 * look from the end instead of a match tried at every position). */
static size_t r_trailing_ws(const span *s, size_t pos) {
    size_t t = s->end;
    while (t > pos && tsr__tku_is_whitespace(s->cps[t - 1])) t--;
    return t > pos ? t - pos : s->end - pos;
}

/* deepseek-v3's last pass: [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|
 * [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|
 * \s+(?!\S)|\s+ */
static int is_ascii_alpha(uint32_t c) { return is_ascii_upper(c) || is_ascii_lower(c); }

static size_t m_ds3_word(const span *s, size_t pos) {
    uint32_t cp = at(s, pos);
    unsigned f = fine(s, pos), lm = F_LETTER | F_MARK, ps = F_PUNCT | F_SYMBOL;
    size_t p = pos + 1, n;
    if (cp < 0x80 && (f & ps) && is_ascii_alpha(at(s, p))) {
        while (is_ascii_alpha(at(s, p))) p++;
        return p - pos;
    }
    if (f != F_NONE && !is_nl(cp) && !(f & (F_LETTER | ps)) && (fine(s, pos + 1) & lm))
        return 1 + run_of(s, pos + 1, lm);
    if ((n = run_of(s, pos, lm)))
        return n;
    p = pos + (cp == ' ' && (fine(s, pos + 1) & ps));
    if ((n = run_of(s, p, ps))) {
        p += n;
        while (is_nl(at(s, p))) p++;
        return p - pos;
    }
    if ((n = spaces_to_newline(s, pos)))
        return n;
    return cls(s, pos) == C_SPACE ? spaces(s, pos) : 0;
}

/* bloom: " ?[^(\s|.,!?…。，、।۔،)]+" */
static int bloom_char(const span *s, size_t p) {
    static const uint32_t stop[] = {'(',    '|',    '.',    ',',    '!',   '?',   ')',
                                    0x2026, 0x3002, 0xFF0C, 0x3001, 0x964, 0x6D4, 0x60C};
    uint32_t cp = wide_cp(s, p);
    if (p >= s->end || cls(s, p) == C_SPACE)
        return 0;
    for (size_t k = 0; k < sizeof stop / sizeof stop[0]; k++)
        if (cp == stop[k])
            return 0;
    return 1;
}

static size_t m_bloom(const span *s, size_t pos) {
    size_t p = pos + (at(s, pos) == ' ' && bloom_char(s, pos + 1));
    if (!bloom_char(s, p))
        return 0;
    while (bloom_char(s, p)) p++;
    return p - pos;
}

/* [^\n]+|[\n]+ */
static size_t newline_runs(const span *s, size_t pos) {
    size_t p = pos;
    int nl = at(s, pos) == '\n';
    while (p < s->end && (at(s, p) == '\n') == nl) p++;
    return p - pos;
}

/* One function per pass: custom splitters return words directly, regex
 * passes go through next_of. */
#define REGEX_PASS(name, m) \
    static size_t name(const span *s, size_t pos) { return next_of(s, pos, m); }
REGEX_PASS(r_newline, m_newline)
REGEX_PASS(r_digit, m_digit)
REGEX_PASS(r_digits, m_digits)
REGEX_PASS(r_digits3, m_digits3)
REGEX_PASS(r_ascii3, m_ascii3)
REGEX_PASS(r_falcon_punct, m_falcon_punct)
REGEX_PASS(r_default_punct, m_default_punct)
REGEX_PASS(r_ds_letters, m_ds_letters)
REGEX_PASS(r_ds_punct, m_ds_punct)
REGEX_PASS(r_ds_cjk, m_ds_cjk)
REGEX_PASS(r_ds3_cjk, m_ds3_cjk)
REGEX_PASS(r_ws_letters, m_ws_letters)
REGEX_PASS(r_ws_punct, m_ws_punct)
REGEX_PASS(r_ds3_word, m_ds3_word)
REGEX_PASS(r_bloom, m_bloom)

typedef size_t (*pass_fn)(const span *s, size_t pos);

enum { MAX_PASSES = 6 };

/* The passes of each pre-tokenizer, in llama.cpp's order (NULL-terminated). */
static const pass_fn pre_passes[TKU_PRE_COUNT][MAX_PASSES + 1] = {
    [TKU_PRE_GPT2] = {gpt2_word},
    [TKU_PRE_SMOLLM] = {r_digit, gpt2_word},
    [TKU_PRE_LLAMA3] = {llama3_word},
    [TKU_PRE_DEFAULT] = {r_default_punct, gpt2_word, r_digits, r_ascii3},
    [TKU_PRE_FALCON] = {r_falcon_punct, gpt2_word, r_ascii3},
    [TKU_PRE_QWEN2] = {qwen2_word},
    [TKU_PRE_QWEN35] = {qwen35_word},
    [TKU_PRE_DEEPSEEK_LLM] = {r_newline, r_ds_letters, r_ds_punct, r_trailing_ws, r_ds_cjk, r_digits},
    [TKU_PRE_DEEPSEEK_CODER] = {r_newline, r_ws_letters, r_ws_punct, r_ds_cjk, r_digit},
    [TKU_PRE_DEEPSEEK3] = {r_digits3, r_ds3_cjk, r_ds3_word},
    [TKU_PRE_BLOOM] = {r_bloom},
    [TKU_PRE_VIKING] = {r_bloom, r_digit},
    [TKU_PRE_TEKKEN] = {tekken_word},
    [TKU_PRE_GPT4O] = {gpt4o_word},
    [TKU_PRE_KIMI_K2] = {kimi_word},
    [TKU_PRE_GEMMA4] = {newline_runs},
    [TKU_PRE_SEED_CODER] = {seed_coder_word},
    [TKU_PRE_UFAKZEKA] = {ufakzeka_word},
    [TKU_PRE_LAGUNA] = {newline_runs, qwen2_word},
    [TKU_PRE_MINICPM5] = {r_digits3, minicpm5_word},
};

/* Splits cps[beg, end) with passes[0], each piece with the passes after it. */
static size_t split_rec(const pass_fn *passes, const uint32_t *cps, size_t beg, size_t end, size_t *lens) {
    span s = {cps, end};
    size_t n = 0;
    if (!passes[0]) {
        lens[0] = end - beg;
        return 1;
    }
    for (size_t pos = beg; pos < end;) {
        size_t len = passes[0](&s, pos);
        n += split_rec(passes + 1, cps, pos, pos + len, lens + n);
        pos += len;
    }
    return n;
}

size_t tsr__tku_split(tku_pre pre, const uint32_t *cps, size_t n, size_t *lens) {
    if ((unsigned)pre >= TKU_PRE_COUNT)
        pre = TKU_PRE_DEFAULT;
    return split_rec(pre_passes[pre], cps, 0, n, lens);
}
