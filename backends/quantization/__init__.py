"""Quantization: calibrated low-precision checkpoints (`cascade quantize`) and their measured loss."""
