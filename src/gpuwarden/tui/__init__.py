"""``gpuwarden top``: a live terminal view of GPUs, processes and daemon jobs. The pure
model (``model``) is importable without textual; ``app`` needs it."""
