"""What one forward step costs: model, device, parallelism -> milliseconds, bytes."""

from latency.keys import ForwardKey, StepShape

__all__ = ["ForwardKey", "StepShape"]
