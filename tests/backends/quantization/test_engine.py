"""`cascade quantize` for real: llmcompressor (its own venv, created on first use and cached under .cascade/)
quantizes the tiny demo model with calibration; `--evaluate` serves the original and the quantized checkpoint
with real vLLM engines and measures the loss; a policy that demands less loss than measured is refused.

Slow: the first run creates the quantization venv (about 1.5 minutes here); then two engine starts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from backends.machine_checks import checked_here, quant_lines
from backends.models.demo import ensure_demo_models
from backends.quantization.calibration import demo_samples
from backends.quantization.eval import EVAL_PROMPTS, JSON_PROMPTS
from backends.quantization.metadata import METADATA_NAME, read_figures
from gateway.cli.main import main
from policies.loader import PolicyError, parse_policy

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[3]


def _policy(model: Path, ceiling: str) -> str:
    text = (ROOT / "policies" / "default.yaml").read_text()
    return text.replace("routing:", f"""  micro-int8:
    type: local
    price: {{input_per_mtok: "0.10", output_per_mtok: "0.10"}}
    engine: {{model: "{model}", served_name: micro-int8, base_port: 8311}}
    max_quant_loss: {ceiling}

routing:""", 1)


def test_quantize_with_calibration_serve_evaluate_and_enforce_the_ceiling(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = ensure_demo_models()["micro"]
    calibration = tmp_path / "requests.jsonl"
    calibration.write_text("".join(json.dumps({"request": s, "pool": "micro"}) + "\n"
                                   for s in demo_samples(48).samples))
    out = tmp_path / "micro-w8a8"

    code = main(["quantize", "--model", str(original), "--scheme", "W8A8", "--calibration", str(calibration),
                 "--pool", "micro", "--out", str(out), "--evaluate"])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]

    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "int-quantized"
    meta = json.loads((out / METADATA_NAME).read_text())
    assert meta["calibration"]["samples"] == 48 and meta["calibration"]["source"] == str(calibration)
    ev = meta["evaluation"]
    assert ev["prompts"] == len(EVAL_PROMPTS) and ev["positions"] == len(EVAL_PROMPTS) * ev["new_tokens"]
    assert 0.5 <= ev["greedy_agreement"] <= 1.0  # int8 with SmoothQuant + GPTQ keeps most greedy tokens
    assert 0.0 < ev["kl_mean"] < 1.0 and math.isfinite(ev["kl_max"])  # changed, but not much
    assert ev["exact_kl"] is True  # the demo vocabulary is small enough for full distributions
    for share in ("json_valid", "json_valid_original"):
        assert ev[share] * len(JSON_PROMPTS) == pytest.approx(round(ev[share] * len(JSON_PROMPTS)))
    assert ev["tokens_per_s"] > 0 and ev["tokens_per_s_original"] > 0
    figures = read_figures(out)
    assert figures is not None and figures.summary() in printed.out

    tighter = ev["kl_mean"] / 2
    with pytest.raises(PolicyError) as refused:
        checked_here(parse_policy(_policy(out, f"{{max_kl: {tighter}}}"), "strict.yaml"))
    assert f"max_kl {tighter:g} is tighter than the measured KL" in str(refused.value)
    assert "may not serve as a fallback" in str(refused.value)

    loaded = checked_here(parse_policy(_policy(out, f"{{max_kl: {ev['kl_mean'] * 2}}}"), "relaxed.yaml"))
    assert "micro-int8: W8A8: next-token agreement" in quant_lines(loaded.policy)[1]
