"""Training with a result from the frameworks people use.

:func:`autobatch.integrations.hf.apply_to_training_arguments` puts a result into Hugging Face
``TrainingArguments``; :class:`autobatch.integrations.lightning.AutoBatch` is a Lightning callback that
tunes when ``fit`` starts, through the same service as ``autobatch tune``, and trains with the answer.
(The adapters that turn a Hugging Face config or a LightningModule into the step are in
:mod:`autobatch.step`.) Importing this package imports neither transformers nor lightning.
"""
