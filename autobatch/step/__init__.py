"""The user's step and its adapters: where the training step comes from and how autobatch runs it.

Where it comes from: a script's path checked (:mod:`~autobatch.step.scriptpath`), a spec naming the
step (:mod:`~autobatch.step.spec`), the user's code imported (:mod:`~autobatch.step.importing`) and
looked up as three functions (:mod:`~autobatch.step.contract`); the adapters that make those functions
from a Hugging Face config (:mod:`~autobatch.step.hf`) or a LightningModule
(:mod:`~autobatch.step.lightning`, :mod:`~autobatch.step.lightning_yaml`). How it runs: the optimizer
by name, precision, recomputation and its levels, distributed wrapping, compilation and the step loop
(imported only inside probe processes: they import torch).
"""
