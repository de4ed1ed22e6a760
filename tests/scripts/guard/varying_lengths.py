"""A text classifier over padded token sequences of random lengths, trained with AdamW in its own loop.

Most batches are short; one (``--long-step``, 0-based) holds the longest sequences. ``--guard`` runs each
batch through ``autobatch.Guard``; without it the loop accumulates micro-batches of ``--micro-batch`` itself
(each loss weighted by its share of the samples). Under DDP or FSDP2 (torchrun's environment, ``--ddp``, ``--fsdp``) each rank
takes its own slice of every batch. Writes the parameters to ``--out`` and one line per optimizer step to
``--step-log``.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--batch-size", type=int, default=16, help="per-rank batch")
parser.add_argument("--micro-batch", type=int, default=8)
parser.add_argument("--sizes", default="", help="the tuned sizes that fitted, comma-separated")
parser.add_argument("--long-step", type=int, default=149)
parser.add_argument("--long-length", type=int, default=384)
parser.add_argument(
    "--long-rank", type=int, default=-1, help="under --ddp or --fsdp: only this rank gets the long batch"
)
parser.add_argument("--guard", action="store_true")
parser.add_argument("--grow-after", type=int, default=10)
parser.add_argument("--events", default=None)
parser.add_argument("--ddp", action="store_true")
parser.add_argument("--fsdp", action="store_true", help="shard with FSDP2 (fully_shard) instead of DDP")
parser.add_argument("--out", default="params.pt")
parser.add_argument("--step-log", default="steps.jsonl")
args = parser.parse_args()

torch.use_deterministic_algorithms(True)
torch.set_default_dtype(torch.float64)  # the comparison with another split holds to 1e-5 only in float64
VOCAB, PAD, CLASSES = 500, 0, 4

rank, world = 0, 1
RANKS = args.ddp or args.fsdp
if RANKS:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

# The data, prepared at import: every rank draws the same global data and takes its slice of each batch.
generator = torch.Generator().manual_seed(0)
GLOBAL = args.batch_size * world
lengths = torch.randint(4, 24, (args.steps * GLOBAL,), generator=generator)
for slot in range(GLOBAL):
    owner = slot // args.batch_size
    if args.long_rank < 0 or owner == args.long_rank:
        lengths[args.long_step * GLOBAL + slot] = args.long_length
tokens = [torch.randint(1, VOCAB, (int(n),), generator=generator) for n in lengths]
labels = torch.randint(0, CLASSES, (len(tokens),), generator=generator)


class Texts(Dataset):
    def __len__(self):
        return args.steps * args.batch_size

    def __getitem__(self, index):
        step, slot = divmod(index, args.batch_size)
        where = step * GLOBAL + rank * args.batch_size + slot
        return tokens[where], labels[where]


def collate(samples):
    longest = max(len(t) for t, _ in samples)
    ids = torch.full((len(samples), longest), PAD, dtype=torch.long)
    for row, (t, _) in enumerate(samples):
        ids[row, : len(t)] = t
    return ids, torch.stack([y for _, y in samples])


class Classifier(nn.Module):
    def __init__(self, width=32, heads=2, layers=1):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width, padding_idx=PAD)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, ids):
        pad = ids == PAD
        hidden = self.encoder(self.embed(ids), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * keep).sum(1) / keep.sum(1))


def compute_loss(model, batch):
    ids, y = batch
    return nn.functional.cross_entropy(model(ids), y)


torch.manual_seed(0)
model = Classifier()
if args.ddp:
    model = nn.parallel.DistributedDataParallel(model)
elif args.fsdp:
    from torch.distributed.fsdp import fully_shard

    for layer in model.encoder.layers:
        fully_shard(layer)
    fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(Texts(), batch_size=args.batch_size, shuffle=False, collate_fn=collate)

if __name__ == "__main__":
    guard = None
    if args.guard:
        import autobatch

        sizes = [int(s) for s in args.sizes.split(",") if s]
        guard = autobatch.Guard(
            args.micro_batch,
            batch_size=args.batch_size,
            sizes=sizes,
            settings=autobatch.LadderSettings(grow_after=args.grow_after),
            events=args.events,
        )
    with open(args.step_log.replace("{rank}", str(rank)), "w") as log:
        for step, batch in enumerate(loader):
            if guard is not None:
                done = guard.step(model, optimizer, batch, compute_loss)
                record = {"step": step, "samples": done.samples, "micro_batch": done.micro_batch_size}
            else:
                ids, y = batch
                for start in range(0, len(ids), args.micro_batch):
                    part = (ids[start : start + args.micro_batch], y[start : start + args.micro_batch])
                    loss = compute_loss(model, part) * (len(part[0]) / len(ids))
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                record = {"step": step, "samples": len(ids), "micro_batch": args.micro_batch}
            log.write(json.dumps(record) + "\n")
            log.flush()
    if guard is not None:
        summary = guard.close()
        print(json.dumps({"steps": summary.steps, "events": len(summary.events), "peak": summary.peak_bytes}))
    state = (model.module if args.ddp else model).state_dict()
    if args.fsdp:  # every rank gathers the full parameters
        state = {name: value.full_tensor() for name, value in state.items()}
    if rank == 0 or RANKS:
        torch.save(state, args.out.replace("{rank}", str(rank)) if "{rank}" in args.out else args.out)
    if RANKS:
        dist.destroy_process_group()
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print("done", flush=True)
