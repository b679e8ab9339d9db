"""The shipped demo policy with a quantized checkpoint as a third pool: what the quantization tests judge."""

from __future__ import annotations

from pathlib import Path

from tests.servers import ROOT


def with_checkpoint_pool(model: Path, ceiling: str) -> str:
    """`policies/default.yaml` with pool `flagship-int8` serving `model` under `ceiling` (its `max_quant_loss`)."""
    text = (ROOT / "policies" / "default.yaml").read_text()
    return text.replace("routing:", f"""  flagship-int8:
    type: local
    price: {{input_per_mtok: "1.00", output_per_mtok: "5.00"}}
    engine: {{model: "{model}", served_name: flagship-int8, base_port: 8301}}
    max_quant_loss: {ceiling}

routing:""", 1)
