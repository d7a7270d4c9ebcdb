"""Process facts from /proc and psutil: who runs what, in which container, holding which device."""
