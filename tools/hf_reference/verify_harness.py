"""What the verify_*_unseen.py scripts share: their command line, the loop that runs a variant's checks (a check
that raises is a failure with its reason) and the PASS/FAIL table. Pure Python at import (no torch)."""
import argparse
import os
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
