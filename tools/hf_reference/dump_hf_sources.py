#!/usr/bin/env python3
"""Copies the Transformers sources the family fixtures depend on, and what the machine has, into OUTDIR.

Run on the GPU machine (the only place with torch + transformers) next to make_family_fixtures.py, so that the
exact 5.17 code paths can be read afterwards without another device call.
Usage: dump_hf_sources.py OUTDIR
"""
import importlib.util
import json
import os
import shutil
import sys

SOURCES = [
    "models/gpt_oss/configuration_gpt_oss.py", "models/gpt_oss/modeling_gpt_oss.py",
    "models/deepseek_v3/configuration_deepseek_v3.py", "models/deepseek_v3/modeling_deepseek_v3.py",
    "models/nemotron_h/configuration_nemotron_h.py", "models/nemotron_h/modeling_nemotron_h.py",
    "integrations/mxfp4.py", "integrations/finegrained_fp8.py", "integrations/moe.py",
    "quantizers/quantizer_mxfp4.py", "quantizers/quantizer_finegrained_fp8.py",
    "conversion_mapping.py", "core_model_loading.py", "masking_utils.py", "modeling_rope_utils.py",
    "cache_utils.py", "utils/quantization_config.py",
]
OPTIONAL_MODULES = ["kernels", "triton", "triton_kernels", "mamba_ssm", "causal_conv1d", "flash_attn", "accelerate",
                    "peft", "liger_kernel"]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    import torch
    import transformers
    import safetensors
    root = os.path.dirname(transformers.__file__)
    for rel in SOURCES:
        src = os.path.join(root, rel)
        if os.path.exists(src):
            dst = os.path.join(out, "transformers", rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy(src, dst)
        else:
            print("missing source", rel)
    env = dict(torch=torch.__version__, transformers=transformers.__version__, safetensors=safetensors.__version__,
               cuda=torch.cuda.is_available(), python=sys.version)
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        env["capability"] = list(torch.cuda.get_device_capability(0))
    for name in OPTIONAL_MODULES:
        spec = importlib.util.find_spec(name)
        version = None
        if spec is not None:
            try:
                version = getattr(importlib.import_module(name), "__version__", "present")
            except Exception as e:  # a broken optional package is itself a finding
                version = "import failed: " + repr(e)[:200]
        env[name] = version
    with open(os.path.join(out, "environment.json"), "w") as f:
        json.dump(env, f, indent=2)
    print(json.dumps(env, indent=2))


if __name__ == "__main__":
    main()
