"""The quantization worker: runs inside the quantization venv (`backends.quantization.venv`), never in the gateway's.

It imports only the standard library and the llmcompressor stack (torch, transformers, datasets,
llmcompressor), so it runs as a plain script: ``<quant-venv>/bin/python worker.py JOB.json``.

JOB.json (written by `backends.quantization.quantize`)::

    {"model": DIR, "out": DIR, "scheme": "W8A8" | "W4A16", "ignore": [...],
     "samples": [{"messages": [...]} | {"text": "..."}], "max_seq_length": N, "smoothing_strength": 0.8,
     "seed": 0, "threads": 1}

Repeatable: the same job on the same machine writes the same weights (fixed seeds and thread count, the
samples in the order given, deterministic torch kernels where there is a choice).

An empty ``samples`` list means no calibration (only meaningful for data-free schemes; the caller decides).
Progress goes to stdout as one JSON object per line, ``{"step": i, "of": n, "what": "..."}``; the last line is
``{"done": true, "seconds": s}``. Library chatter goes to stderr, which the caller keeps in a log file.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

_STEPS = 4


def _say(step: int, what: str) -> None:
    print(json.dumps({"step": step, "of": _STEPS, "what": what}), flush=True)


def _texts(tokenizer: Any, samples: list[dict[str, Any]]) -> list[str]:
    """Calibration samples as the model sees them: chats rendered with the model's own template."""
    texts = []
    for sample in samples:
        if "messages" in sample:
            texts.append(tokenizer.apply_chat_template(sample["messages"], tokenize=False))
        else:
            texts.append(str(sample["text"]))
    return texts


def _dataset(tokenizer: Any, samples: list[dict[str, Any]], max_len: int) -> Any:
    from datasets import Dataset

    encoded = tokenizer(_texts(tokenizer, samples), truncation=True, max_length=max_len, add_special_tokens=False)
    return Dataset.from_dict({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def _recipe(job: dict[str, Any]) -> list[Any]:
    from llmcompressor.modifiers.quantization import GPTQModifier
    from llmcompressor.modifiers.smoothquant import SmoothQuantModifier

    ignore = list(job["ignore"])
    gptq = GPTQModifier(targets="Linear", scheme=job["scheme"], ignore=ignore)
    if job["scheme"] == "W8A8" and job["samples"]:
        # SmoothQuant moves activation outliers into the weights before int8 activations clip them.
        return [SmoothQuantModifier(smoothing_strength=float(job.get("smoothing_strength", 0.8))), gptq]
    return [gptq]


def _no_calibration_recipe(job: dict[str, Any]) -> list[Any]:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [QuantizationModifier(targets="Linear", scheme=job["scheme"], ignore=list(job["ignore"]))]


def _keep_ignore_patterns(config_path: Path, patterns: list[str]) -> None:
    """Add the ``re:`` ignore patterns to the saved config as well as the module names they matched.

    llmcompressor writes only the matched module names (``...experts.0.up_proj``); vLLM looks fused MoE
    layers up under its own names (``...experts.0.w1`` for Mixtral), which only a pattern reaches.
    """
    if not patterns:
        return
    config = json.loads(config_path.read_text())
    ignore = config["quantization_config"].setdefault("ignore", [])
    ignore.extend(p for p in patterns if p not in ignore)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _deterministic(seed: int, threads: int) -> None:
    """Make a run repeatable on one machine: fixed seeds, a fixed thread count (a float sum's order follows
    how the work is split between threads), deterministic kernels where torch has a choice."""
    import random

    import numpy
    import torch

    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)


def run(job: dict[str, Any]) -> None:
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    _deterministic(int(job.get("seed", 0)), int(job.get("threads", 1)))
    _say(1, f"loading {job['model']}")
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    samples: list[dict[str, Any]] = job["samples"]
    if samples:
        _say(2, f"calibrating on {len(samples)} samples ({job['scheme']}: SmoothQuant + GPTQ)"
             if job["scheme"] == "W8A8" else f"calibrating on {len(samples)} samples ({job['scheme']}: GPTQ)")
        dataset = _dataset(tokenizer, samples, int(job["max_seq_length"]))
        # in the order given (no shuffle): the Hessians GPTQ accumulates are float sums, so order matters
        oneshot(model=model, dataset=dataset, recipe=_recipe(job), max_seq_length=int(job["max_seq_length"]),
                num_calibration_samples=len(samples), shuffle_calibration_samples=False, batch_size=1)
    else:
        _say(2, f"quantizing without calibration ({job['scheme']}, round-to-nearest)")
        oneshot(model=model, recipe=_no_calibration_recipe(job))
    _say(3, f"saving compressed-tensors checkpoint to {job['out']}")
    model.save_pretrained(job["out"], save_compressed=True)
    tokenizer.save_pretrained(job["out"])
    _keep_ignore_patterns(Path(job["out"]) / "config.json", [p for p in job["ignore"] if p.startswith("re:")])
    _say(4, "saved")
    print(json.dumps({"done": True, "seconds": round(time.monotonic() - started, 2)}), flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: worker.py JOB.json", file=sys.stderr)
        return 2
    run(json.loads(Path(argv[1]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
