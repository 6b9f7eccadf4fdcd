"""Reads what benches/realprogs.sh recorded.

compare.py top REPORT.json
    the five functions with the most exclusive CPU time (those never
    instrumented: what their samples took out of their callers'), the five with the
    most self samples in the same recording, and the events lost;
compare.py calls CALLGRIND.OUT F1,F2,... REPORT.json
    each function's calls by proftap and by callgrind (CALLGRIND.OUT a
    directory: the sum of the out files in it, one per process).
compare.py holder REPORT.json FUNCTION
    a caller's exclusive CPU time as recorded, the samples in its own code,
    and what taking only its callees' sample estimate out of what it
    measured would have left it.
"""
import json
import os
import re
import sys


def named(name, module):
    """A function's name, a kernel function's marked `[k] ` before it as
    perf's report marks it (proftap's frames end with `_[k]`, as perf's
    folded stacks do)."""
    if name and module == "[kernel.kallsyms]":
        return f"[k] {name.removesuffix('_[k]')}"
    return name


def top(report):
    p = json.load(open(report))
    metric = "cpu_ns" if "cpu_ns" in p["metrics"] else p["metrics"][0]
    samples = p.get("samples") or {}
    # Exclusive time: measured while instrumented, estimated from the
    # samples after a function was throttled.
    own = {f["name"]: f["exclusive"][metric]["total"] + f["own_cpu_ns_after_throttle"] for f in p["functions"]}
    held = {}
    # Functions never instrumented (a library's): the time their samples
    # took out of their instrumented callers' exclusive time.
    for h in samples.get("held_by_callers", []):
        callee = named(h.get("callee"), h.get("callee_module"))
        if callee and callee not in own:
            held[callee] = held.get(callee, 0) + h["ns"]
    own.update(held)
    for name, ns in sorted(own.items(), key=lambda kv: -kv[1])[:5]:
        print(f"    {ns / 1e6:9.1f} ms  {name}")
    total = max(1, samples.get("total", 0))
    print("  proftap, self samples:")
    for f in sorted(samples.get("functions", []), key=lambda f: -f["self"])[:5]:
        print(f"    {100 * f['self'] / total:8.2f}%  {named(f['name'], f['module'])}")
    print("  lost events:", p["lost"]["events"])


def callgrind_calls(path):
    """Calls by function in a callgrind.out file; a function's recursion
    levels (`f'2`, callgrind's --separate-recs) count as the function."""
    calls, names, current = {}, {}, None
    for line in open(path):
        m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
        if m:
            if m.group(3):
                names[m.group(2)] = re.sub(r"'\d+$", "", m.group(3).strip())
            current = names.get(m.group(2)) if m.group(1) == "cfn" else None
        elif line.startswith("calls=") and current:
            calls[current] = calls.get(current, 0) + int(line.split()[0][6:])
    return calls


def calls(callgrind, functions, report):
    if os.path.isdir(callgrind):
        theirs = {}
        for name in os.listdir(callgrind):
            for function, n in callgrind_calls(os.path.join(callgrind, name)).items():
                theirs[function] = theirs.get(function, 0) + n
    else:
        theirs = callgrind_calls(callgrind)
    p = json.load(open(report))
    ours = {f["name"]: f["calls"] for f in p["functions"]}
    names = functions.split(",")
    equal = 0
    for f in names:
        same = ours.get(f, 0) == theirs.get(f, 0)
        equal += same
        verdict = "equal" if same else "DIFFERENT"
        print(f"    {f:24} proftap {ours.get(f, 0):>10}  callgrind {theirs.get(f, 0):>10}  {verdict}")
    print(f"    {equal} of {len(names)} equal, {p['lost']['events']} events lost")


def holder(report, name):
    p = json.load(open(report))
    samples = p.get("samples") or {}
    period = 1e9 / max(1, samples.get("frequency_hz", 1))
    f = next(f for f in p["functions"] if f["name"] == name)
    recorded = f["exclusive"]["cpu_ns"]["total"]
    held = [h for h in samples.get("held_by_callers", []) if h["name"] == name]
    taken = sum(h["ns"] for h in held)
    estimate = sum(h["samples"] for h in held) * period
    own = sum(k["samples"] for k in samples.get("kept_by_callers", []) if k["name"] == name)
    print(f"{name}: exclusive CPU {recorded / 1e6:.1f} ms, {own} samples of its own, "
          f"{sum(h['samples'] for h in held)} held; the held samples' estimate alone "
          f"would have left {max(0, recorded + taken - estimate) / 1e6:.1f} ms")


if __name__ == "__main__":
    {"top": top, "calls": calls, "holder": holder}[sys.argv[1]](*sys.argv[2:])
