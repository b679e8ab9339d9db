"""What the router reads: sentence embedders (MiniLM in torch, ONNX int8 or static), their disk cache,
structural features."""
