#!/usr/bin/env python3
"""Side-by-side table of benchmark JSON records: `mixtune bench` against one or more bench/hf_baseline.py
(Transformers) baselines.

  python3 bench/compare.py MIXTUNE.json HF.json [HF2.json ...] [--markdown] [--title NAME] [--order TEXT]
                           [--command PATH=CMD ...] [--command-a CMD] [--command-b CMD] [--note TEXT ...]

The mixtune record is the one whose "tool" is mixtune (else the first file); every other file is a Transformers
baseline. Ratios are always mixtune / Transformers (speed ratio > 1: mixtune faster; memory ratio < 1: mixtune
smaller), against the BEST baseline: the one with the most tokens/s per GPU among those that ran; every baseline
is listed with its tokens/s, memory and configuration. A missing or unreadable file, a record with "failed",
"error" or "oom" is shown as a failed side rather than aborting. Records marked "functional_check" (ranks
sharing a GPU, gloo, a reduced vocabulary) are flagged as such: they are not measurements.
Summaries of bench/longest_seq.py ("kind": "longest_seq_search", one per side) get the longest-sequence table:
every configuration's longest trained length and the ratio of the best configurations; the older
"kind": "longest_seq" records of bench/longest_seq.sh before it still read.
--markdown prints a block ready to append to bench/RESULTS.md (UTC date, commit, GPU, run order, each side's
configuration, command lines). --command PATH=CMD gives the command line of the record at PATH (--command-a /
--command-b: of the first / second file). Pure Python, no torch needed.
"""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_baseline import PEAK_989, preset_flops_per_token, preset_layer_pattern  # noqa: E402  (pure-Python part)

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
    if rec.get("kind") in ("longest_seq", "longest_seq_search"):
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
    # mixtune only: its tensors' own peak (the allocator's less block rounding and reused roomier blocks), and its
    # memory plan's total for the run
    ("peak of tensor bytes (GiB)", lambda r: num(r, "peak_tensor_bytes"), "gib", False),
    ("memory plan (GiB)", lambda r: num(r, "memory_plan_bytes"), "gib", False),
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
        return "ok" + (" (functional check)" if rec.get("functional_check") else "")
    err = rec.get("error")
    return f"{s}: {err}" if err else s


def workload(rec):
    m = rec.get("model") or {}
    return {"preset": m.get("preset") or None, "layers": m.get("layers"), "seq": rec.get("seq"),
            "micro_batch": rec.get("micro_batch"), "grad_accum": rec.get("grad_accum"), "steps": rec.get("steps"),
            "warmup": rec.get("warmup")}


def workload_text(rec, with_precision=True):
    w = workload(rec)
    if all(v is None for v in w.values()):
        return "–"
    extra = [rec.get("precision") if with_precision else None,
             f"recompute {rec.get('recompute')}" if rec.get("recompute") and with_precision else None,
             f"router {rec.get('router')}" if rec.get("router") else None,
             f"prompt {rec['prompt_fraction']:.0%} unlabelled" if rec.get("prompt_fraction") else None]
    pattern = preset_layer_pattern(w["preset"], w["layers"])  # Nemotron-H: which kinds of layers the slice holds
    parts = [f"{w['preset']} slice" if w["preset"] else None,
             (f"{w['layers']} layers" + (f" {pattern}" if pattern else "")) if w["layers"] is not None else None,
             f"seq {w['seq']}" if w["seq"] is not None else None,
             f"mbs {w['micro_batch']}" if w["micro_batch"] is not None else None,
             f"grad-accum {w['grad_accum']}" if w["grad_accum"] is not None else None,
             f"{w['steps']} timed steps" if w["steps"] is not None else None,
             f"{w['warmup']} warm-up" if w["warmup"] is not None else None]
    return ", ".join(p for p in parts + extra if p)


def baseline_name(rec):
    """Short name of a Transformers baseline (older records: derived from their fields)."""
    if rec.get("baseline"):
        return rec["baseline"]
    if rec.get("tool") != "transformers":
        return rec.get("_name") or tool_label(rec)
    prec = rec.get("precision") or "?"
    if rec.get("parallel") == "fsdp2":
        prec = f"{prec} [FSDP2]"
    if rec.get("recompute") == "full":
        prec += " [checkpointing]"
    return prec


def mixtune_configuration(rec):
    """Everything that defines the mixtune side, from its record."""
    prec = rec.get("precision")
    parts = []
    lora = rec.get("lora")
    if lora:
        n = lora.get("adapter_parameters")
        opt = rec.get("optimizer_state_bytes")
        moments = (f"AdamW moments {opt / n / 2:.0f} bytes each" if n and opt else "AdamW moments")
        parts.append(f"LoRA r {lora.get('r')}, alpha {lora.get('alpha'):g} on {', '.join(lora.get('targets') or [])}"
                     + (f" ({n / 1e6:.0f} M adapter parameters)" if n else "")
                     + f"; frozen {prec} base (no gradients, moments or master copy for it); adapters fp32 masters with "
                     f"bf16 working copies, {moments}"
                     + (f"; trained in full: {', '.join(lora['full_trained'])}" if lora.get("full_trained") else ""))
        prec = None
    if prec == "fp32-master":
        parts.append("fp32 master weights, fp32 gradients and AdamW moments, bf16 compute")
    elif prec == "bf16":
        parts.append("bf16 parameters; AdamW moments bf16 with stochastic rounding; expert weight gradients bf16, "
                     "the other gradients fp32; no fp32 master weights")
    elif prec:
        parts.append(f"precision {prec}")
    if rec.get("recompute"):
        parts.append(f"activation recompute {rec['recompute']}")
    if "pair_expert_wgrad" in rec:
        parts.append("expert weight gradients of two micro-batches per pass" if rec["pair_expert_wgrad"]
                     else "one expert weight-gradient pass per micro-batch")
    gpus = rec.get("gpus")
    if isinstance(gpus, int) and gpus > 1:
        ep = rec.get("ep")
        par = f"{gpus} GPUs, expert parallel {ep}" + (f" ({rec['ep_dispatch']})" if rec.get("ep_dispatch") else "")
        if rec.get("shard_optimizer"):
            par += ", optimizer state sharded (ZeRO-1)"
        if rec.get("shard_parameters"):
            par += ", parameters sharded (ZeRO-3)"
        if rec.get("gpu_collectives") and rec.get("gpu_collectives") != "nccl":
            par += f", {rec['gpu_collectives']} collectives"
        parts.append(par)
    elif gpus is not None:
        parts.append("one GPU")
    if rec.get("router") and rec.get("router") != "real":
        parts.append(f"router {rec['router']}")
    if rec.get("tool") == "mixtune":
        parts.append("AdamW lr 1e-5, weight decay 0; gradient clipping at norm 1.0 (`mixtune bench`)")
    return "; ".join(parts) if parts else "–"


def hf_configuration(rec):
    c = rec.get("configuration") or (rec.get("hf") or {}).get("configuration")
    if c:
        return c
    # Older records (before the configuration field): what the baseline did then.
    hf = rec.get("hf") or {}
    parts = [{"bf16": "bf16 parameters, gradients and AdamW moments",
              "fp32-autocast": "fp32 parameters under torch.autocast(bf16) (FSDP2: MixedPrecisionPolicy bf16/fp32)"}
             .get(rec.get("precision"), f"precision {rec.get('precision')}")]
    if rec.get("parallel") == "fsdp2":
        parts.append(f"FSDP2 over {rec.get('gpus')} rank(s), gradients reduce-scattered every micro-batch")
    parts.append(f"attention {hf.get('attn_implementation')}, experts {hf.get('experts_implementation')}")
    if hf.get("optimizer"):
        parts.append(hf["optimizer"])
    parts.append("gradient checkpointing" if rec.get("recompute") == "full" else "no gradient checkpointing")
    return "; ".join(parts)


def configuration(rec):
    if status(rec) == "failed" and not rec.get("tool"):
        return "–"
    return mixtune_configuration(rec) if rec.get("tool") == "mixtune" else hf_configuration(rec)


def consistency_notes(m, h):
    """Differences that make the comparison unfair or the numbers suspicious."""
    notes = []
    if status(m) == "ok" and status(h) == "ok":
        wm, wh = workload(m), workload(h)
        for k in ("preset", "layers", "seq", "micro_batch", "grad_accum"):
            if wm[k] != wh[k]:
                notes.append(f"workloads differ: {k} {wm[k]} vs {wh[k]}")
        fm, fh = num(m, "flops_per_token"), num(h, "flops_per_token")
        if fm and fh and abs(fm - fh) > 1e-3 * fh:
            notes.append(f"FLOP/token conventions differ: {fm:.4g} vs {fh:.4g}")
    for rec in (m, h):
        layers, seq = workload(rec)["layers"], rec.get("seq")
        f = num(rec, "flops_per_token")
        want = preset_flops_per_token((rec.get("model") or {}).get("preset"), layers, seq) \
            if f and layers and seq else None
        if want and abs(f - want) > 1e-3 * want:
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
        if isinstance(hf.get("mamba"), dict):  # Nemotron-H: the fused mamba_ssm kernels or the torch SSD path
            rows.append(("HF Mamba2 path", "", str(hf["mamba"].get("path", "?")).split(":")[0], ""))
    return rows


def baseline_rows(m, baselines, best):
    rows = []
    for h in baselines:
        ok = status(h) == "ok" and status(m) == "ok"
        r = ratio(num(m, "tokens_per_s_per_gpu"), num(h, "tokens_per_s_per_gpu")) if ok else None
        rows.append(((("**best** " if h is best else "") + baseline_name(h)), status_text(h),
                     fmt(num(h, "tokens_per_s_per_gpu"), "int"), fmt(num(h, "step_time_s"), "f3"),
                     fmt(num(h, "peak_allocated_bytes"), "gib"), fmt(num(h, "peak_reserved_bytes"), "gib"),
                     f"{r:.2f}×" if r is not None else ""))
    return rows


BASELINE_HEAD = ["baseline", "status", "tokens/s per GPU", "step (s)", "peak alloc (GiB)", "peak reserved (GiB)",
                 "mixtune / it"]


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


# --- longest sequence ------------------------------------------------------------------------------------------

def longest_rows(m, h):
    """The older single-configuration records of bench/longest_seq.sh."""
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


SEARCH_HEAD = ["side", "configuration", "longest trained", "first failure", "search", "tries", "time (s)",
               "tokens/s at longest", "peak alloc (GiB) at longest"]


def search_rows(side_label, rec):
    rows = []
    configs = rec.get("configs") if isinstance(rec.get("configs"), list) else []
    if not configs:
        rows.append((side_label, "–", "–", "–", status_text(rec), "", "", "", ""))
    for c in configs:
        ff = c.get("first_failure") or {}
        best = c.get("best") or {}
        mark = "**" if c.get("label") == rec.get("best_config") else ""
        st = c.get("status")
        if st == "budget" and c.get("stopped_at"):
            st = f"budget (next {c['stopped_at']:,} not tried)"
        elif st not in ("converged",) and c.get("stopped_at"):
            st = f"{st} at {c['stopped_at']:,}"
        rows.append((side_label, f"{mark}{c.get('label')}{mark}", fmt(c.get("longest_seq"), "int"),
                     f"{ff['seq']:,} ({ff.get('status')})" if ff.get("seq") else "–", st,
                     str(c.get("tries", "")), fmt(c.get("wall_s"), "int"),
                     fmt(num(best, "tokens_per_s_per_gpu"), "int"), fmt(num(best, "peak_allocated_bytes"), "gib")))
    return rows


def search_open(rec):
    """Configurations whose search did not converge: the side's best is then a lower bound."""
    return [f"{c.get('label')}: {c.get('status')}" for c in rec.get("configs") or [] if c.get("status") != "converged"]


def search_ratio_text(m, h):
    lm, lh = num(m, "longest_seq"), num(h, "longest_seq")
    if not lm or not lh:
        return "ratio of the best configurations: – (a side has no length that trained)"
    r = lm / lh
    om, oh = search_open(m), search_open(h)
    if not om and not oh:
        qual = ""
    elif om and not oh:
        qual = f" (≥: mixtune's best is a lower bound; not converged: {'; '.join(om)})"
    elif oh and not om:
        qual = f" (≤: Transformers' best is a lower bound; not converged: {'; '.join(oh)})"
    else:
        qual = (f" (neither side's best is exact, not a bound either way; not converged: mixtune {'; '.join(om)}; "
                f"Transformers {'; '.join(oh)})")
    res = m.get("resolution") or h.get("resolution")
    return (f"ratio of the best configurations: mixtune {m.get('best_config')} {lm:,} / Transformers "
            f"{h.get('best_config')} {lh:,} = **{r:.2f}×**{qual}" + (f"; resolution {res:,} tokens" if res else ""))


def search_config_lines(label, rec):
    out = []
    steps = f"{rec.get('warmup')} warm-up + {rec.get('steps')} timed step(s)"
    model = f"{rec['preset']} slice, " if rec.get("preset") else ""
    pattern = preset_layer_pattern(rec.get("preset"), rec.get("layers"))
    head = (f"{label}: {model}{rec.get('layers')} layers{' ' + pattern if pattern else ''}, micro-batch 1, "
            f"grad-accum 1, {steps} per try, each try a "
            f"fresh process; extra flags: {' '.join(rec.get('extra_args') or []) or 'none'}")
    if rec.get("alloc_conf"):
        head += f"; PYTORCH_ALLOC_CONF {rec['alloc_conf']}"
    if rec.get("device_total_bytes"):
        head += f"; GPU memory {rec['device_total_bytes'] / GIB:.1f} GiB ({rec.get('device_total_source')})"
    out.append(head)
    for c in rec.get("configs") or []:
        b = c.get("best") or {}
        conf = b.get("configuration") or (mixtune_configuration(b) if rec.get("tool") == "mixtune" and b else "")
        plan = f"; memory plan bound {c['plan_bound']:,}" if c.get("plan_bound") else ""
        if not conf:
            conf = "flags " + (" ".join(c.get("args") or []) or "none") + " (no length trained)"
        out.append(f"  {c.get('label')}: {conf}{plan}; tries: " + ("; ".join(attempt_lines(c)) or "none"))
    return out


# --- rendering --------------------------------------------------------------------------------------------------

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


def best_of(baselines):
    ok = [h for h in baselines if status(h) == "ok" and num(h, "tokens_per_s_per_gpu")]
    if not ok:
        return None
    real = [h for h in ok if not h.get("functional_check")]
    return max(real or ok, key=lambda h: h["tokens_per_s_per_gpu"])


def build(records, paths, args):
    for i, rec in enumerate(records):
        rec.setdefault("_position", "A" if i == 0 else f"B{i}" if len(records) > 2 else "B")
    commands = {}
    for i, p in enumerate(paths):
        commands[id(records[i])] = records[i].get("command")
    if args.command_a and records:
        commands[id(records[0])] = args.command_a
    if args.command_b and len(records) > 1:
        commands[id(records[1])] = args.command_b
    for spec in args.command or []:
        path, _, cmd = spec.partition("=")
        for i, p in enumerate(paths):
            if os.path.abspath(p) == os.path.abspath(path):
                commands[id(records[i])] = cmd
    mi = next((i for i, r in enumerate(records) if r.get("tool") == "mixtune"), 0)
    m = records[mi]
    baselines = [r for i, r in enumerate(records) if i != mi]
    longest = any(r.get("kind") in ("longest_seq", "longest_seq_search") for r in records)
    search = any(r.get("kind") == "longest_seq_search" for r in records)
    best = best_of(baselines) if not longest else None
    h = best or (baselines[0] if baselines else {"failed": True, "error": "no baseline given", "_position": "B"})
    label_m, label_h = tool_label(m), tool_label(h)
    if label_m == label_h:
        label_m, label_h = "A: " + label_m, "B: " + label_h
    if longest and not search:
        rows, head = longest_rows(m, h), ["", label_m, label_h, f"{label_m.split()[0]} / {label_h.split()[0]}"]
    elif search:
        rows, head = search_rows("mixtune", m) + search_rows(tool_label(h), h), SEARCH_HEAD
    else:
        rows = bench_rows(m, h)
        head = ["", label_m, label_h + (f" (best: {baseline_name(h)})" if len(baselines) > 1 and best else ""),
                f"{label_m.split()[0]} / {label_h.split()[0]}"]
    notes = [] if longest else consistency_notes(m, h)
    if not longest and len(baselines) > 1 and best is None:
        notes.append("no baseline ran: no ratio")
    checks = [r for r in [m] + baselines if r.get("functional_check")]
    common = None
    if not longest:
        wm = workload_text(m, with_precision=False)
        same = all(workload_text(b, with_precision=False) == wm for b in baselines if status(b) == "ok")
        common = wm if same and wm != "–" else None
    return dict(m=m, h=h, baselines=baselines, best=best, rows=rows, head=head, notes=notes,
                phases=phase_rows(m) if not longest else [], longest=longest, search=search,
                commands=commands, label_m=label_m, label_h=label_h, common=common, checks=checks,
                order=args.order, extra_notes=args.note or [])


def config_lines(d):
    if d["search"]:
        return (search_config_lines("mixtune", d["m"]) + search_config_lines(d["label_h"], d["h"]))
    out = [f"{d['label_m']}: {configuration(d['m'])}"]
    for b in d["baselines"]:
        out.append(f"{tool_label(b) if b.get('tool') else 'baseline'} — {baseline_name(b)}: {configuration(b)}")
    return out


def text_report(d):
    out = []
    if d["checks"]:
        out.append("FUNCTIONAL CHECK, NOT A MEASUREMENT: " + ", ".join(
            baseline_name(r) if r.get("tool") != "mixtune" else "mixtune" for r in d["checks"]))
    if d["common"]:
        out.append(f"Workload: {d['common']}")
    if d["order"]:
        out.append(f"Run order: {d['order']}")
    out.append(render_text(d["rows"], d["head"]))
    if d["search"]:
        out.append(search_ratio_text(d["m"], d["h"]))
    if len(d["baselines"]) > 1:
        out.append("\nBaselines (ratio against the best):\n" + render_text(baseline_rows(d["m"], d["baselines"],
                                                                                        d["best"]), BASELINE_HEAD))
    if d["longest"] and not d["search"]:
        for rec, label in ((d["m"], d["label_m"]), (d["h"], d["label_h"])):
            lines = attempt_lines(rec)
            if lines:
                out.append(f"\n{label} attempts:\n  " + "\n  ".join(lines))
    out.append("\nConfigurations:\n  " + "\n  ".join(config_lines(d)))
    if d["phases"]:
        out.append(f"\n{d['label_m']} phases (ms):\n" + render_text(d["phases"], ["phase", "ms", "share", "host ms"]))
    for n in d["notes"] + d["extra_notes"]:
        out.append(f"NOTE: {n}")
    return "\n".join(out)


def markdown_report(d, title, now=None):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    m, h = d["m"], d["h"]
    commit = short_commit(m.get("commit") if m.get("commit") not in (None, "unknown") else h.get("commit"))
    gpu = m.get("gpu") if m.get("gpu") not in (None, "unknown") else h.get("gpu")
    what = "longest trainable sequence" if d["longest"] else "side-by-side"
    name = f" `{title}`" if title else ""
    best = ""
    if len(d["baselines"]) > 1 and d["best"]:
        best = f" (best of {len(d['baselines'])} baselines: {baseline_name(d['best'])})"
    out = [f"## {now:%Y-%m-%d} — {what}{name}: {d['label_m']} vs {d['label_h']}{best} "
           f"(commit {commit}, {gpu or 'unknown GPU'})", ""]
    if d["checks"]:
        out += ["**Functional check, not a measurement** (" + ", ".join(
            baseline_name(r) if r.get("tool") != "mixtune" else "mixtune" for r in d["checks"])
            + ": ranks sharing a GPU, gloo collectives or a reduced vocabulary).", ""]
    if d["common"]:
        out += [f"Workload: {d['common']}.", ""]
    if d["order"]:
        out += [f"Run order: {d['order']}.", ""]
    versions = [f"{n} {h.get(k)}" for n, k in (("Transformers", "transformers_version"), ("torch", "torch_version"))
                if h.get(k)]
    if versions:
        out += [f"Baseline versions: {', '.join(versions)}.", ""]
    out += ["Configurations:", ""] + [("  - " if line.startswith("  ") else "- ") + line.strip()
                                      for line in config_lines(d)] + [""]
    out += ["Commands:", "", "```"]
    if d["search"]:
        for rec, label in ((m, "mixtune"), (h, d["label_h"])):
            for c in rec.get("configs") or []:
                out.append(f"{label} {c.get('label')}: {c.get('command_template') or '(not recorded)'}")
    else:
        out.append(f"{d['label_m']}: {d['commands'].get(id(m)) or '(not recorded)'}")
        for b in d["baselines"]:
            out.append(f"{baseline_name(b)}: {d['commands'].get(id(b)) or '(not recorded)'}")
    out += ["```", ""]
    right = (2, 3, 5, 6, 7, 8) if d["search"] else (1, 2, 3)
    out.append(render_md(d["rows"], d["head"], right=right))
    if d["search"]:
        out += ["", search_ratio_text(m, h)]
    if len(d["baselines"]) > 1:
        out += ["", "Every baseline (the ratio above is against the best):", "",
                render_md(baseline_rows(m, d["baselines"], d["best"]), BASELINE_HEAD, right=(2, 3, 4, 5, 6))]
    if d["longest"] and not d["search"]:
        for rec, label in ((m, d["label_m"]), (h, d["label_h"])):
            lines = attempt_lines(rec)
            if lines:
                out += ["", f"{label} attempts: " + "; ".join(lines) + "."]
    if d["phases"]:
        out += ["", f"{d['label_m']} phase breakdown (phases_ms):", "",
                render_md(d["phases"], ["phase", "ms", "share", "host ms"], right=(1, 2, 3))]
    notes = d["notes"] + d["extra_notes"]
    if notes:
        out += [""] + [f"* NOTE: {n}" for n in notes]
    if not d["longest"]:
        out += ["", flops_note(m, h)]
    return "\n".join(out) + "\n"


MFU_NOTE = "MFU = model TFLOP/s ÷ the dense bf16 GEMM 8192³ rate measured in the same process (and ÷ 989)."
# The FLOP convention of a preset whose layers are not all attention + experts (default: the note's first form).
PRESET_FLOPS_NOTES = {
    "nemotron-3-nano-30b-a3b": (
        "FLOPs per token (Nemotron-H, per layer kind, bench/hf_nemotron_h.py): Mamba2 3 × (2·H·in_proj + "
        "2·d_inner·H + 2·conv_dim·K + the chunked scan at chunk Q: per group 2·Q·N, per head 2·Q·P + 4·P·N); MoE 6 × "
        "(top-k + shared ReLU² experts' up + down params, router excluded); attention 6 × q/k/v/o params + 6·S·Hq·D "
        "causal (no positional encoding); + 6·V·H LM head."),
}


def flops_note(m, h):
    for rec in (m, h):
        note = PRESET_FLOPS_NOTES.get((rec.get("model") or {}).get("preset"))
        if note:
            return f"{note} {MFU_NOTE}"
    return ("FLOPs per token: 6 × matmul params (q/k/v/o + top-k experts, router excluded) + 6·S·Hq·D causal "
            "attention per layer (a sliding-window layer of W keys: 12·P·Hq·D over its P = (2SW − W²)/2S visible "
            f"keys per query) + 6·V·H LM head; {MFU_NOTE}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", help="mixtune record, then one or more Transformers records")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--title", default="")
    ap.add_argument("--order", default="", help="run order, as side_by_side.sh records it")
    ap.add_argument("--command", action="append", help="PATH=CMD: the command line of the record at PATH")
    ap.add_argument("--command-a", default=None)
    ap.add_argument("--command-b", default=None)
    ap.add_argument("--note", action="append", help="a note printed under the table")
    args = ap.parse_args(argv)
    if len(args.records) < 2:
        ap.error("give at least two records (mixtune, then Transformers)")
    records = [load(p) for p in args.records]
    d = build(records, args.records, args)
    sys.stdout.write(markdown_report(d, args.title) if args.markdown else text_report(d) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
