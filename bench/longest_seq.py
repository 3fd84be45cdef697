#!/usr/bin/env python3
"""Longest trainable sequence of one side, found by search to a fixed resolution (default 1,024 tokens).

  python3 bench/longest_seq.py --side mixtune --bin .carry/bin/mixtune [--configs full,selective,none] [-- EXTRA...]
  python3 bench/longest_seq.py --side hf [--configs on,off] [-- EXTRA...]
  python3 bench/longest_seq.py --self-test          # the search against simulated runs (no GPU)
  python3 bench/longest_seq.py --family gpt-oss --layers 5 --side hf    # the gpt-oss-20b slice

--family picks the model on both sides: qwen3-moe (default; mixtune --preset qwen3-30b-a3b, hf_baseline.py
--family qwen3-moe), gpt-oss (mixtune --preset gpt-oss-20b, hf_baseline.py --family gpt-oss), moonlight or
deepseek-v3 (mixtune --preset moonlight-16b-a3b / deepseek-v3; hf_baseline.py's DeepseekV3Config), nemotron-h
(mixtune --preset nemotron-3-nano-30b-a3b; hf_baseline.py's NemotronHConfig).

Each configuration (mixtune: --recompute full | selective | none; Transformers: gradient checkpointing on | off)
is searched on its own: 4 layers (--layers), micro-batch 1, grad-accum 1, --warmup 1 + --steps 1 (two optimizer
steps: the second runs with the optimizer state allocated; Transformers allocates AdamW's state in the first
step). Every try is its own process under a timeout (its process group is killed at the deadline); a try ends
as ok, oom (CUDA out of memory), refused (mixtune's memory plan refuses the length; plain `mixtune bench`, no
--force), timeout or error.

The search. A first length: mixtune's memory plan bound (`mixtune bench --plan-only`'s "largest seq at
micro_batch 1", for this GPU's memory, rounded down to the resolution), else --start (Transformers: 16,384
without checkpointing, 32,768 with; GPT-OSS, whose eager attention keeps [heads, S, S] per layer: 4,096 without,
8,192 with; Moonlight and DeepSeek-V3 under sdpa as Qwen3-MoE; Nemotron-H, whose torch SSD path holds ~8 MiB per
token of fp32 gradients in each Mamba2 layer's backward: 4,096 without, 8,192 with). If the first length fails it is halved until one trains. Then a
prediction (the plan bound, or a linear fit of peak reserved memory over the lengths that trained, against the
GPU's memory less 1.5 GiB) is tried, and from it lengths one resolution step, two, four, ... further in the
direction of its outcome until the edge is crossed; with no prediction the last length that trained is doubled
until one fails. Last, bisection until the longest length that trained and the shortest that failed (oom or
refused) are one resolution step apart: the configuration has converged. A timeout or error stops a
configuration (its longest length is then a lower bound); so does the time budget; reaching --max-seq ends it
as "cap" (a lower bound too).

Time: --budget-s for the whole side (default 270); a configuration may use what is left less --reserve-s
(default 40) for each configuration still to run, and at least an even share of what is left; a try's timeout is --run-timeout-s (default 240) or what is
left, and no try starts with less than --min-try-s (default 20) left. Configurations run in the order given
(by default the one expected to reach furthest first).

Output in --out (default bench/out): TAG-CONFIG-SEQ.json/.log per try and TAG.json, the summary
{"kind": "longest_seq_search", "tool", "configs": [{"label", "args", "longest_seq", "status",
"first_failure", "attempts", "best", ...}], "best_config", "longest_seq", "best", ...} that bench/compare.py
reads. Exit status 0 when every configuration converged (or reached --max-seq), 1 otherwise (2 on a usage
error).

Transformers tries run with PYTORCH_ALLOC_CONF=expandable_segments:True unless --hf-alloc-conf says otherwise
(PyTorch's own advice when a long sequence runs out of memory with memory reserved but unallocated; recorded).
"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

GIB = float(1 << 30)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hf_baseline import FAMILIES, PRESETS  # noqa: E402  (pure-Python part of that file)
# Transformers' first length per family and configuration when there is no plan bound (--start overrides).
HF_START = {"qwen3-moe": {"on": 32768, "off": 16384}, "gpt-oss": {"on": 8192, "off": 4096},
            "moonlight": {"on": 32768, "off": 16384}, "deepseek-v3": {"on": 32768, "off": 16384},
            "nemotron-h": {"on": 8192, "off": 4096}}
MARGIN_BYTES = int(1.5 * (1 << 30))  # CUDA context and what the caching allocator cannot use
FIXED_FLAGS = ("--seq", "--micro-batch", "--grad-accum", "--steps", "--warmup", "--json-out", "--family",
               "--preset")
OOM_RE = re.compile(r"out of memory|outofmemory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|\bOOM\b", re.I)
REFUSED_RE = re.compile(r"does not fit", re.I)
MIXTUNE_CONFIGS = {"full": ["--recompute", "full"], "selective": ["--recompute", "selective"],
                   "none": ["--recompute", "none"]}
HF_CONFIGS = {"on": ["--gradient-checkpointing"], "off": []}
CONFIG_LABELS = {"full": "recompute full", "selective": "recompute selective", "none": "recompute none",
                 "on": "gradient checkpointing on", "off": "gradient checkpointing off"}


def floor_res(x, res):
    return (int(x) // res) * res


# ---------------------------------------------------------------------------------------------------------------
# The search, independent of how a try runs (so that --self-test can drive it with simulated tries).

class Stop(Exception):
    """A configuration's search ends early (budget, timeout, error)."""

    def __init__(self, status, seq=None):
        super().__init__(status)
        self.status, self.seq = status, seq


class Search:
    """State of one configuration's search. try_fn(seq) -> (status, record); status ok | oom | refused |
    timeout | error | budget. predict_fn(search) -> a length or None (already floored to the resolution)."""

    def __init__(self, try_fn, res, start, max_seq, predicted_start=False, predict_fn=None):
        self.try_fn, self.res, self.start, self.max_seq = try_fn, res, start, max_seq
        self.predicted_start, self.predict_fn = predicted_start, predict_fn
        self.lo = self.hi = None          # longest length that trained, shortest that failed (oom/refused)
        self.hi_status = None
        self.tries = []                   # (seq, status, why) in order
        self.ok_records = {}              # seq -> record of the tries that trained

    def probe(self, seq, why):
        seq = int(seq)
        if seq < self.res or seq > self.max_seq:
            raise ValueError(f"probe {seq} outside [{self.res}, {self.max_seq}]")
        if any(s == seq for s, _, _ in self.tries):
            raise AssertionError(f"length {seq} tried twice")
        status, rec = self.try_fn(seq)
        if status == "budget":  # not started: the time left is too short for a try
            raise Stop("budget", seq)
        self.tries.append((seq, status, why))
        if status == "ok":
            self.ok_records[seq] = rec
            if self.lo is None or seq > self.lo:
                self.lo = seq
            if self.hi is not None and seq >= self.hi:
                raise Stop("inconsistent", seq)  # trained above a length that failed: noise in memory use
            return True
        if status in ("oom", "refused"):
            if self.hi is None or seq < self.hi:
                self.hi, self.hi_status = seq, status
            if self.lo is not None and seq <= self.lo:
                raise Stop("inconsistent", seq)
            return False
        raise Stop(status, seq)  # timeout, error, budget

    def converged(self):
        return self.lo is not None and self.hi is not None and self.hi - self.lo <= self.res

    def inside(self, s):
        return (self.lo is None or s > self.lo) and (self.hi is None or s < self.hi) and self.res <= s <= self.max_seq

    def gallop(self, from_seq, ok):
        """From a tried length, step res, 2 res, 4 res, ... in the direction of its outcome until the edge is
        crossed. Where the other side is bounded already, one step (the edge check) and then bisection."""
        g = self.res
        first = True
        while not self.converged():
            s = self.lo + g if ok else self.hi - g
            if not ok and s < self.res:
                s = self.res
            if ok and s > self.max_seq:
                s = self.max_seq
            if not self.inside(s):
                return
            bounded = self.hi is not None if ok else self.lo is not None
            if bounded and not first:
                return
            if self.probe(s, "edge check" if first else "gallop up" if ok else "gallop down") != ok:
                return  # crossed the edge: lo and hi bracket it
            first = False
            g *= 2

    def run(self):
        """Returns the final status: converged | cap | none_fits (or raises Stop)."""
        res = self.res
        s = min(floor_res(self.start, res), self.max_seq)
        if s < res:
            s = res
        ok = self.probe(s, "plan bound" if self.predicted_start else "start")
        if self.predicted_start:
            self.gallop(s, ok)
        while self.lo is None:  # halve until a length trains
            s = floor_res(self.hi // 2, res)
            if s < res:
                return "none_fits"
            self.probe(s, "halve")
        if not self.converged() and not self.predicted_start and self.predict_fn is not None:
            p = self.predict_fn(self)
            if p is not None and self.inside(p):
                self.gallop(p, self.probe(p, "prediction"))
        while self.hi is None:  # no failure yet: double
            if self.lo >= self.max_seq:
                return "cap"
            self.probe(min(2 * self.lo, self.max_seq), "double")
        while not self.converged():
            self.probe(self.lo + floor_res((self.hi - self.lo) // 2, res), "bisect")
        return "converged"


def linear_prediction(points, device_total, static_bytes, res, margin=MARGIN_BYTES):
    """Longest length whose peak reserved memory fits device_total - margin, from (seq, peak_reserved,
    peak_allocated) of the lengths that trained: a line through the two longest, or with one, through it and
    the memory that stays between steps (weights, optimizer state)."""
    if not points or not device_total:
        return None
    pts = sorted(points)
    s1, r1, a1 = pts[-1]
    if len(pts) >= 2:
        s0, r0, _ = pts[-2]
        slope = (r1 - r0) / (s1 - s0) if s1 != s0 else 0
    elif static_bytes:
        slope = (a1 - static_bytes) / s1  # includes the gradients: errs short
    else:
        return None
    if slope <= 0:
        return None
    return floor_res(s1 + (device_total - margin - r1) / slope, res)


# ---------------------------------------------------------------------------------------------------------------
# Real tries.

def device_total_bytes(py):
    """(bytes, source): cudaMemGetInfo's total through torch (what mixtune's memory plan uses), else nvidia-smi."""
    try:
        r = subprocess.run([py, "-c", "import torch; print(torch.cuda.mem_get_info(0)[1])"], capture_output=True,
                           text=True, timeout=45)
        if r.returncode == 0 and r.stdout.strip().isdigit():
            return int(r.stdout.strip()), "torch.cuda.mem_get_info"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0 and r.stdout.strip().split("\n")[0].strip().isdigit():
            return int(r.stdout.strip().split("\n")[0]) << 20, "nvidia-smi memory.total"
    except (OSError, subprocess.SubprocessError):
        pass
    return None, "unknown"


def run_process(cmd, log_path, timeout_s, env=None):
    """Runs cmd in its own process group with output to log_path; (rc, wall_s, timed_out)."""
    t0 = time.monotonic()
    with open(log_path, "w") as logf:
        logf.write("$ " + shlex.join(cmd) + "\n")
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                rc = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rc = proc.wait()
    return rc, time.monotonic() - t0, timed_out


def classify(rc, timed_out, json_path, log_path):
    try:
        rec = json.load(open(json_path))
        if not isinstance(rec, dict):
            rec = {}
    except (OSError, ValueError):
        rec = {}
    try:
        text = open(log_path, errors="replace").read()[-30000:]
    except OSError:
        text = ""
    tps = rec.get("tokens_per_s_per_gpu")
    if rc == 0 and not timed_out and not rec.get("oom") and not rec.get("error") and isinstance(tps, (int, float)) \
            and tps > 0:
        return "ok", rec
    if timed_out or rc in (124, 137):
        return "timeout", rec
    # A record that says whether it ran out of memory is believed (its own JSON, printed into the log, holds the
    # key "oom" and would match the pattern); without one, the log decides.
    if rec.get("oom") if "oom" in rec else OOM_RE.search(text):
        return "oom", rec
    if REFUSED_RE.search(text):
        return "refused", rec
    return "error", rec


def last_line(path):
    try:
        lines = [l.strip() for l in open(path, errors="replace") if l.strip()]
        return lines[-1][:300] if lines else ""
    except OSError:
        return ""


def mixtune_plan_bound(binary, preset, layers, args, device_gib, res, outdir, tag):
    """`mixtune bench --plan-only`'s largest sequence at micro-batch 1 (rounded down to res), or None; args hold
    the configuration's --recompute and the extra flags."""
    cmd = [binary, "bench", "--plan-only", "--preset", preset, "--layers", str(layers), "--seq", "4096",
           "--micro-batch", "1", "--grad-accum", "1"] + args
    if device_gib:
        cmd += ["--device-gib", f"{device_gib:.6f}"]
    log_path = os.path.join(outdir, f"{tag}-plan.log")
    rc, _, _ = run_process(cmd, log_path, 60)
    m = re.search(r"largest seq at micro_batch 1: (\d+)", open(log_path, errors="replace").read())
    if not m:
        print(f"   memory plan gave no bound (rc {rc}; {last_line(log_path)})", flush=True)
        return None, shlex.join(cmd)
    return floor_res(int(m.group(1)), res), shlex.join(cmd)


def extract_layers(extra, default):
    """--layers from EXTRA (removed from it); refuses the flags the search sets itself."""
    out, layers, i = [], default, 0
    while i < len(extra):
        a = extra[i]
        name = a.split("=", 1)[0]
        if name in FIXED_FLAGS:
            raise SystemExit(f"longest_seq: {name} is set by the search; remove it from the extra flags")
        if name == "--layers":
            if "=" in a:
                layers = int(a.split("=", 1)[1])
            else:
                if i + 1 >= len(extra):
                    raise SystemExit("longest_seq: --layers needs a value")
                layers = int(extra[i + 1])
                i += 1
        else:
            out.append(a)
        i += 1
    return out, layers


def take_config_flag(extra, side):
    """(extra without the configuration flag, the configuration it names or None): mixtune --recompute X,
    Transformers --gradient-checkpointing."""
    out, given, i = [], None, 0
    while i < len(extra):
        a = extra[i]
        if side == "hf" and a == "--gradient-checkpointing":
            given = "on"
        elif side == "mixtune" and a.split("=", 1)[0] == "--recompute":
            if "=" in a:
                given = a.split("=", 1)[1]
            elif i + 1 < len(extra):
                given = extra[i + 1]
                i += 1
            else:
                raise SystemExit("longest_seq: --recompute needs a value")
        else:
            out.append(a)
        i += 1
    return out, given


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=("mixtune", "hf"))
    ap.add_argument("--family", choices=FAMILIES, default="qwen3-moe",
                    help="the model on both sides: qwen3-moe (mixtune --preset qwen3-30b-a3b), gpt-oss "
                         "(--preset gpt-oss-20b), moonlight, deepseek-v3 or nemotron-h (--preset "
                         "nemotron-3-nano-30b-a3b)")
    ap.add_argument("--bin", help="the mixtune binary (--side mixtune)")
    ap.add_argument("--configs", default=None,
                    help="comma-separated, in the order to run: mixtune full,selective,none (default); "
                         "hf on,off (default)")
    ap.add_argument("--layers", type=int, default=int(os.environ.get("LAYERS", "4")))
    ap.add_argument("--resolution", type=int, default=1024)
    ap.add_argument("--start", type=int, default=None, help="first length when there is no plan bound")
    ap.add_argument("--max-seq", type=int, default=1 << 20)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", "270")))
    ap.add_argument("--reserve-s", type=float, default=40.0)
    ap.add_argument("--run-timeout-s", type=float, default=float(os.environ.get("RUN_TIMEOUT_S", "240")))
    ap.add_argument("--min-try-s", type=float, default=20.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    ap.add_argument("--tag", default=None)
    ap.add_argument("--python", default=os.environ.get("PYTHON", "python3"))
    ap.add_argument("--hf-alloc-conf", default="expandable_segments:True",
                    help="PYTORCH_ALLOC_CONF for the Transformers tries ('' leaves the environment's)")
    ap.add_argument("--no-plan", action="store_true", help="mixtune: do not start from the memory plan's bound")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()
    if a.side is None:
        ap.error("--side mixtune|hf is required")
    if a.side == "mixtune" and (not a.bin or not os.access(a.bin, os.X_OK)):
        ap.error(f"--side mixtune needs --bin, an executable mixtune binary (found {a.bin!r})")
    res = a.resolution
    if res < 1 or a.max_seq < res or a.warmup < 0 or a.steps < 1 or a.budget_s <= 0:
        ap.error("need --resolution >= 1, --max-seq >= --resolution, --warmup >= 0, --steps >= 1, --budget-s > 0")
    extra, layers = extract_layers(extra, a.layers)
    table = MIXTUNE_CONFIGS if a.side == "mixtune" else HF_CONFIGS
    extra, given = take_config_flag(extra, a.side)
    if given is not None:  # the extra flags name one configuration: search that one only
        if a.configs:
            ap.error("a configuration flag among the extra flags and --configs: give one")
        names = [given]
    else:
        names = (a.configs or ("full,selective,none" if a.side == "mixtune" else "on,off")).split(",")
    bad = [n for n in names if n not in table]
    if bad:
        ap.error(f"unknown configuration(s) {bad}; {a.side}: {', '.join(table)}")
    tool = "mixtune" if a.side == "mixtune" else "transformers"
    preset = PRESETS[a.family]
    tag = a.tag or os.environ.get("TAG") or f"longest-{a.side}"
    os.makedirs(a.out, exist_ok=True)
    outdir = os.path.abspath(a.out)
    t_start = time.monotonic()
    deadline = t_start + a.budget_s

    # mixtune's plan needs the GPU's memory; Transformers' records carry it themselves.
    total, total_src = device_total_bytes(a.python) if a.side == "mixtune" else (None, "each try's record")
    mem = f"{total / GIB:.2f} GiB" if total else "from the tries"
    print(f"== {tool}: longest sequence, {preset}, {layers} layers, configurations {names}, resolution {res}, "
          f"budget {a.budget_s:.0f} s; GPU memory {mem} ({total_src})", flush=True)
    env_hf = dict(os.environ)
    if a.side == "hf" and a.hf_alloc_conf:
        env_hf["PYTORCH_ALLOC_CONF"] = a.hf_alloc_conf
        env_hf.pop("PYTORCH_CUDA_ALLOC_CONF", None)

    results = []
    for ci, name in enumerate(names):
        cfg_args = list(table[name])
        label = CONFIG_LABELS[name]
        left_after = len(names) - ci - 1
        left = deadline - time.monotonic()
        # What is left less a reserve for each later configuration, but at least an even share of it.
        cfg_deadline = time.monotonic() + max(left - a.reserve_s * left_after, left / (left_after + 1))
        c0 = time.monotonic()
        cfg = {"label": label, "name": name, "args": cfg_args + extra, "resolution": res, "attempts": []}
        print(f"== {tool} {label}: until +{cfg_deadline - t_start:.0f} s", flush=True)
        plan_bound = None
        if a.side == "mixtune" and not a.no_plan:
            plan_bound, plan_cmd = mixtune_plan_bound(a.bin, preset, layers, cfg_args + extra,
                                                      total / GIB if total else None, res, outdir, f"{tag}-{name}")
            cfg["plan_bound"] = plan_bound
            cfg["plan_command"] = plan_cmd
            print(f"   memory plan bound (rounded down to {res}): {plan_bound}", flush=True)
        counter = {"n": 0}

        def try_fn(seq, name=name, cfg_args=cfg_args, cfg=cfg, cfg_deadline=cfg_deadline):
            left = cfg_deadline - time.monotonic()
            if left < a.min_try_s:
                return "budget", None
            limit = min(a.run_timeout_s, left)
            json_path = os.path.join(outdir, f"{tag}-{name}-{seq}.json")
            log_path = os.path.join(outdir, f"{tag}-{name}-{seq}.log")
            if os.path.exists(json_path):
                os.remove(json_path)
            common = ["--layers", str(layers), "--seq", str(seq), "--micro-batch", "1", "--grad-accum", "1",
                      "--steps", str(a.steps), "--warmup", str(a.warmup)]
            if a.side == "mixtune":
                cmd = [a.bin, "bench", "--preset", preset] + common + cfg_args + extra
                env = None
            else:
                cmd = [a.python, os.path.join(HERE, "hf_baseline.py"), "--family", a.family] + common \
                    + ["--no-gemm-ceiling"] + cfg_args + extra
                env = env_hf
            cmd += ["--json-out", json_path]
            counter["n"] += 1
            print(f"   try {counter['n']}: seq {seq} (timeout {limit:.0f} s)", end="", flush=True)
            rc, wall, timed_out = run_process(cmd, log_path, limit, env)
            status, rec = classify(rc, timed_out, json_path, log_path)
            att = {"seq": seq, "status": status, "rc": rc, "wall_s": round(wall, 1)}
            for k in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "peak_allocated_bytes", "peak_reserved_bytes",
                      "error"):
                if k in rec:
                    att[k] = rec[k]
            if status not in ("ok", "oom"):
                att["last_line"] = str(rec.get("error") or "")[:300] or last_line(log_path)
            cfg["attempts"].append(att)
            print(f" -> {status} ({wall:.0f} s)" + (f": {att.get('last_line', '')}" if status in ("error",) else ""),
                  flush=True)
            if status == "ok":
                cfg.setdefault("command_template", shlex.join(cmd).replace(f"--seq {seq}", "--seq SEQ").replace(
                    json_path, "OUT.json"))
            return status, rec

        def predict(search):
            if plan_bound and search.inside(plan_bound):
                return plan_bound
            pts, static = [], None
            for s, rec in search.ok_records.items():
                r, al = rec.get("peak_reserved_bytes"), rec.get("peak_allocated_bytes")
                if isinstance(r, (int, float)) and isinstance(al, (int, float)):
                    pts.append((s, r, al))
                mem = rec.get("memory") if isinstance(rec.get("memory"), dict) else {}
                if s == max(search.ok_records):
                    static = mem.get("allocated_after_first_step_bytes")
            dev = total
            for rec in search.ok_records.values():
                mem = rec.get("memory") if isinstance(rec.get("memory"), dict) else {}
                dev = mem.get("device_total_bytes") or dev
            return linear_prediction(pts, dev, static, res)

        if plan_bound:
            start, predicted = plan_bound, True
        else:
            start = a.start or (HF_START[a.family][name] if a.side == "hf" else 32768)
            predicted = False
        search = Search(try_fn, res, start, a.max_seq, predicted_start=predicted, predict_fn=predict)
        try:
            status = search.run()
            stop_seq = None
        except Stop as e:
            status, stop_seq = e.status, e.seq
        cfg["status"] = status
        cfg["longest_seq"] = search.lo
        cfg["first_failure"] = {"seq": search.hi, "status": search.hi_status} if search.hi else None
        if stop_seq is not None:
            cfg["stopped_at"] = stop_seq
        cfg["tries"] = len(search.tries)
        cfg["wall_s"] = round(time.monotonic() - c0, 1)
        for att, (_, _, why) in zip(cfg["attempts"], search.tries):
            att["why"] = why
        best = search.ok_records.get(search.lo) if search.lo else None
        if best:
            cfg["best"] = {k: best[k] for k in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "peak_allocated_bytes",
                                                 "peak_reserved_bytes", "step_time_s", "flops_per_token", "memory",
                                                 "configuration", "baseline", "precision", "recompute", "gpus",
                                                 "pair_expert_wgrad", "router", "tool")
                           if k in best}
            for k in ("commit", "gpu", "transformers_version", "torch_version"):
                if k in best:
                    cfg.setdefault("_meta", {})[k] = best[k]
        print(f"   {label}: longest {search.lo} ({status}"
              + (f", fails at {search.hi} ({search.hi_status})" if search.hi else "")
              + f"; {len(search.tries)} tries, {cfg['wall_s']:.0f} s)", flush=True)
        results.append(cfg)

    summary = summarize(results, tool, layers, res, a, extra, total, total_src, env_hf if a.side == "hf" else None)
    path = os.path.join(outdir, tag + ".json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(f"{tool}: best {summary.get('best_config')}: {summary.get('longest_seq')} tokens "
          f"({time.monotonic() - t_start:.0f} s; summary {path})", flush=True)
    return 0 if all(c["status"] in ("converged", "cap") for c in results) else 1


def summarize(results, tool, layers, res, a, extra, total, total_src, env_hf):
    meta = {}
    for c in results:
        meta.update(c.pop("_meta", {}))
    ok = [c for c in results if c.get("longest_seq")]
    best = max(ok, key=lambda c: (c["longest_seq"], c["status"] == "converged")) if ok else None
    summary = {
        "kind": "longest_seq_search", "tool": tool, "family": a.family, "preset": PRESETS[a.family],
        "layers": layers, "micro_batch": 1, "grad_accum": 1,
        "steps": a.steps, "warmup": a.warmup, "resolution": res, "budget_s": a.budget_s,
        "max_seq": a.max_seq, "extra_args": extra, "device_total_bytes": total, "device_total_source": total_src,
        "configs": results,
        "best_config": best["label"] if best else None,
        "best_status": best["status"] if best else None,
        "longest_seq": best["longest_seq"] if best else None,
        "best": best.get("best") if best else None,
    }
    if env_hf is not None:
        summary["alloc_conf"] = env_hf.get("PYTORCH_ALLOC_CONF") or "default"
    summary.update(meta)
    if not best:
        summary["failed"] = True
        summary["error"] = "no length trained in any configuration (" + ", ".join(
            f"{c['label']}: {c['status']}" for c in results) + ")"
    return summary


# ---------------------------------------------------------------------------------------------------------------

def self_test():
    """The search against simulated sides: every scenario must converge to the true limit, within few tries."""
    res = 1024

    def sim(limit, plan=None, noise=0, fail_kind="oom", bytes_per_token=3 << 20, static=18 << 30,
            total=140 << 30, timeout_above=None):
        def try_fn(seq):
            if timeout_above is not None and seq > timeout_above:
                return "timeout", {}
            if plan is not None and seq > plan:
                return "refused", {}
            if seq > limit:
                return fail_kind, {}
            peak = static + bytes_per_token * seq
            return "ok", {"peak_reserved_bytes": peak + (1 << 30), "peak_allocated_bytes": peak,
                          "memory": {"allocated_after_first_step_bytes": static, "device_total_bytes": total}}
        return try_fn

    def predictor(total):
        def predict(search):
            pts = [(s, r["peak_reserved_bytes"], r["peak_allocated_bytes"]) for s, r in search.ok_records.items()]
            static = search.ok_records[max(search.ok_records)]["memory"]["allocated_after_first_step_bytes"]
            return linear_prediction(pts, total, static, res)
        return predict

    cases = []
    # Transformers-like: limit from the memory model exactly, start 16384.
    true = floor_res(((140 << 30) - MARGIN_BYTES - (18 << 30) - (1 << 30)) / (3 << 20), res)
    cases.append(("hf model exact", Search(sim(true), res, 16384, 1 << 20, False, predictor(140 << 30)), true, 6))
    # The model off by 10% (real use grows faster than the fit).
    cases.append(("hf model 10% off", Search(sim(int(true * 0.9)), res, 16384, 1 << 20, False, predictor(140 << 30)),
                  floor_res(true * 0.9, res), 10))
    # Start fails (an 80 GB GPU).
    cases.append(("hf start fails", Search(sim(20000), res, 32768, 1 << 20, False, None), 19456, 12))
    # mixtune: the plan bound is the limit (refused above).
    cases.append(("mixtune plan exact", Search(sim(10 ** 7, plan=143360), res, 143360, 1 << 20, True, None),
                  143360, 2))
    # mixtune: the run needs more than the plan says (OOM below the plan bound).
    cases.append(("mixtune plan optimistic", Search(sim(130000, plan=143360), res, 143360, 1 << 20, True, None),
                  floor_res(130000, res), 10))
    # A prediction far too long (the gallop down gives way to bisection past the bracket's middle).
    cases.append(("prediction far off", Search(sim(40000), res, 32768, 1 << 20, False, lambda _: 60416), res and 39936,
                  8))
    # No prediction at all: double then bisect.
    cases.append(("double and bisect", Search(sim(50000), res, 16384, 1 << 20, False, None), 49152, 10))
    # Cap.
    cases.append(("cap", Search(sim(10 ** 7), res, 16384, 65536, False, None), 65536, 4))
    failures = 0
    for name, s, want, max_tries in cases:
        status = s.run()
        want_status = "cap" if name == "cap" else "converged"
        good = status == want_status and s.lo == want and len(s.tries) <= max_tries
        failures += not good
        print(f"{'OK  ' if good else 'FAIL'} {name}: {status}, longest {s.lo} (want {want}), fails at {s.hi}, "
              f"{len(s.tries)} tries (at most {max_tries}): {[t[0] for t in s.tries]}")
    # A timeout stops the search with what it had.
    s = Search(sim(100000, timeout_above=40000), res, 16384, 1 << 20, False, None)
    try:
        s.run()
        print("FAIL timeout: no Stop")
        failures += 1
    except Stop as e:
        good = e.status == "timeout" and s.lo == 32768
        failures += not good
        print(f"{'OK  ' if good else 'FAIL'} timeout: stopped ({e.status} at {e.seq}), longest {s.lo}")
    print("self-test:", "passed" if not failures else f"{failures} failure(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
