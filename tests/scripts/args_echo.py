"""Fixture: a valid tiny script configured by its own arguments (those after ``--`` on autobatch's line).

It reads ``--width`` from ``sys.argv[1:]`` at import time and exposes ``WIDTH`` (the model's width) and
``ARGV`` (its whole argument list). If the environment variable ARGS_ECHO_FILE is set, importing it also
writes ``{"argv": [...], "width": N}`` as JSON to that file, so that a test can see from outside which
arguments a probe process handed to the script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

_parser = argparse.ArgumentParser(allow_abbrev=False)
_parser.add_argument("--width", type=int, default=8)
_args, _unknown = _parser.parse_known_args(sys.argv[1:])

ARGV = list(sys.argv[1:])
WIDTH: int = _args.width

_echo_file = os.environ.get("ARGS_ECHO_FILE")
if _echo_file:
    with open(_echo_file, "w", encoding="utf-8") as _file:
        json.dump({"argv": ARGV, "width": WIDTH}, _file)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 2))


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch_size, WIDTH, generator=generator)
    labels = torch.randint(0, 2, (batch_size,), generator=generator)
    return features, labels


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return F.cross_entropy(model(features), labels)
