"""A Hugging Face ``Trainer`` run under the guard (``GuardedTrainer``), a tiny GPT-2 on random token sequences,
checkpointing every 3 steps into ``--out`` and resumed from its last checkpoint (``--resume``:
``trainer.train(resume_from_checkpoint=True)``), as a job on a preemptible cluster runs. Prints one JSON line a
batch: the Trainer's global step, the guard's step and its micro-batch. ``AUTOBATCH_GUARD_FAIL_AT`` lowers the
guard.
"""

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

import autobatch
from autobatch.integrations.hf_trainer import GuardedTrainer

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=8)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--out", default="hf-out")
args = parser.parse_args()

LENGTH, VOCAB, BATCH = 16, 128, 8
generator = torch.Generator().manual_seed(0)
SAMPLES = []
for _ in range(BATCH * 8):
    ids = torch.randint(1, VOCAB, (LENGTH,), generator=generator)
    SAMPLES.append({"input_ids": ids, "attention_mask": torch.ones(LENGTH, dtype=torch.long), "labels": ids})


class Report(TrainerCallback):
    """One line a batch: where the Trainer and the guard stand after it."""

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        done = trainer.guard.last
        print(
            json.dumps(
                {"global_step": state.global_step, "guard_step": done.step, "micro": done.micro_batch_size}
            )
        )


torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=LENGTH)
training = TrainingArguments(
    output_dir=args.out, per_device_train_batch_size=BATCH, max_steps=args.max_steps, save_strategy="steps",
    save_steps=3, learning_rate=1e-3, use_cpu=True, report_to=[], disable_tqdm=True, seed=0, logging_steps=100,
)  # fmt: skip
trainer = GuardedTrainer(
    model=GPT2LMHeadModel(config),
    args=training,
    train_dataset=SAMPLES,
    guard=autobatch.Guard(8, batch_size=BATCH, sizes=[2, 4]),
    callbacks=[Report()],
)
trainer.train(resume_from_checkpoint=args.resume or None)
