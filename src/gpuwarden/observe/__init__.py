"""Observation: one immutable Snapshot joining backend facts, and pure functions of it
(leak classification, doctor rules, GPU selection)."""
