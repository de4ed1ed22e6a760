"""A training script that keeps a scratch file as it imports, as libraries do (a cache, a lock), and notes the
folder it went to in the file ``RECORD_TO`` names (tests/daemon/test_daemon.py: a command through the daemon
keeps its client's temporary folder)."""

import os
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

with tempfile.NamedTemporaryFile(prefix="cache-") as scratch, open(os.environ["RECORD_TO"], "a") as record:
    record.write(os.path.dirname(scratch.name) + "\n")


def build_model():
    return nn.Linear(16, 4)


def make_batch(batch_size):
    return torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,))


def compute_loss(model, batch):
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)
