"""What the DeepSeek-V3 reference scripts share (verify_deepseek_v3_unseen.py, check_mixtune_checkpoint.py): the
routing decisions Transformers makes, recomputed to measure their margins; what Transformers 5.17's FP8 dequantising
load does with partial blocks; the per-expert loop. Pure Python at import (torch is passed in)."""
import math

EXPERTS = "eager"  # Transformers' per-expert loop, the definition (its bf16 grouped_mm refuses odd strides)
FP8_BLOCK = 128


def eager_experts(model):
    """`model` on the per-expert loop (EXPERTS), whichever backend its construction or load chose."""
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(EXPERTS)
    return model


def fp8_misread(shape, scale_shape):
    """What Transformers 5.17's Fp8Dequantize does with a [R, C] matrix and its [ceil(R/128), ceil(C/128)] scales:
    'ok' (its block rows // scale_rows is the 128 one, or one block spans the dimension), 'misread' (a smaller
    block: the scales land on other rows / columns) or 'raises' (the block does not divide)."""
    verdict = "ok"
    for n, s in zip(shape, scale_shape):
        if n % s:
            return "raises"
        if s > 1 and n // s != FP8_BLOCK:
            verdict = "misread"
    return verdict


def in_memory_name(stored):
    """Transformers' in-memory name of a stored DeepSeek-V3 tensor (per-expert projections stacked)."""
    parts = stored.split(".")
    if "experts" in parts:
        i = parts.index("experts")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            stack = "down_proj" if parts[i + 2] == "down_proj" else "gate_up_proj"
            return ".".join(parts[:i + 1] + [stack])
    return stored


class RouterProbe:
    """DeepSeek-V3's routing decisions on what the model ran, recomputed in float64 from each router's input
    (Transformers: s = sigmoid(x W^T), c = s + e_score_correction_bias, keep the topk_group groups by the sum of
    their two best c, then top-k of c among the kept groups' experts). min_gap: the smallest margin of any group or
    expert choice; bias_flips: tokens whose experts change without the bias; mask_flips: tokens whose experts
    change when the groups left out are filled with 0.0 instead of -inf."""

    def __init__(self, torch, model, config):
        self.torch = torch
        self.k, self.groups, self.keep = config.num_experts_per_tok, config.n_group, config.topk_group
        self.min_gap, self.bias_flips, self.mask_flips, self.tokens = math.inf, 0, 0, 0
        self.handles = [m.register_forward_pre_hook(self.hook) for n, m in model.named_modules()
                        if n.endswith("mlp.gate") and hasattr(m, "e_score_correction_bias")]

    @staticmethod
    def kth_gap(torch, s, k):
        if k >= s.shape[-1]:
            return math.inf
        v = torch.sort(s, dim=-1, descending=True).values
        return float((v[:, k - 1] - v[:, k]).min())

    def select(self, c, fill):
        """(sorted expert indices [T, k], smallest margin) as Transformers chooses on scores c."""
        torch = self.torch
        t, e = c.shape
        per = e // self.groups
        g = c.view(t, self.groups, per).topk(2, dim=-1).values.sum(-1)
        gap = self.kth_gap(torch, g, self.keep)
        keep = torch.zeros_like(g).scatter_(1, g.topk(self.keep, dim=-1).indices, 1.0).bool()
        keep = keep.unsqueeze(-1).expand(t, self.groups, per).reshape(t, e)
        masked = c.masked_fill(~keep, fill)
        if self.k < self.keep * per:
            gap = min(gap, self.kth_gap(torch, c.masked_fill(~keep, -math.inf), self.k))
        return masked.topk(self.k, dim=-1).indices.sort(-1).values, gap

    def hook(self, mod, args):
        torch = self.torch
        w = mod.weight.detach().double()
        s = torch.sigmoid(args[0].detach().double().reshape(-1, w.shape[1]) @ w.t())
        c = s + mod.e_score_correction_bias.detach().double()
        chosen, gap = self.select(c, -math.inf)
        self.min_gap = min(self.min_gap, gap)
        self.bias_flips += int((self.select(s, -math.inf)[0] != chosen).any(-1).sum())
        self.mask_flips += int((self.select(c, 0.0)[0] != chosen).any(-1).sum())
        self.tokens += c.shape[0]

    def remove(self):
        for h in self.handles:
            h.remove()
