# cu2cc.awk - a cuda/*.cu kernel file as C++ for the emulator (cuda/emu/tcu_emu.h):
#   NAME<<<CONFIG>>>(ARGS)       -> tcu_emu::launch(CONFIG).go(NAME, "NAME")(ARGS)
#   extern __shared__ T name[];  -> T *const name = (T *)tcu_emu::dynamic_shared();
#   __launch_bounds__(N) ... {   -> ... { tcu_emu::launch_bounds(N);
# and a #line so diagnostics name the .cu file. NAME may carry template
# arguments (k<T><<<...). The .cu files stay as nvcc reads them.
BEGIN { printf "#line 1 \"%s\"\n", src }
{
    line = $0
    if (match(line, /__launch_bounds__\([^)]*\)/)) {
        bound = substr(line, RSTART + 18, RLENGTH - 19)
        line = substr(line, 1, RSTART - 1) substr(line, RSTART + RLENGTH)
        pending = 1
    }
    if (pending && (p = index(line, "{")) > 0) {
        line = substr(line, 1, p) " tcu_emu::launch_bounds(" bound ");" substr(line, p + 1)
        pending = 0
    }
    if (match(line, /extern __shared__ [A-Za-z_0-9 ]+ [A-Za-z_0-9]+\[\];/)) {
        decl = substr(line, RSTART + 18, RLENGTH - 21)
        n = split(decl, w, " ")
        name = w[n]
        type = substr(decl, 1, length(decl) - length(name) - 1)
        line = substr(line, 1, RSTART - 1) type " *const " name " = (" type " *)tcu_emu::dynamic_shared();" \
               substr(line, RSTART + RLENGTH)
    }
    while ((p = index(line, "<<<")) > 0) {
        q = index(line, ">>>(")
        if (q < p) {
            print "cu2cc.awk: " src ":" NR ": a launch without >>>( on its line" > "/dev/stderr"
            exit 1
        }
        s = p - 1 # the kernel name ends here: template arguments, then an identifier
        if (substr(line, s, 1) == ">") {
            depth = 0
            for (; s > 0; s--) {
                c = substr(line, s, 1)
                if (c == ">") depth++
                if (c == "<") depth--
                if (depth == 0) break
            }
            s--
        }
        while (s > 0 && substr(line, s, 1) ~ /[A-Za-z_0-9]/) s--
        kname = substr(line, s + 1, p - s - 1)
        cfg = substr(line, p + 3, q - p - 3)
        line = substr(line, 1, s) "tcu_emu::launch(" cfg ").go(" kname ", \"" kname "\")(" substr(line, q + 4)
    }
    print line
}
