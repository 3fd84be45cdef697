"""Markdown table of the kernel benches' sustained rows (`--energy-seconds`): short-run TFLOP/s, sustained
TFLOP/s and picojoules per FLOP for each grouped-GEMM op (and its cuBLASLt dense twin) and flash-attention pass.
Usage: python3 bench/energy_table.py grouped_gemm_energy.json [flash_attention_energy.json]"""
import json
import sys


def rows(path):
    try:
        d = json.load(open(path))
    except (OSError, ValueError) as e:
        yield (f"{path}: unreadable ({e})", None, None, None)
        return
    for r in d.get("gemm_sm90", []):
        yield (r["op"], r.get("tflops"), r.get("sustained_tflops"), r.get("pj_per_flop"))
    for r in d.get("gemm", []):
        yield ("cuBLASLt dense, " + r["op"], r.get("cublaslt_dense_tflops"), r.get("cublaslt_dense_sustained_tflops"),
               r.get("cublaslt_dense_pj_per_flop"))
    for k in ("forward", "backward"):
        if isinstance(d.get(k), dict):
            r = d[k]
            yield (f"flash {k} ({d.get(k + '_kernel')})", r.get("tflops"), r.get("sustained_tflops"),
                   r.get("pj_per_flop"))


def cell(v, f):
    return "–" if v is None else format(v, f)


def main(paths):
    print("| op | TFLOP/s (short) | TFLOP/s (sustained) | pJ per FLOP |")
    print("|---|--:|--:|--:|")
    for p in paths:
        for op, short, sus, pj in rows(p):
            print(f"| {op} | {cell(short, '.1f')} | {cell(sus, '.1f')} | {cell(pj, '.3f')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
