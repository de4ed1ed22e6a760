"""What runs inside a forked probe process (imports torch): tracking, instrumenting and simulating a
step, and the ``explain`` / ``estimate`` operations the probe server imports by name."""
