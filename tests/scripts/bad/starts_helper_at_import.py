"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): the script starts a helper process in
its own session at import (a log shipper, say) and writes its pid to the file HELPERS_PID_FILE names (outside
the working folder, which probes do not write into). Before the probe server reaped what its probes start, the
helper outlived the tune, once for every import."""

import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn

helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(os.environ.get("HELPERS_PID_FILE", "helpers.txt"), "a") as pids:
    pids.write(f"{helper.pid}\n")


def build_model():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def make_batch(batch_size):
    return torch.randn(batch_size, 32), torch.randint(0, 4, (batch_size,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
