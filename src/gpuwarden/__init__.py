"""gpuwarden: see, clean and share multi-GPU Linux machines."""

__version__ = "0.1.0"
