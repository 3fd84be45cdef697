#!/usr/bin/env python3
"""Side-by-side table of two benchmark JSON records: `mixtune bench` vs bench/hf_baseline.py (Transformers).

  python3 bench/compare.py A.json B.json [--markdown] [--title NAME] [--command-a CMD] [--command-b CMD]

Either argument may be the mixtune or the Transformers record (the "tool" field decides); ratios are always
mixtune / Transformers (speed ratio > 1: mixtune faster; memory ratio < 1: mixtune smaller). A missing or
unreadable file, a record with "failed", "error" or "oom" is shown as a failed side rather than aborting.
Records made by bench/longest_seq.sh ("kind": "longest_seq") get the longest-sequence table instead.
--markdown prints a block ready to append to bench/RESULTS.md (UTC date, commit, GPU, command lines).
Pure Python, no torch needed.
"""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_baseline import PEAK_989, qwen3_flops_per_token  # noqa: E402  (pure-Python part of that file)

GIB = float(1 << 30)


def load(path):
    """The record at path, or a stub {"failed": True, "error": ...} that says why there is none."""
    if not path:
        return {"failed": True, "error": "not run"}
    try:
        with open(path) as f:
            rec = json.load(f)
    except FileNotFoundError:
        return {"failed": True, "error": f"{path}: no such file (not run?)"}
    except (OSError, ValueError) as e:
        return {"failed": True, "error": f"{path}: unreadable JSON ({e})"}
    if not isinstance(rec, dict):
        return {"failed": True, "error": f"{path}: expected a JSON object, found {type(rec).__name__}"}
    return rec


def status(rec):
    if rec.get("oom"):
        return "OOM"
    if rec.get("failed") or rec.get("error"):
        return "failed"
    if rec.get("kind") == "longest_seq":
        return "ok" if rec.get("longest_seq") else "failed"
    if not isinstance(rec.get("tokens_per_s_per_gpu"), (int, float)) or rec["tokens_per_s_per_gpu"] <= 0:
        return "failed"
    return "ok"


def tool_label(rec):
    t = rec.get("tool")
    if t == "transformers":
        v = rec.get("transformers_version")
        return f"Transformers {v}" if v else "Transformers"
    return t or rec.get("_position") or "?"


def order(a, b):
    """(mixtune, other) so that ratios read mixtune / Transformers; keeps A first if neither is mixtune."""
    if b.get("tool") == "mixtune" and a.get("tool") != "mixtune":
        return b, a, True
    return a, b, False


def num(rec, key):
    v = rec.get(key)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def fmt(v, kind):
    if v is None:
        return "–"
    if kind == "int":
        return f"{v:,.0f}"
    if kind == "f1":
        return f"{v:,.1f}"
    if kind == "f2":
        return f"{v:.2f}"
    if kind == "f3":
        return f"{v:.3f}"
    if kind == "f4":
        return f"{v:.4f}"
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if kind == "gib":
        return f"{v / GIB:.1f}"
    if kind == "g":
        return f"{v / 1e9:.3f}"
    return str(v)


def ratio(x, y):
    if x is None or y is None or y == 0:
        return None
    return x / y


def mfu_989(rec):
    v = num(rec, "mfu_vs_989")
    if v is None and num(rec, "model_tflops_per_gpu") is not None:
        v = rec["model_tflops_per_gpu"] / PEAK_989
    return v


# (label, getter, format, ratio shown?)
ROWS = [
    ("tokens/s per GPU", lambda r: num(r, "tokens_per_s_per_gpu"), "int", True),
    ("step time (s)", lambda r: num(r, "step_time_s"), "f3", True),
    ("model TFLOP/s per GPU", lambda r: num(r, "model_tflops_per_gpu"), "f1", True),
    ("dense GEMM ceiling (TFLOP/s)", lambda r: num(r, "gemm_ceiling_tflops"), "f1", False),
    ("MFU vs measured ceiling", lambda r: num(r, "mfu_vs_ceiling"), "pct", False),
    ("MFU vs 989", mfu_989, "pct", False),
    ("peak allocated (GiB)", lambda r: num(r, "peak_allocated_bytes"), "gib", True),
    ("peak reserved (GiB)", lambda r: num(r, "peak_reserved_bytes"), "gib", True),
    ("GPU energy per step (J)", lambda r: num(r, "energy_j_per_step"), "f1", True),
    ("mean GPU power (W)", lambda r: num(r, "mean_power_w"), "int", True),
    ("energy per model FLOP (pJ)", lambda r: num(r, "energy_pj_per_model_flop"), "f2", True),
    ("GFLOP/token (model)", lambda r: num(r, "flops_per_token"), "g", False),
    ("parameters (B)", lambda r: num(r.get("model") or {}, "params"), "g", False),
    ("loss first → last", None, "loss", False),
]


def loss_text(rec):
    a, b = num(rec, "loss_first"), num(rec, "loss_last")
    if a is None and b is None:
        return "–"
    return f"{fmt(a, 'f4')} → {fmt(b, 'f4')}"


def status_text(rec):
    s = status(rec)
    if s == "ok":
        return "ok"
    err = rec.get("error")
    return f"{s}: {err}" if err else s


def workload(rec):
    m = rec.get("model") or {}
    return {"layers": m.get("layers"), "seq": rec.get("seq"), "micro_batch": rec.get("micro_batch"),
            "grad_accum": rec.get("grad_accum"), "steps": rec.get("steps"), "warmup": rec.get("warmup")}


def workload_text(rec):
    w = workload(rec)
    if all(v is None for v in w.values()):
        return "–"
    extra = [rec.get("precision"), f"recompute {rec.get('recompute')}" if rec.get("recompute") else None,
             f"router {rec.get('router')}" if rec.get("router") else None,
             f"prompt {rec['prompt_fraction']:.0%} unlabelled" if rec.get("prompt_fraction") else None]
    parts = [f"{w['layers']} layers" if w["layers"] is not None else None,
             f"seq {w['seq']}" if w["seq"] is not None else None,
             f"mbs {w['micro_batch']}" if w["micro_batch"] is not None else None,
             f"grad-accum {w['grad_accum']}" if w["grad_accum"] is not None else None,
             f"{w['steps']} timed steps" if w["steps"] is not None else None,
             f"{w['warmup']} warm-up" if w["warmup"] is not None else None]
    return ", ".join(p for p in parts + extra if p)


def consistency_notes(m, h):
    """Differences that make the comparison unfair or the numbers suspicious."""
    notes = []
    if status(m) == "ok" and status(h) == "ok":
        wm, wh = workload(m), workload(h)
        for k in ("layers", "seq", "micro_batch", "grad_accum"):
            if wm[k] != wh[k]:
                notes.append(f"workloads differ: {k} {wm[k]} vs {wh[k]}")
        fm, fh = num(m, "flops_per_token"), num(h, "flops_per_token")
        if fm and fh and abs(fm - fh) > 1e-3 * fh:
            notes.append(f"FLOP/token conventions differ: {fm:.4g} vs {fh:.4g}")
    for rec in (m, h):
        layers, seq = workload(rec)["layers"], rec.get("seq")
        f = num(rec, "flops_per_token")
        if (rec.get("model") or {}).get("preset") == "qwen3-30b-a3b" and f and layers and seq:
            want = qwen3_flops_per_token(layers, seq)
            if abs(f - want) > 1e-3 * want:
                notes.append(f"{tool_label(rec)} reports {f:.4g} FLOP/token; the formula gives {want:.4g} "
                             f"(router excluded)")
    return notes


def bench_rows(m, h):
    rows = [("status", status_text(m), status_text(h), "")]
    if workload_text(m) != workload_text(h):
        rows.append(("workload", workload_text(m), workload_text(h), ""))
    for label, get, kind, show_ratio in ROWS:
        if kind == "loss":
            rows.append((label, loss_text(m), loss_text(h), ""))
            continue
        vm, vh = get(m), get(h)
        r = ratio(vm, vh) if show_ratio and status(m) == "ok" and status(h) == "ok" else None
        rows.append((label, fmt(vm, kind), fmt(vh, kind), f"{r:.2f}×" if r is not None else ""))
    hf = h.get("hf") if isinstance(h.get("hf"), dict) else (m.get("hf") if isinstance(m.get("hf"), dict) else None)
    if hf:
        rows.append(("HF experts / attention", "", f"{hf.get('experts_implementation')} / "
                     f"{hf.get('attn_implementation')}", ""))
    return rows


def phase_rows(rec):
    phases = rec.get("phases_ms")
    if not isinstance(phases, dict) or not phases:
        return []
    vals = {k: v for k, v in phases.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    host = rec.get("host_phases_ms") if isinstance(rec.get("host_phases_ms"), dict) else {}
    total = sum(vals.values())

    def host_ms(v):
        return f"{v:,.1f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"

    rows = [(k, f"{v:,.1f}", f"{100 * v / total:.1f}%" if total > 0 else "–", host_ms(host.get(k)))
            for k, v in vals.items()]
    host_total = sum(v for v in host.values() if isinstance(v, (int, float)) and not isinstance(v, bool))
    rows.append(("sum", f"{total:,.1f}", "100.0%" if total > 0 else "–", host_ms(host_total) if host else "–"))
    st = num(rec, "step_time_s")
    if st:
        rows.append(("step time", f"{1e3 * st:,.1f}", f"sum/step = {total / (1e3 * st):.2f}", ""))
    return rows


def longest_rows(m, h):
    def best(rec, key):
        b = rec.get("best") if isinstance(rec.get("best"), dict) else {}
        return num(b, key)

    def stop(rec):
        s = rec.get("stopped_by")
        if not isinstance(s, dict):
            return "–"
        return f"{s.get('status')} at seq {s.get('seq')}" if s.get("seq") else str(s.get("status"))

    rows = [("status", status_text(m), status_text(h), "")]
    rows.append(("extra flags", " ".join(m.get("extra_args") or []) or "–",
                 " ".join(h.get("extra_args") or []) or "–", ""))
    rows.append(("layers", fmt(m.get("layers"), "int"), fmt(h.get("layers"), "int"), ""))
    lm, lh = num(m, "longest_seq"), num(h, "longest_seq")
    rows.append(("longest seq trained", fmt(lm, "int"), fmt(lh, "int"),
                 f"{lm / lh:.2f}×" if lm and lh else ""))
    rows.append(("stopped by", stop(m), stop(h), ""))
    for label, key, kind, show in (("tokens/s per GPU at that seq", "tokens_per_s_per_gpu", "int", False),
                                   ("model TFLOP/s per GPU at that seq", "model_tflops_per_gpu", "f1", False),
                                   ("peak allocated (GiB) at that seq", "peak_allocated_bytes", "gib", False)):
        rows.append((label, fmt(best(m, key), kind), fmt(best(h, key), kind), ""))
    return rows


def attempt_lines(rec):
    out = []
    for t in rec.get("attempts") or []:
        tps = t.get("tokens_per_s_per_gpu")
        extra = f", {tps:,.0f} tok/s" if isinstance(tps, (int, float)) else ""
        mem = t.get("peak_allocated_bytes")
        extra += f", {mem / GIB:.1f} GiB" if isinstance(mem, (int, float)) else ""
        out.append(f"seq {t.get('seq')}: {t.get('status')}{extra} ({t.get('wall_s', '?')} s)")
    return out


def render_text(rows, head):
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(head, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def md_cell(x):
    return str(x).replace("|", "\\|").replace("\n", " ")


def render_md(rows, head, right=()):
    align = ["--:" if i in right else "---" for i in range(len(head))]
    lines = ["| " + " | ".join(md_cell(h) for h in head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def short_commit(c):
    if isinstance(c, str) and len(c) == 40 and all(ch in "0123456789abcdef" for ch in c.lower()):
        return c[:7]
    return c or "unknown"


def build(a_rec, b_rec, args):
    a_rec.setdefault("_position", "A")  # names a side that has no "tool" (a missing or unreadable file)
    b_rec.setdefault("_position", "B")
    m, h, swapped = order(a_rec, b_rec)
    cmd_a, cmd_b = args.command_a or a_rec.get("command"), args.command_b or b_rec.get("command")
    cmd_m, cmd_h = (cmd_b, cmd_a) if swapped else (cmd_a, cmd_b)
    label_m, label_h = tool_label(m), tool_label(h)
    if label_m == label_h:
        label_m, label_h = "A: " + label_m, "B: " + label_h
    longest = m.get("kind") == "longest_seq" or h.get("kind") == "longest_seq"
    rows = longest_rows(m, h) if longest else bench_rows(m, h)
    head = ["", label_m, label_h, f"{label_m.split()[0]} / {label_h.split()[0]}"]
    notes = [] if longest else consistency_notes(m, h)
    phases = phase_rows(m) if not longest else []
    common = None
    if not longest:
        wm, wh = workload_text(m), workload_text(h)
        common = wm if wm == wh else None
    return dict(m=m, h=h, rows=rows, head=head, notes=notes, phases=phases, longest=longest,
                cmd_m=cmd_m, cmd_h=cmd_h, label_m=label_m, label_h=label_h, common=common)


def text_report(d):
    out = [f"Workload: {d['common']}"] if d["common"] and d["common"] != "–" else []
    out.append(render_text(d["rows"], d["head"]))
    if d["longest"]:
        for rec, label in ((d["m"], d["label_m"]), (d["h"], d["label_h"])):
            lines = attempt_lines(rec)
            if lines:
                out.append(f"\n{label} attempts:\n  " + "\n  ".join(lines))
    if d["phases"]:
        out.append(f"\n{d['label_m']} phases (ms):\n" + render_text(d["phases"], ["phase", "ms", "share", "host ms"]))
    for n in d["notes"]:
        out.append(f"NOTE: {n}")
    return "\n".join(out)


def markdown_report(d, title, now=None):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    m, h = d["m"], d["h"]
    commit = short_commit(m.get("commit") if m.get("commit") not in (None, "unknown") else h.get("commit"))
    gpu = m.get("gpu") if m.get("gpu") not in (None, "unknown") else h.get("gpu")
    what = "longest trainable sequence" if d["longest"] else "side-by-side"
    name = f" `{title}`" if title else ""
    out = [f"## {now:%Y-%m-%d} — {what}{name}: {d['label_m']} vs {d['label_h']} "
           f"(commit {commit}, {gpu or 'unknown GPU'})", ""]
    if d["common"] and d["common"] != "–":
        out += [f"Workload: {d['common']}.", ""]
    versions = [f"{name} {h.get(k)}" for name, k in (("Transformers", "transformers_version"),
                                                     ("torch", "torch_version")) if h.get(k)]
    if versions:
        out += [f"Baseline versions: {', '.join(versions)}.", ""]
    out += ["Commands:", "", "```"]
    out.append(f"{d['label_m']}: {d['cmd_m'] or '(not recorded)'}")
    out.append(f"{d['label_h']}: {d['cmd_h'] or '(not recorded)'}")
    out += ["```", "", render_md(d["rows"], d["head"], right=(1, 2, 3))]
    if d["longest"]:
        for rec, label in ((m, d["label_m"]), (h, d["label_h"])):
            lines = attempt_lines(rec)
            if lines:
                out += ["", f"{label} attempts: " + "; ".join(lines) + "."]
    if d["phases"]:
        out += ["", f"{d['label_m']} phase breakdown (phases_ms):", "",
                render_md(d["phases"], ["phase", "ms", "share", "host ms"], right=(1, 2, 3))]
    if d["notes"]:
        out += [""] + [f"* NOTE: {n}" for n in d["notes"]]
    if not d["longest"]:
        out += ["", "FLOPs per token: 6 × matmul params (q/k/v/o + top-k experts, router excluded) + 6·S·Hq·D "
                    "causal attention per layer + 6·V·H LM head; MFU = model TFLOP/s ÷ the dense bf16 GEMM "
                    "8192³ rate measured in the same process (and ÷ 989)."]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--title", default="")
    ap.add_argument("--command-a", default=None)
    ap.add_argument("--command-b", default=None)
    args = ap.parse_args(argv)
    d = build(load(args.a), load(args.b), args)
    sys.stdout.write(markdown_report(d, args.title) if args.markdown else text_report(d) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
