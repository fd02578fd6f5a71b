# normalize-decls.awk - joins C text into declarations (split at ';' and at
# preprocessor lines), keeps function declarations (those starting with
# TSR_API when want_api=1, all when 0), and prints each in a canonical form:
# single spaces, none around '*', '(', ')', ',', no TSR_API, ending in ';'.
# names=1 prints the function name only.
function canon(s) {
    gsub(/[ \t\r\n]+/, " ", s)
    gsub(/ *\* */, "*", s); gsub(/ *\( */, "(", s); gsub(/ *\) */, ")", s)
    gsub(/ *, */, ",", s); gsub(/^ +| +$/, "", s)
    return s
}
function emit(d,   name, t) {
    d = canon(d)
    if (want_api && d !~ /^TSR_API /) return
    sub(/^TSR_API /, "", d)
    if (d !~ /\(/ || d ~ /^typedef/ ) return
    t = d; sub(/\(.*/, "", t); name = t; sub(/.*[ *]/, "", name)
    if (name !~ /^tsr_/) return
    print (names ? name : d ";")
}
/^[ \t]*#/ { buf = ""; next }
{
    line = $0
    while ((i = index(line, ";")) > 0) {
        buf = buf " " substr(line, 1, i - 1); emit(buf); buf = ""
        line = substr(line, i + 1)
    }
    buf = buf " " line
    # a '{' or '}' ends whatever came before (struct bodies, extern "C")
    if (buf ~ /[{}]/) { sub(/.*[{}]/, "", buf) }
}
