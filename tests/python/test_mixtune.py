"""The Python module against Transformers' fixtures (tests/fixtures/qwen3_moe, made by Transformers 5.17):
loss and logits of a batch, 5 AdamW steps' losses, greedy generation; plus save/load, errors and Ctrl-C.

Run from an install (scripts/check-install.sh): PYTHONPATH=<prefix>/lib/python3/dist-packages
MIXTUNE_SOURCE_DIR=<repository> python3 -m unittest discover -s tests/python
"""
import json
import os
import signal
import struct
import tempfile
import unittest

import numpy as np

import mixtune

SOURCE = os.environ.get("MIXTUNE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(SOURCE, "tests", "fixtures", "qwen3_moe")
CKPT = os.path.join(FIXTURES, "moe_gqa_aux", "ckpt")


def read_safetensors(path, names):
    """The named tensors of a .safetensors file as numpy arrays (the format is an 8-byte length, a JSON header,
    then the raw little-endian data)."""
    dtypes = {"I64": np.int64, "F32": np.float32}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name in names:
        h = header[name]
        begin, end = h["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=dtypes[h["dtype"]]).reshape(h["shape"])
    return out


def write_recipe(directory, max_steps=5):
    path = os.path.join(directory, "recipe.yaml")
    with open(path, "w") as f:
        f.write(f"model: {{path: {CKPT}, dtype: float32}}\n"
                f"data: {{train: {FIXTURES}/train5/train.jsonl, seq_len: 16, pack: true}}\n"
                f"train: {{micro_batch_size: 1, grad_accum: 1, max_steps: {max_steps}, seed: 7, device: cpu}}\n"
                "optimizer: {lr: 1.0e-3, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.01}\n"
                "schedule: {name: constant}\n"
                "clip: {max_grad_norm: 0}\n"
                f"checkpoint: {{dir: {directory}/run}}\n")
    return path


class ModuleTest(unittest.TestCase):
    def test_version(self):
        self.assertRegex(mixtune.__version__, r"^\d+\.\d+\.\d+$")
        self.assertIsInstance(mixtune.has_cuda(), bool)

    def test_inspect_reads_the_config(self):
        info = mixtune.inspect(CKPT)
        with open(os.path.join(CKPT, "config.json")) as f:
            config = json.load(f)
        self.assertEqual(info["architecture"], "Qwen3MoeForCausalLM")
        self.assertEqual(info["layers"], config["num_hidden_layers"])
        self.assertEqual(info["vocab_size"], config["vocab_size"])
        self.assertEqual(info["experts"], config["num_local_experts"])
        self.assertEqual(info["experts_per_token"], config["num_experts_per_tok"])

    def test_score_matches_transformers(self):
        with open(os.path.join(FIXTURES, "moe_gqa_aux", "meta.json")) as f:
            meta = json.load(f)
        batch = read_safetensors(os.path.join(FIXTURES, "moe_gqa_aux", "plain.safetensors"), ["input_ids", "labels"])
        model = mixtune.from_pretrained(CKPT, dtype="float32")
        out = model.score(batch["input_ids"], labels=batch["labels"], logits=True)
        want = meta["batches"]["plain"]["fp32"]
        # The CPU fp32 reference's tolerance against Transformers (docs/numerics.md): loss rel 1e-5.
        for key in ("loss", "ce_loss", "aux_loss"):
            self.assertLessEqual(abs(out[key] - want[key]), 1e-5 * abs(want[key]), key)
        self.assertEqual(out["tokens"], want["tokens"])
        self.assertEqual(out["logits"].dtype, np.float32)
        self.assertEqual(out["logits"].shape, (2, 10, model.info["vocab_size"]))
        # The logits' own cross entropy gives the same loss.
        ids, labels, logits = batch["input_ids"], batch["labels"], out["logits"].astype(np.float64)
        total, count = 0.0, 0
        for b in range(ids.shape[0]):
            for t in range(ids.shape[1] - 1):
                y = labels[b, t + 1]
                if y == -100:
                    continue
                row = logits[b, t]
                total += np.log(np.exp(row - row.max()).sum()) + row.max() - row[y]
                count += 1
        self.assertAlmostEqual(total / count, out["ce_loss"], delta=1e-5 * out["ce_loss"])

    def test_finetune_five_steps_match_transformers(self):
        with open(os.path.join(FIXTURES, "train5", "meta.json")) as f:
            meta = json.load(f)
        with tempfile.TemporaryDirectory() as d:
            seen = []
            # The fixture ran torch.optim.AdamW(model.parameters()): every parameter decays.
            r = mixtune.finetune(write_recipe(d), set={"optimizer.decay_norms_and_biases": True},
                                 on_step=seen.append, quiet=True)
            self.assertEqual(r["steps"], 5)
            self.assertFalse(r["interrupted"])
            with open(r["metrics_path"]) as f:
                records = [json.loads(line) for line in f]
            self.assertEqual(records, seen)  # the callback saw exactly what metrics.jsonl holds
            for got, want in zip(records, meta["steps"]):
                for key in ("loss", "ce_loss", "aux_loss"):
                    self.assertLessEqual(abs(got[key] - want[key]), 1e-4 * abs(want[key]), (got["step"], key))
            self.assertEqual([m["step"] for m in records], [1, 2, 3, 4, 5])
            trained = mixtune.from_pretrained(r["final_dir"])
            self.assertEqual(trained.info["architecture"], "Qwen3MoeForCausalLM")

    def test_greedy_generation_matches_transformers(self):
        with open(os.path.join(FIXTURES, "moe_gqa_aux", "generate.json")) as f:
            golden = json.load(f)
        model = mixtune.from_pretrained(CKPT, dtype="float32")
        for prompt, want in zip(golden["prompts"], golden["outputs"]):
            streamed = []
            out = model.generate(prompt, max_new_tokens=golden["max_new_tokens"], temperature=0,
                                 on_token=streamed.append)
            self.assertEqual(out["ids"], want)
            self.assertEqual(streamed, want)

    def test_save_and_reload_scores_the_same(self):
        model = mixtune.from_pretrained(CKPT)
        ids = [[5, 17, 99, 3, 42, 7, 1, 2]]
        before = model.score(ids)["loss"]
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(os.path.join(d, "copy"))
            again = mixtune.from_pretrained(os.path.join(d, "copy")).score(ids)["loss"]
        self.assertEqual(before, again)  # the same weights through the same code: the same arithmetic

    def test_errors_are_one_line_mixtune_errors(self):
        with self.assertRaises(mixtune.Error) as e:
            mixtune.from_pretrained("/nonexistent/mixtune-model")
        self.assertIn("/nonexistent/mixtune-model", str(e.exception))
        self.assertNotIn("\n", str(e.exception))
        model = mixtune.from_pretrained(CKPT)
        with self.assertRaises(mixtune.Error) as e:
            model.score([[1, 2, 100000]])
        self.assertIn("sequences[0].input_ids[2]", str(e.exception))

    def test_ctrl_c_checkpoints_then_resume_finishes(self):
        with tempfile.TemporaryDirectory() as d:
            recipe = write_recipe(d, max_steps=6)

            def interrupt_at_two(record):
                if record["step"] == 2:
                    signal.raise_signal(signal.SIGINT)  # as Ctrl-C: Python's handler flags it

            with self.assertRaises(KeyboardInterrupt):
                mixtune.finetune(recipe, set={"checkpoint.every_steps": 100}, on_step=interrupt_at_two, quiet=True)
            with open(os.path.join(d, "run", "latest")) as f:  # names the checkpoint the stop wrote
                self.assertEqual(f.read().strip(), "checkpoint-000002")
            with open(os.path.join(d, "run", "metrics.jsonl")) as f:
                self.assertEqual([json.loads(line)["step"] for line in f], [1, 2])
            r = mixtune.finetune(recipe, set={"checkpoint.every_steps": 100}, resume=True, quiet=True)
            self.assertEqual(r["steps"], 6)
            self.assertFalse(r["interrupted"])


if __name__ == "__main__":
    unittest.main()
