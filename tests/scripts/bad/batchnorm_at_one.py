"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): a convolutional net with a BatchNorm1d
in its head, on 768x768 images. Under 750 MiB on the CPU device batch 2 runs out of memory, and batch 1 fails
in BatchNorm ("Expected more than 1 value per channel when training"): no batch both fits and runs."""

import torch
import torch.nn.functional as F
from torch import nn


def build_model():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def make_batch(batch_size):
    return torch.randn(batch_size, 3, 768, 768), torch.randint(0, 10, (batch_size,))


def compute_loss(model, batch):
    images, labels = batch
    return F.cross_entropy(model(images), labels)
