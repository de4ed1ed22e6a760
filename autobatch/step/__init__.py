"""The training step autobatch owns: optimizer by name, precision, recomputation, and the step loop.

Imported only inside probe processes (it imports torch).
"""
