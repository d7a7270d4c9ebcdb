"""What the tests share, apart from pytest's fixtures and hooks (``tests/conftest.py``,
which a test module should not import): where things are, the one wait loop, ending a
process, running the CLI, a simulated machine, and builders of plain facts."""
