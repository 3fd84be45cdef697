"""What the verify_*_unseen.py scripts share: their command line, the loop that runs a variant's checks (a check
that raises is a failure with its reason) and the PASS/FAIL table. Pure Python at import (no torch)."""
import argparse
import json
import os
import subprocess
import time
import traceback


def parse_args(doc, all_variants, problems, print_list, argv=None):
    """(args, variants, binary): binary None when --list printed the variants (then return args.list_status)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0], epilog="See the module docstring for the checks.")
    ap.add_argument("binary", nargs="?", help="the mixtune binary")
    ap.add_argument("work", nargs="?", help="a scratch directory (each variant's files stay there)")
    ap.add_argument("--random", type=int, default=2, help="random variants after the fixed ones (default 2)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random variants (default 1)")
    ap.add_argument("--only", action="append", default=None, help="run this variant only (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the variants and their checks and exit (no torch)")
    a = ap.parse_args(argv)
    if a.random < 0:
        ap.error("--random must be >= 0")
    variants = all_variants(a.random, a.seed)
    if a.only:
        unknown = sorted(set(a.only) - {v["name"] for v in variants})
        if unknown:
            ap.error(f"--only: unknown variant(s) {unknown}; --list names them")
        variants = [v for v in variants if v["name"] in a.only]
    if a.list:
        a.list_status = print_list(variants)
        return a, variants, None
    if not a.binary or not a.work:
        ap.error("give MIXTUNE_BINARY and WORK_DIR (or --list)")
    if not os.access(a.binary, os.X_OK):
        ap.error(f"{a.binary}: not an executable mixtune binary")
    invalid = [(v["name"], problems(v)) for v in variants if problems(v)]
    if invalid:
        ap.error(f"invalid variants: {invalid}")
    return a, variants, os.path.abspath(a.binary)


def build_failure(results, name, e):
    """A variant that Transformers, PEFT or the script cannot build is a failure."""
    traceback.print_exc()
    results.append(dict(variant=name, check="build", ok=False, counted=True, result="FAIL",
                        detail=f"{type(e).__name__}: {e}"[:400]))


def run_checks(results, name, runs, t0, info_checks=()):
    """Each (check, fn) of `runs`: fn() -> (ok, detail). INFO checks are reported, not counted (INFO! when outside
    their bounds)."""
    for check, fn in runs:
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001 -- a check that cannot run is a failure, with its reason
            traceback.print_exc()
            ok, detail = False, f"{type(e).__name__}: {e}"[:400]
        info = check in info_checks
        verdict = ("INFO" if info else "PASS") if ok else ("INFO!" if info else "FAIL")
        results.append(dict(variant=name, check=check, ok=bool(ok), counted=not info, result=verdict, detail=detail))
        print(f"   {verdict} {check}: {detail}", flush=True)
    if results:
        results[-1]["seconds"] = round(time.monotonic() - t0, 1)


def print_table(results):
    """The table; returns (counted checks, failed among them, INFO checks outside their bounds)."""
    width = max(len(r["variant"]) for r in results)
    cw = max(len(r["check"]) for r in results)
    print("\n" + f"{'variant':<{width}}  {'check':<{cw}}  result  detail")
    for r in results:
        print(f"{r['variant']:<{width}}  {r['check']:<{cw}}  {r['result']:<6}  {r['detail']}")
    counted = [r for r in results if r["counted"]]
    return len(counted), sum(not r["ok"] for r in counted), sum(not r["ok"] for r in results if not r["counted"])


# ---- helpers every verifier uses (same_models needs torch at call time: var.torch) ----

def sh(args, cwd=None, timeout=900):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    if r.returncode != 0:
        err = [l for l in r.stderr.strip().splitlines() if l.strip()]
        raise RuntimeError(f"`{' '.join(str(a) for a in args[:2])} ...` exit {r.returncode}: "
                           f"{err[-1] if err else r.stdout.strip()[-300:]}")
    return r.stdout

def yaml_float(x):
    """A float as a YAML float literal that reads back as the same double ("1e-08" -> "1.0e-08")."""
    t = repr(float(x))
    return t.replace("e", ".0e", 1) if "e" in t and "." not in t else t

def write_jsonl(path, ids, labels):
    with open(path, "w") as f:
        for r in range(ids.shape[0]):
            f.write(json.dumps({"input_ids": ids[r].tolist(), "labels": labels[r].tolist()}) + "\n")

def same_models(var, a, b):
    """(identical?, detail): tensor names, every tensor bit for bit, the logits of the score rows."""
    torch = var.torch
    sa, sb = a.state_dict(), b.state_dict()
    if set(sa) != set(sb):
        return False, (f"tensor names differ: only in the source's load {sorted(set(sa) - set(sb))[:4]}, only in "
                       f"the converted one's {sorted(set(sb) - set(sa))[:4]}")
    diff = [n for n in sa if sa[n].dtype != sb[n].dtype or sa[n].shape != sb[n].shape or not torch.equal(sa[n], sb[n])]
    with torch.no_grad():
        la = a(input_ids=var.score_ids, use_cache=False).logits.float()
        lb = b(input_ids=var.score_ids, use_cache=False).logits.float()
    d = float((la - lb).abs().max())
    ok = not diff and d == 0.0
    return ok, (f"{len(sa)} tensors, {len(diff)} differ" + (f" (first {diff[0]})" if diff else "")
                + f"; logits max abs diff {d:.3g} (must be 0)")
