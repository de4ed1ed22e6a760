"""A Hugging Face ``Trainer`` run with the runtime guard: a tiny GPT-2 on random token sequences.

``GuardedTrainer`` runs each per-device batch (``--batch``) as micro-batches of ``--micro`` samples and, when
memory runs out, lowers the micro-batch and runs the same batch again; the optimizer still steps once per
batch. Try it on the CPU with an out-of-memory failure injected at batch 2 (the guard's test hook)::

    AUTOBATCH_GUARD_FAIL_AT=2 python examples/guard/hf_trainer.py

``--reference`` trains the same data without the guard, with the Trainer's own accumulation at the
smallest micro-batch; both runs save their parameters to ``OUT/params.pt`` so they can be compared.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from autobatch import Guard
from autobatch.integrations.hf_trainer import GuardedTrainer

parser = argparse.ArgumentParser(description="Hugging Face Trainer with autobatch's guard")
parser.add_argument("--batch", type=int, default=8, help="samples per device per optimizer step")
parser.add_argument("--micro", type=int, default=4, help="the micro-batch the guard starts at")
parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
parser.add_argument(
    "--reference", action="store_true", help="no guard: Trainer accumulation at micro-batch 1"
)
parser.add_argument("--optim", default="adamw_torch", help="the Trainer's optimizer name")
parser.add_argument("--out", default="guard-hf-out", help="output folder")
ARGS = parser.parse_args()

# Data prepared at import: sequences of random lengths, padded; padded labels are -100, so the loss is a
# mean over a different number of tokens in every micro-batch.
LENGTH, VOCAB = 32, 256
generator = torch.Generator().manual_seed(0)
SAMPLES = []
for _ in range(ARGS.batch * ARGS.steps):
    ids = torch.randint(1, VOCAB, (LENGTH,), generator=generator)
    used = int(torch.randint(4, LENGTH + 1, (), generator=generator))
    labels = ids.clone()
    labels[used:] = -100
    mask = (labels != -100).long()
    SAMPLES.append({"input_ids": ids * mask, "attention_mask": mask, "labels": labels})


class Recording(GuardedTrainer):
    """Prints what the guard did with every batch."""

    def training_step(self, model, inputs, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        loss = super().training_step(model, inputs, num_items_in_batch)
        done = self.guard.last
        print(
            f"step {done.step}: {done.samples} samples, micro-batch {done.micro_batch_size}, "
            f"attempts {done.attempts}, loss {float(loss):.4f}",
            flush=True,
        )
        return loss


def main() -> None:
    Path(ARGS.out).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=LENGTH,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    micro, accumulation = (1, ARGS.batch) if ARGS.reference else (ARGS.batch, 1)
    args = TrainingArguments(
        output_dir=ARGS.out, per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
        max_steps=ARGS.steps, optim=ARGS.optim, learning_rate=1e-3, lr_scheduler_type="constant", use_cpu=True,
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
    )  # fmt: skip
    if ARGS.reference:
        from transformers import Trainer

        trainer = Trainer(model=model, args=args, train_dataset=SAMPLES)
    else:
        sizes = [1, 2, ARGS.micro]
        guard = Guard(ARGS.micro, batch_size=ARGS.batch, sizes=sizes, events=Path(ARGS.out) / "events.jsonl")
        trainer = Recording(model=model, args=args, train_dataset=SAMPLES, guard=guard)
    trainer.train()
    if not ARGS.reference:
        summary = trainer.guard.close()
        print(f"guard: {summary.steps} batches, {summary.out_of_memory} out of memory", flush=True)
    torch.save({k: v.detach() for k, v in model.state_dict().items()}, Path(ARGS.out) / "params.pt")


if __name__ == "__main__":
    main()
