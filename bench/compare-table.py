#!/usr/bin/env python3
"""compare-table.py - the table of bench/compare.sh from its raw results.

Usage: compare-table.py RAW MACHINE CPU FLAGS LOAD_BEFORE LOAD_AFTER KERNELS

RAW: one line per run, "llama " + a llama-bench -o jsonl object or
"tensr " + a tensr-bench -o json object; MACHINE: "bw|fma|int8 THREADS
VALUE" lines (bench/bandwidth.c, bench/peak.c). Prints the markdown table:
mean +- sd of each side over its runs, the ratio, and the ceilings.
"""
import json, statistics, sys
raw, machine, cpu, flags, load0, load1, kernels = sys.argv[1:]
mach, embd, peak_isa = {}, {}, "AVX2"
for line in open(machine):
    if line.startswith("isa "):  # the ISA bench/peak measured (compare.sh)
        peak_isa = {"best": "the best of AVX2 and AVX-512 (VNNI for int8)", "avx2": "AVX2"}.get(line.split()[1], line.split()[1])
        continue
    k, t, v = line.split()
    if k == "embd":  # FILE BYTES: the token embedding, not read per token
        embd[t] = int(v)
        continue
    try:
        mach[(k, int(t))] = float(v)
    except ValueError:
        pass
runs, meta = {}, {}
for line in open(raw):
    side, js = line.split(" ", 1)
    try:
        o = json.loads(js)
    except ValueError:
        continue
    if side == "llama":
        key = (o["model_filename"].rsplit("/", 1)[-1], int(o["n_threads"]), int(o["n_prompt"]), int(o["n_gen"]),
               int(o.get("n_depth", 0)))
        meta[key[0]] = (int(o["model_size"]), int(o["model_n_params"]), o.get("model_type", ""))
    else:
        # the threads asked for (libtensr uses at most the cores: -t 4 on 2 cores runs 2)
        key = (o["model"], int(o.get("threads_asked", o["threads"])), int(o["n_prompt"]), int(o["n_gen"]),
               int(o["n_depth"]))
    runs.setdefault(key, {}).setdefault(side, []).append(float(o["avg_ts"]))

def ms(v):
    if not v:
        return None, "-"
    m = statistics.mean(v)
    return m, "%.2f ± %.2f" % (m, statistics.stdev(v) if len(v) > 1 else 0.0)

print("CPU: %s; flags: %s" % (cpu, flags))
print("libtensr kernels: %s. Load before: %s; after: %s" % (kernels, load0.strip(), load1.strip()))
for (k, t), v in sorted(mach.items(), key=lambda x: (x[0][1], x[0][0])):
    unit = {"bw": "GB/s read (best pass)", "fma": "GFLOP/s F32 FMA (%s; per CPU-second x threads)" % peak_isa,
            "int8": "GOP/s int8 dot (%s; per CPU-second x threads)" % peak_isa}[k]
    print("- %d threads: %.1f %s" % (t, v, unit))
print()
print("| model | test | threads | llama.cpp t/s | libtensr t/s | ratio | % of ceiling (llama.cpp / libtensr) |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for key in sorted(runs, key=lambda k: (k[0], k[1], k[4], k[3], k[2])):
    name, t, p, n, d = key
    lm, ls = ms(runs[key].get("llama"))
    tm, ts = ms(runs[key].get("tensr"))
    test = ("pp%d" % p if p else "tg%d" % n) + (" @ d%d" % d if d else "")
    ratio = "%.2f" % (tm / lm) if lm and tm else "-"
    ceil = "-"
    size, params, mtype = meta.get(name, (0, 0, ""))
    if n and not p and size and mach.get(("bw", t)):
        # tokens/s if every weight byte a token needs is read once (all but the token embedding)
        c = mach[("bw", t)] * 1e9 / (size - embd.get(name, 0))
        ceil = "%s / %s of %.0f t/s (bw)" % ("%.0f%%" % (100 * lm / c) if lm else "-",
                                             "%.0f%%" % (100 * tm / c) if tm else "-", c)
    elif p and not n and params:
        kind = "fma" if ("F16" in name or "f16" in mtype.lower() or "F32" in name) else "int8"
        if mach.get((kind, t)):
            c = mach[(kind, t)] * 1e9 / (2.0 * params)
            ceil = "%s / %s of %.0f t/s (%s)" % ("%.0f%%" % (100 * lm / c) if lm else "-",
                                                 "%.0f%%" % (100 * tm / c) if tm else "-", c, kind)
    print("| %s | %s | %d | %s | %s | %s | %s |" % (name, test, t, ls, ts, ratio, ceil))
print()
print("Ceilings: tg = bandwidth / the model's bytes but an untied token embedding's; pp = peak / (2 x parameters); the peak is F32 FMA for F16 models,")
print("int8 dot (%s) for quantized ones." % peak_isa, "Runs alternate tensr-bench and llama-bench, one repetition each in turn.")