"""Does an encoder fine-tuned end to end beat the frozen one? Leave-one-source-out, on real outcomes.

For each held-out source H (default: the chat source and two exam sources), every other source, with every
copy of H's prompts removed (same `prompt_key`), is split per source in a seeded random order into a
*tuning* half (at most `--tune-per-source` rows) and a *ridge* half (at most `--ridge-per-source`, with no
prompt key of the tuning half). Then, with the same protocol as `cascade router eval` (`trainer.fit_router`:
irt-fail centred per source, sources balanced, ridge strength chosen by leave-one-source-out inside, Platt):

- frozen: MiniLM's lower 3 layers over 64 word pieces, fp32 (the shipped embedder before its int8 rounding),
  + structure -> ridge fitted on the ridge half (and, to show what more rows give, on both halves);
- tuned: the same encoder fine-tuned end to end on the tuning half (`training.finetune`), its vectors +
  structure -> ridge on the same ridge half; and the tuning head's own prediction.

All score H; the table gives each one's APGR and AUC on H. What varies between runs with one seed: nothing
by design (one torch thread, seeded order and dropout); the seed changes the split and the training order.
`--mpnet-dir` (an unpacked all-mpnet-base-v2 checkpoint) adds its CPU per text at 64 pieces beside MiniLM's,
and with `--mpnet-quality` its frozen vectors in the frozen row's place.

    nice -n 10 python -m loadtest.studies.finetune_scorer --json finetune.json
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from loadtest.studies.finetune import Encoder, FinetuneConfig, finetune, minilm_dir, tuning_target
from router_models.serving.classifier import feature_matrix
from router_models.training.evaluate import example_metrics
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, Example, load_outcomes
from router_models.training.trainer import TrainConfig, fit_router

FloatArray = npt.NDArray[np.float32]
HELD_OUT = ("rmb-helpfulness", "routellm-gsm8k", "routerbench")


class VectorCache:
    """An encoder's vectors by text, computed once (the frozen encoder serves every fold)."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self._vectors: dict[str, FloatArray] = {}

    def rows(self, texts: Sequence[str]) -> FloatArray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            self._vectors.update(zip(missing, self.encoder.embed(missing), strict=True))
        return np.stack([self._vectors[t] for t in texts]) if texts else np.zeros((0, self.encoder.dim), np.float32)


def split(examples: Sequence[Example], held_out: str, tune_n: int, ridge_n: int,
          seed: int) -> tuple[list[Example], list[Example], list[Example]]:
    """(tuning half, ridge half, held-out rows) for one fold; no held-out key in either half, no tuning key
    in the ridge half. A source short of `tune_n + ridge_n` rows is split in two equal halves."""
    test = [ex for ex in examples if ex.source == held_out]
    keys = {ex.key for ex in test}
    rng = np.random.default_rng(seed)
    tune: list[Example] = []
    ridge: list[Example] = []
    for source in dict.fromkeys(ex.source for ex in examples if ex.source != held_out):
        rows = [ex for ex in examples if ex.source == source and ex.key not in keys]
        rows = [rows[i] for i in rng.permutation(len(rows))]
        cut = min(tune_n, len(rows) * tune_n // max(tune_n + ridge_n, 1))
        tune.extend(rows[:cut])
        ridge.extend(rows[cut:][:ridge_n])
    tuned_keys = {ex.key for ex in tune}
    return tune, [ex for ex in ridge if ex.key not in tuned_keys], test


def routed(vectors: FloatArray, train: Sequence[Example], test_vectors: FloatArray,
           test: Sequence[Example]) -> dict[str, float]:
    """APGR and AUC on `test` of the trainer's ridge + Platt fitted on `train`'s vectors + structure.

    Both read only the ranking, so the test rows are ranked by the router's logit rather than its probability:
    a Platt fit whose Newton steps run away (seen once here: slope 3.7e10) saturates every probability to one
    value and would score as random routing, while the logit keeps the ridge's order."""
    cfg = TrainConfig(target="irt-fail")
    fitted = fit_router(feature_matrix(vectors, [ex.text for ex in train]), train, cfg)
    x = feature_matrix(test_vectors, [ex.text for ex in test]).astype(np.float64)
    return figures(x @ fitted.router.weights.astype(np.float64) + fitted.router.bias, test)


def figures(scores: Any, test: Sequence[Example]) -> dict[str, float]:
    """APGR and AUC of `scores` on `test`, rounded to 4 places."""
    m = example_metrics(scores, test)
    return {"apgr": round(float(m.apgr), 4), "auc": round(float(m.auc), 4)}


def run_fold(args: argparse.Namespace, examples: Sequence[Example], held_out: str,
             frozen: VectorCache) -> dict[str, Any]:
    tune, ridge, test = split(examples, held_out, args.tune_per_source, args.ridge_per_source, args.seed)
    started = time.perf_counter()
    row: dict[str, Any] = {"held_out": held_out, "n": len(test), "tune_rows": len(tune), "ridge_rows": len(ridge)}
    row["frozen"] = routed(frozen.rows([ex.text for ex in ridge]), ridge, frozen.rows([ex.text for ex in test]), test)
    both = tune + ridge
    row["frozen_both_halves"] = routed(frozen.rows([ex.text for ex in both]), both,
                                       frozen.rows([ex.text for ex in test]), test)
    encoder = Encoder(minilm_dir(), args.layers, args.max_tokens)
    y, w = tuning_target(tune)
    cfg = FinetuneConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                         max_steps=args.max_steps)

    def progress(step: int, steps: int, loss: float) -> None:
        if step % 50 == 0 or step == steps:
            print(f"  [{held_out}] step {step}/{steps} loss {loss:.3f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)

    tuning = finetune(encoder, [ex.text for ex in tune], y, w, cfg, progress)
    test_vectors = encoder.embed([ex.text for ex in test])
    row["tuned"] = routed(encoder.embed([ex.text for ex in ridge]), ridge, test_vectors, test)
    row["tuned_head"] = figures(test_vectors @ tuning.head_weights + tuning.head_bias, test)
    row["steps"], row["final_loss"] = len(tuning.losses), round(float(np.mean(tuning.losses[-20:])), 4)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def cpu_per_text(encoder: Encoder, texts: Sequence[str]) -> float:
    """Median CPU milliseconds to embed one text alone (how the serving scorer calls its embedder)."""
    encoder.embed(texts[:3])
    spent = []
    for text in texts:
        start = time.process_time()
        encoder.embed([text])
        spent.append(time.process_time() - start)
    return round(float(np.median(spent)) * 1000, 2)


def speed(args: argparse.Namespace, texts: Sequence[str]) -> dict[str, float]:
    """CPU ms per text at `--max-tokens` pieces, one thread, one text a call: fp32 torch for MiniLM's lower and
    all layers and mpnet's, and ONNX Runtime int8 (the shipped recipe, `onnx_int8_graph`) for the lower layers
    of both and all of mpnet's."""
    minilm, mpnet = minilm_dir(), args.mpnet_dir
    out: dict[str, float] = {}
    for label, folder, layers in (("minilm", minilm, args.layers), ("minilm", minilm, 6), ("mpnet", mpnet, 3),
                                  ("mpnet", mpnet, 12)):
        encoder = Encoder(folder, layers, args.max_tokens)
        out[f"{label} l{layers} fp32 torch"] = cpu_per_text(encoder, texts)
        if layers != 6:
            out[f"{label} l{layers} int8 onnx"] = onnx_cpu_per_text(encoder, texts, args.onnx_dir)
    return out


def onnx_int8_graph(encoder: Encoder, path: Path) -> Path:
    """`encoder` (pooled and normed) exported to ONNX and quantized as `onnx_minilm.ensure_onnx_model` does
    for the shipped graph (int8 MatMul weights per channel, 7-bit, activations at run time). Cached at `path`."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fp32 = path.with_suffix(".fp32.onnx")

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = encoder.model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            pooled: torch.Tensor = encoder.mean_normed(hidden, attention_mask)
            return pooled

    dummy = torch.ones((1, 8), dtype=torch.long)
    axes = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings():  # the legacy exporter's deprecation note; its graph is the shipped kind
        warnings.simplefilter("ignore")
        torch.onnx.export(Pooled().eval(), (dummy, dummy), str(fp32), input_names=["input_ids", "attention_mask"],
                          output_names=["embedding"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes})
    quantize_dynamic(fp32, path, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                     op_types_to_quantize=["MatMul"])
    fp32.unlink()
    return path


def onnx_cpu_per_text(encoder: Encoder, texts: Sequence[str], onnx_dir: Path) -> float:
    """Median CPU ms per text of `encoder`'s int8 ONNX graph on one intra-op thread, tokenizing included."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    graph = onnx_int8_graph(encoder, onnx_dir / f"{encoder.name.replace(':', '_')}.onnx")
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    spent = []
    for text in [*texts[:3], *texts]:
        start = time.process_time()
        enc = encoder.tokenizer([text or " "], truncation=True, max_length=encoder.max_tokens, return_tensors="np")
        session.run(None, {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
        spent.append(time.process_time() - start)
    return round(float(np.median(spent[3:])) * 1000, 2)


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    cols = ("frozen", "frozen_both_halves", "tuned", "tuned_head")
    print(f"\n{'held-out source':<18}{'n':>6}" + "".join(f"{c:>20}" for c in cols) + f"{'tuned - frozen':>16}")
    for r in rows:
        cells = "".join(f"{r[c]['apgr']:>11.3f} ({r[c]['auc']:.3f})" for c in cols)
        print(f"{r['held_out']:<18}{r['n']:>6}{cells}{r['tuned']['apgr'] - r['frozen']['apgr']:>+16.3f}")
    means = "".join(f"{np.mean([r[c]['apgr'] for r in rows]):>20.3f}" for c in cols)
    print(f"{'mean APGR':<24}{means}")
    print("cells: APGR (AUC) on the held-out source; random routing 0.500 (0.500)")


def encoder_arguments(p: argparse.ArgumentParser) -> None:
    """The options both fine-tuning benchmarks take: the data, the encoder, and how it is trained."""
    p.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR, help="real outcomes folder")
    p.add_argument("--max-per-source", type=int, default=None, help="read at most this many rows per source")
    p.add_argument("--layers", type=int, default=3, help="lower encoder layers kept (the shipped embedder: 3)")
    p.add_argument("--max-tokens", type=int, default=64, help="word pieces per text")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-5, help="encoder learning rate (the head's is 2e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    encoder_arguments(p)
    p.add_argument("--held-out", default=",".join(HELD_OUT), help="sources held out, one fold each")
    p.add_argument("--tune-per-source", type=int, default=600, help="fine-tuning rows per training source")
    p.add_argument("--ridge-per-source", type=int, default=600, help="ridge rows per training source")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None, help="stop fine-tuning after this many steps")
    p.add_argument("--mpnet-dir", type=Path, default=None, help="unpacked all-mpnet-base-v2 checkpoint")
    p.add_argument("--mpnet-quality", action="store_true", help="frozen mpnet vectors in the frozen columns")
    p.add_argument("--speed-texts", type=int, default=100, help="texts timed per encoder (with --mpnet-dir)")
    p.add_argument("--onnx-dir", type=Path, default=Path("/tmp/finetune-scorer-onnx"),
                   help="where the timed int8 graphs are exported")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    held = [s for s in args.held_out.split(",") if s]
    examples = load_outcomes(args.routing_dir, max_per_source=args.max_per_source)
    print(f"{len(examples)} prompts; held out in turn: {', '.join(held)}", flush=True)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    if args.mpnet_dir is not None:
        texts = [examples[i].text for i in np.random.default_rng(args.seed).permutation(len(examples))]
        result["cpu_ms_per_text"] = speed(args, texts[: args.speed_texts])
        for label, ms in result["cpu_ms_per_text"].items():
            print(f"  CPU per text, {label}: {ms:.2f} ms", flush=True)
    base = Encoder(args.mpnet_dir, args.layers, args.max_tokens) if args.mpnet_quality and args.mpnet_dir else \
        Encoder(minilm_dir(), args.layers, args.max_tokens)
    result["frozen_encoder"] = base.name
    frozen = VectorCache(base)
    result["folds"] = []
    for source in held:
        result["folds"].append(run_fold(args, examples, source, frozen))
        print(json.dumps(result["folds"][-1]), flush=True)
    if result["folds"]:
        print_table(result["folds"])
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
