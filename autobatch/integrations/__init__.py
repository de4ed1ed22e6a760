"""Adapters from the training code people already have to autobatch's three-function contract.

:mod:`autobatch.integrations.hf` builds a Hugging Face model from its config (``tune --hf``) and
applies a result to ``TrainingArguments``; :mod:`autobatch.integrations.lightning` runs a
LightningModule's ``training_step`` on its own dataloader's batches (``tune --lightning``) and offers
the :class:`~autobatch.integrations.lightning.AutoBatch` callback. Each produces an object with
``build_model``, ``make_batch`` and ``compute_loss``, which :mod:`autobatch.contract` checks like a
script's: the probes never know where the step came from. Importing this package imports neither
transformers nor lightning.
"""
