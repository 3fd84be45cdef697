"""mixtune: fine-tune Mixture-of-Experts language models stored in Hugging Face format.

The training loop and every model computation run in mixtune's native library; this package is its Python face:

    import mixtune
    result = mixtune.finetune("recipe.yaml", set={"optimizer.lr": 1e-5}, on_step=lambda m: print(m["loss"]))
    model = mixtune.from_pretrained(result["final_dir"])
    out = model.score([[1, 2, 3, 4]], logits=True)      # {"loss", "ce_loss", "aux_loss", "tokens", "logits"}
    model.save_pretrained("out")

Errors raise mixtune.Error with the one-line message the CLI prints. Ctrl-C during finetune stops it after the
current optimizer step with a checkpoint (continue with resume=True), then raises KeyboardInterrupt.
"""
import json as _json

from . import _mixtune
from ._mixtune import Error

__version__ = _mixtune.version()
__all__ = ["Error", "Model", "from_pretrained", "inspect", "finetune", "has_cuda", "__version__"]


def has_cuda():
    """Whether the library was built with the CUDA backend."""
    return _mixtune.has_cuda()


def _yaml_value(value):
    # JSON is YAML: numbers, booleans, strings and lists keep their type in the recipe.
    return _json.dumps(value)


def finetune(recipe, set=None, resume=False, adapter=None, on_step=None, quiet=False):
    """Fine-tune as the YAML recipe says; returns {"steps", "interrupted", "last_loss", "final_dir",
    "last_checkpoint", "metrics_path"}.

    set: overrides {"section.key": value}, as the CLI's --set. on_step(record) gets each optimizer step's
    metrics.jsonl record as a dict. adapter: continue training this LoRA adapter directory.
    """
    sets = [f"{k}={_yaml_value(v)}" for k, v in (set or {}).items()]
    return _mixtune.finetune(str(recipe), sets, bool(resume), str(adapter or ""), on_step, bool(quiet))


class Model:
    """A Hugging Face checkpoint loaded into mixtune (mixtune.from_pretrained)."""

    def __init__(self, native):
        self._m = native

    @property
    def info(self):
        """What `mixtune inspect --json` reports (architecture, layers, parameter counts, ...), dtype as loaded."""
        d = _json.loads(self._m.info_json())
        d["dtype"] = self._m.info_dtype()
        return d

    def memory_plan(self, micro_batch=1, seq_len=4096, recompute="selective", precision="fp32-master",
                    device_gib=80):
        """The CUDA engine's training memory plan for these settings (bytes; "fits"; "table" as printed)."""
        return self._m.memory_plan(micro_batch, seq_len, recompute, precision, int(device_gib * (1 << 30)))

    def score(self, input_ids, labels=None, logits=False):
        """Loss of sequences (lists of token ids, or a 2-D integer array) as Transformers computes it.

        labels: same shape, -100 = ignored (default: input_ids). logits=True adds a float32 numpy array
        [sequences, length, vocab] (one length) or [tokens, vocab].
        """
        ids = [list(map(int, s)) for s in input_ids]
        labs = None if labels is None else [list(map(int, s)) for s in labels]
        return self._m.score(ids, labs, bool(logits))

    def encode(self, text):
        return self._m.encode(text)

    def decode(self, ids):
        return self._m.decode([int(i) for i in ids])

    def apply_chat_template(self, messages, enable_thinking=True):
        """The prompt the checkpoint's chat template renders for OpenAI-style messages (generation prompt added)."""
        return self._m.apply_chat_template(_json.dumps(messages), enable_thinking)

    def generate(self, prompt, max_new_tokens=128, temperature=None, top_p=None, top_k=None, seed=0,
                 on_token=None):
        """Continue a prompt (text, or a list of token ids); returns {"ids", "text", "stop_reason"}.
        Sampling defaults come from generation_config.json; temperature=0 is greedy."""
        if not isinstance(prompt, str):
            prompt = [int(i) for i in prompt]
        return self._m.generate(prompt, max_new_tokens, temperature, top_p, top_k, seed, on_token)

    def load_adapter(self, path):
        self._m.load_adapter(str(path))

    def merge_adapter(self):
        self._m.merge_adapter()

    @property
    def has_adapter(self):
        return self._m.has_adapter()

    def save_adapter(self, path):
        self._m.save_adapter(str(path))

    def save_pretrained(self, path):
        """Write the model in Transformers' layout (atomically)."""
        self._m.save_pretrained(str(path))


def from_pretrained(path, dtype="auto", adapter=None):
    """Load a checkpoint directory (or Org/Name from the local Hugging Face cache); dtype "auto", "bfloat16" or
    "float32"; adapter: a LoRA adapter directory (PEFT format) attached unmerged."""
    return Model(_mixtune.Model.from_pretrained(str(path), dtype, str(adapter or "")))


def inspect(path):
    """What `mixtune inspect --json` reports, without loading the weights."""
    return _json.loads(_mixtune.Model.inspect_json(str(path)))
