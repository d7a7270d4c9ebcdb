"""GPU backends: facts about devices and the processes the driver lists, no opinions."""

from gpuwarden.gpus.backend import Backend, open_backend
from gpuwarden.gpus.model import COMPUTE_MODES, GpuFacts, GpuProcessFacts

__all__ = ["COMPUTE_MODES", "Backend", "GpuFacts", "GpuProcessFacts", "open_backend"]
