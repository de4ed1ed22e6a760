"""The pure core: plain functions over plain values (no torch, no I/O, no environment)."""
