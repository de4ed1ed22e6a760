"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): the script stops at import when an
environment variable is missing, with sys.exit and a message (no argument parsing anywhere)."""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

DATA = os.environ.get("AUTOBATCH_TEST_DATA")
if not DATA:
    sys.exit("set AUTOBATCH_TEST_DATA to the folder of the training set")


def build_model():
    return nn.Linear(8, 2)


def make_batch(batch_size):
    return torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
