#!/bin/sh
# check-lint.sh - the tree agrees with itself:
#
#  1. Comments cite only files that exist. Read are the comments of
#     libtensr.h, of the sources under libtensr/, cpu/, cuda/, examples/ and
#     tests/ (C, C++, CUDA, Python, shell and awk files), of Makefile.am,
#     man/man.am and configure.ac: /* */ and // in C, # (and m4's dnl)
#     elsewhere, and Python's triple-quoted docstrings; code and string
#     literals are not read. A word that ends in a source or document
#     extension (.c .h .cu .cpp .py .sh .md .awk .json .am .ac .in .map) is a
#     citation. With a folder it must be the path of a file of the tree, or
#     the tail of one (gguf/gguf.h, written inside libtensr/); a bare name
#     must be the name of some file of the tree, in any folder. Not
#     citations: URLs, <system> headers, paths under ~/ or /, and paths that
#     start with a variable other than $(top_srcdir)/ or $(srcdir)/. A
#     document kept outside the repository is not in the tree either: say
#     the rule itself instead of citing it.
#  2. Every AC_SUBST(X) of configure.ac is used: @X@ in a *.in file of the
#     tree (not automake's or autoheader's outputs), or @X@, $(X) or ${X} in
#     Makefile.am or man/man.am.
#
# The tree is `git ls-files` (tracked and untracked, not ignored) when
# $top_srcdir is the top of a git checkout, else (distcheck, an unpacked
# tarball) every file under $top_srcdir but build outputs. Plain POSIX
# tools only (sh, awk, grep, sed, find; git when present); well under a
# second.
set -u
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$srcdir" || exit 99
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tsr-lint.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
rc=0

# Names that are citations but not files of the tree, one per line with why.
# Keep this short: a stale citation belongs fixed, not listed here.
cat > "$tmp/allow" <<'EOF'
llama.cpp        the upstream project's name, not a file
llama-vocab.cpp  llama.cpp's tokenizer source, which examples/model/tokenizer.c mirrors
unicode.cpp      llama.cpp's pre-tokenizer source, which examples/model/tok-unicode.c mirrors
REFS.json        a placeholder in the usage line of tests/test-tokenizer.c
EOF

# ---- the tree -------------------------------------------------------------
top=
if command -v git >/dev/null 2>&1; then
    top=$(git rev-parse --show-toplevel 2>/dev/null) || top=
fi
if [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$(pwd -P)" ]; then
    git ls-files --cached --others --exclude-standard > "$tmp/list" || exit 99
    how="git ls-files"
else
    find . \( -name .git -o -name autom4te.cache -o -name .libs -o -name .deps \
              -o -name __pycache__ -o -name '.venv*' -o -name '_build' \
              -o -name 'libtensr-[0-9]*' \) -prune -o -type f -print |
        sed 's|^\./||' > "$tmp/list"
    how="find"
fi
# files listed but deleted in the working tree do not count
while IFS= read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done < "$tmp/list" | sort > "$tmp/files"
[ -s "$tmp/files" ] || { echo "ERROR: no files found under $srcdir"; exit 99; }

grep -E '^libtensr\.h$|^(libtensr|cpu|cuda|examples|tests)/.*\.(c|h|cu|cpp|py|sh|awk)$|^Makefile\.am$|^man/man\.am$|^configure\.ac$' \
    "$tmp/files" > "$tmp/scan"

# ---- 1. citations in comments ---------------------------------------------
# Prints "file:line: token" for each citation that names no file.
# shellcheck disable=SC2046
awk -v allowf="$tmp/allow" -v filesf="$tmp/files" '
BEGIN {
    while ((getline l < allowf) > 0) { split(l, w, " "); if (w[1] != "") allow[w[1]] = 1 }
    while ((getline l < filesf) > 0) {
        have[l] = 1; b = l; sub(/.*\//, "", b); base[b] = 1
        # every tail of a path ("gguf/gguf.h" of "libtensr/gguf/gguf.h")
        t = l; while ((i = index(t, "/")) > 0) { t = substr(t, i + 1); tail[t] = 1 }
    }
    ext = "\\.(c|h|cu|cpp|cc|hpp|py|sh|md|awk|json|am|ac|in|map)"
    tokre = "[A-Za-z0-9_./][A-Za-z0-9_.+/-]*" ext
}
FNR == 1 {
    inblk = 0; intriple = ""
    kind = FILENAME ~ /\.(c|h|cu|cpp)$/ ? "c" : FILENAME ~ /\.py$/ ? "py" : \
           FILENAME ~ /configure\.ac$/ ? "m4" : "sh"
}
# C: the text of /* */ and // comments on this line, outside string literals.
function c_comments(line,   out, i, n, ch, nx, q) {
    if (!inblk && line !~ /[\/]/) return ""
    out = ""; n = length(line); q = ""
    for (i = 1; i <= n; i++) {
        ch = substr(line, i, 1)
        if (inblk) {
            if (ch == "*" && substr(line, i + 1, 1) == "/") { inblk = 0; i++; out = out " " }
            else out = out ch
            continue
        }
        if (q != "") { if (ch == "\\") i++; else if (ch == q) q = ""; continue }
        nx = substr(line, i + 1, 1)
        if (ch == "/" && nx == "*") { inblk = 1; i++; out = out " "; continue }
        if (ch == "/" && nx == "/") return out " " substr(line, i + 2)
        if (ch == "\"" || ch == "\047") q = ch
    }
    return out
}
# shell, make, m4, Python: from a # (or dnl) at a word start outside quotes.
function hash_comment(line,   i, n, ch, q, prev) {
    if (kind == "m4" && match(line, /(^|[ \t])dnl([ \t]|$)/)) return substr(line, RSTART)
    if (line !~ /#/) return ""
    n = length(line); q = ""; prev = " "
    for (i = 1; i <= n; i++) {
        ch = substr(line, i, 1)
        if (q != "") { if (ch == "\\" && q == "\"") i++; else if (ch == q) q = "" }
        else if (ch == "#" && prev ~ /[ \t;]/) return substr(line, i + 1)
        else if (ch == "\"" || ch == "\047" || (ch == "`" && kind == "sh")) q = ch
        prev = ch
    }
    return ""
}
# Python: # comments, and the text of triple-quoted strings (docstrings).
function py_comments(line,   out, i, n, ch, q) {
    if (intriple == "" && line !~ /[#"\047]/) return ""
    out = ""; n = length(line); q = ""
    for (i = 1; i <= n; i++) {
        ch = substr(line, i, 1)
        if (intriple != "") {
            if (substr(line, i, 3) == intriple) { intriple = ""; i += 2; out = out " " }
            else out = out ch
            continue
        }
        if (q != "") { if (ch == "\\") i++; else if (ch == q) q = ""; continue }
        if (ch == "#") return out " " substr(line, i + 1)
        if (ch == "\"" || ch == "\047") {
            if (substr(line, i, 3) == ch ch ch) { intriple = ch ch ch; i += 2 }
            else q = ch
        }
    }
    return out
}
function check(tok, before,   t) {
    if (before == "$" || before == "~" || before == "@") return
    t = tok
    while (t ~ /^\.\.?\//) sub(/^\.\.?\//, "", t)
    if (t ~ /^\// || t ~ /^\./ || t in allow) return
    if (index(t, "/") ? (t in have || t in tail) : (t in base)) return
    printf "%s:%d: %s\n", FILENAME, FNR, t
}
{
    text = kind == "c" ? c_comments($0) : kind == "py" ? py_comments($0) : hash_comment($0)
    if (text == "") next
    gsub(/[A-Za-z][A-Za-z0-9+.-]*:\/\/[^ \t<>()"\047`]*/, " ", text)   # URLs
    gsub(/<[A-Za-z0-9_\/.+-]+\.h>/, " ", text)                         # <system.h>
    gsub(/\$[({]?(abs_)?(top_)?srcdir[)}]?\//, " ", text)
    while (match(text, tokre)) {
        tok = substr(text, RSTART, RLENGTH)
        before = RSTART > 1 ? substr(text, RSTART - 1, 1) : " "
        after = substr(text, RSTART + RLENGTH, 1)
        text = substr(text, RSTART + RLENGTH)
        if (after ~ /[A-Za-z0-9_]/) continue      # name.cfg, a.hx: not ours
        check(tok, before)
    }
}' $(cat "$tmp/scan") > "$tmp/cites"
if [ -s "$tmp/cites" ]; then
    echo "FAIL: comments cite files that are not in the tree ($how):"
    sed 's/^/    /' "$tmp/cites"
    echo "    (fix the comment: name the file it means now, or say the rule itself)"
    rc=1
fi

# ---- 2. unused AC_SUBSTs ----------------------------------------------------
sed -n '/^[ \t]*dnl/d; s/.*AC_SUBST(\[\{0,1\}\([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' configure.ac | sort -u > "$tmp/substs"
# where a substitution can be used: Makefile.am, man/man.am, and the *.in
# files of the tree that are not automake's or autoheader's outputs
{
    echo Makefile.am
    [ -f man/man.am ] && echo man/man.am
    grep '\.in$' "$tmp/files" | while IFS= read -r f; do
        case $f in config.h.in|*/config.h.in) continue ;; esac
        [ -f "${f%.in}.am" ] || printf '%s\n' "$f"
    done
} > "$tmp/users"
n_subst=0
while IFS= read -r v; do
    n_subst=$((n_subst + 1))
    # shellcheck disable=SC2046
    if ! grep -qF -e "@$v@" -e "\$($v)" -e "\${$v}" $(cat "$tmp/users"); then
        echo "FAIL: configure.ac: AC_SUBST($v), but nothing uses @$v@ or \$($v) ($(tr '\n' ' ' < "$tmp/users"| sed 's/ $//'))"
        rc=1
    fi
done < "$tmp/substs"

echo "$(wc -l < "$tmp/scan") files scanned ($how), $n_subst AC_SUBSTs checked"
[ $rc -eq 0 ] && echo "ok: every cited file exists and every AC_SUBST is used"
exit $rc
