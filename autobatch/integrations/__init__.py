"""Training with a result from the frameworks people use.

:func:`autobatch.integrations.hf.apply_to_training_arguments` puts a result into Hugging Face
``TrainingArguments``; :class:`autobatch.integrations.lightning.AutoBatch` is a Lightning callback that
tunes when ``fit`` starts, through the same service as ``autobatch tune``, and trains with the answer
(under the runtime guard with ``guard=True``; :class:`~autobatch.integrations.lightning.Guarded` with a guard
of your own). :class:`autobatch.integrations.hf_trainer.GuardedTrainer` is a Hugging Face ``Trainer`` under
the guard.
(The adapters that turn a Hugging Face config or a LightningModule into the step are in
:mod:`autobatch.step`.) Importing this package imports neither transformers nor lightning.
"""
