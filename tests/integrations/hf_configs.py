"""Tiny Hugging Face configs, written by the tests from transformers' config classes (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def gpt2(folder: Path, **overrides: Any) -> Path:
    """A two-layer GPT-2-style causal LM config; returns its folder."""
    from transformers import GPT2Config

    values = dict(
        n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=128, bos_token_id=0, eos_token_id=0
    )
    GPT2Config(**{**values, **overrides}).save_pretrained(folder)
    return folder


def bert(folder: Path, **overrides: Any) -> Path:
    """A two-layer BERT-style sequence classifier config (three labels); returns its config.json."""
    from transformers import BertConfig

    values = dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, vocab_size=512,
        max_position_embeddings=128, num_labels=3, architectures=["BertForSequenceClassification"],
    )  # fmt: skip
    BertConfig(**{**values, **overrides}).save_pretrained(folder)
    return folder / "config.json"
