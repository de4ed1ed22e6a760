"""A guarded batch: how many samples it holds, and its micro-batches.

The guard takes a batch as a training loop has it (a tensor, or tuples, lists, namedtuples and dicts of tensors,
with lists of the samples' own items as the default collate or a collate of one tensor a sample leaves them, or
itself such a list) and
splits it along the samples. One reading decides both the batch's samples (:func:`samples`) and what is sliced
(:func:`split`), so the two never disagree; a batch whose parts disagree on their samples is refused. The split
is even (:func:`bounds`): a micro-batch of 1 sample, which BatchNorm refuses in training, only where it cannot be
helped. Usage: docs/guard.md ("The batch", "The split").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from autobatch.errors import UsageError

if TYPE_CHECKING:
    import torch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    import torch

    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from _tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _tensors(value)


def samples(batch: Any) -> int:
    """The batch's samples, read as :func:`split` reads the batch: the ``n`` for which every tensor outside the
    samples' own lists has ``n`` rows and every such list ``n`` items. The candidates come shallowest first (a
    dict's tensors before a list's items), so a dict whose first value is a list of tensors of the samples' own
    lengths still counts its samples, not the first one's tokens. Parts that disagree (a label per token
    flattened over the batch beside a list of the samples) are refused, naming them: no split fits them.

    The batch itself, a list or tuple, is a container of fields when its tensors share their first dimension:
    ``[x, y]`` of 16 rows each is a batch of 16, not 2, whatever their kinds (the default collate returns a tuple
    sample's fields as such a list). It is a list of samples, as many as its items, when its items are not all
    batched (the default collate's strings beside tensors) or when they are tensors of one kind (one dtype, one
    number of dimensions) whose first dimensions differ: a collate that returns the samples as they are
    (``collate_fn=list`` over token tensors of their own lengths) gives N tensors, N samples. Samples of one kind
    that happen to share their first dimension (every sequence cut to one length, RGB images ``[3, H, W]``) cannot
    be told from fields there and read as fields: stack them, or pass them beside a tensor with a row a sample
    (``(docs, labels)``), where a list of one kind is read as samples (:func:`per_sample`)."""
    found = _candidates(batch)
    if not found:
        raise UsageError(
            "the guard found no tensor with a batch dimension in the batch",
            hint="pass a tensor, or tuples, lists or dicts of tensors whose first dimension is the sample",
        )
    for n in found:
        if all(size == n for _, size in _parts(batch, n, whole=True)):
            return n
    n = found[0]
    parts = _parts(batch, n, whole=True)
    agree = _describe([part for part in parts if part[1] == n])
    rest = _describe([part for part in parts if part[1] != n])
    raise UsageError(
        f"the batch's parts disagree on their number of samples (a tensor's first dimension, a list's items): "
        f"{agree or 'none'} against {rest}; the guard cannot split it into micro-batches",
        hint="give every tensor of the batch the samples as its first dimension (a label per token as "
        "[samples, tokens], padded, not flattened over the batch), keep a sample's own items in a list of one "
        "item a sample, and pass what is not per sample (a constant) to loss_fn outside the batch",
    )


def _describe(parts: list[tuple[str, int]]) -> str:
    """Parts and their sizes for a message, the items of one list as one entry: ``batch['tokens'] (16 items of
    40, 23, 18, 28, ...)``."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for where, size in parts:
        stem, _, index = where.rpartition("[")
        groups.setdefault(stem if index[:-1].isdigit() else where, []).append((where, size))
    said = []
    for stem, members in groups.items():
        if len(members) == 1:
            said.append(f"{members[0][0]} {members[0][1]}")
        else:
            sizes = [str(size) for _, size in members]
            said.append(
                f"{stem} ({len(sizes)} items of {', '.join(sizes[:4])}{', ...' if len(sizes) > 4 else ''})"
            )
    return ", ".join(said)


def _candidates(batch: Any) -> list[int]:
    """The sizes the batch's samples may be, most likely first: the first dimension of its tensors, shallowest
    first (in a dict, then in a list inside it), then the lengths of its lists but the batch's own."""
    import torch

    tensors: list[tuple[int, int]] = []  # (depth, rows)
    lengths: list[int] = []

    def walk(value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            if value.dim() > 0:
                tensors.append((depth, int(value.shape[0])))
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item, depth)
        elif isinstance(value, tuple) and hasattr(value, "_fields"):
            for item in value:
                walk(item, depth)
        elif isinstance(value, (list, tuple)):
            if value is not batch:  # the batch itself, (ids, labels), is a container, not 2 samples
                lengths.append(len(value))
            for item in value:
                walk(item, depth + 1)

    walk(batch, 0)
    ordered = [rows for _, rows in sorted(tensors, key=lambda pair: pair[0])] + lengths
    if _own_shapes(batch):  # the batch itself a list of samples: its length, whatever their rows
        ordered.append(len(batch))
    return list(dict.fromkeys(ordered))


def _own_shapes(batch: Any) -> bool:
    """Whether the batch itself is a list (or tuple) of the samples' own tensors: tensors all of one kind (one dtype,
    one number of dimensions) whose first dimensions differ, as a collate that returns the samples as a list leaves
    them (``collate_fn=list`` over token tensors of their own lengths). Fields of a batch share their first
    dimension, the batch's samples: ``[x, y]`` of 16 rows each is a batch of 16, and so is any list of tensors that
    agree on it."""
    if not isinstance(batch, (list, tuple)) or hasattr(batch, "_fields") or not _alike_tensors(batch):
        return False
    return batch[0].dim() > 0 and len({int(t.shape[0]) for t in batch}) > 1  # type: ignore[union-attr]


def _parts(value: Any, n: int, where: str = "batch", whole: bool = False) -> list[tuple[str, int]]:
    """What :func:`split` would slice for ``n`` samples, with its size: every tensor with a first dimension outside
    the samples' own lists (its rows) and every such list (its items), each named by where it is (``whole``: the
    value is the batch itself)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [(where, int(value.shape[0]))] if value.dim() > 0 else []
    if isinstance(value, Mapping):
        return [part for key, item in value.items() for part in _parts(item, n, f"{where}[{key!r}]")]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return [
            part
            for name, item in zip(value._fields, value, strict=True)
            for part in _parts(item, n, f"{where}.{name}")
        ]
    if per_sample(value, n, whole=whole):
        return [(where, len(value))]
    if isinstance(value, (list, tuple)):
        return [part for i, item in enumerate(value) for part in _parts(item, n, f"{where}[{i}]")]
    return []


def shapes(batch: Any) -> list[list[int]]:
    return [list(t.shape) for t in _tensors(batch)]


def bounds(n: int, size: int) -> list[tuple[int, int]]:
    """The micro-batches of ``n`` samples at most ``size`` each, as (start, stop): as few as ``size`` allows, of
    sizes that differ by at most one (10 at 4: 4, 3, 3, not 4, 4, 2; 9 at 8: 5, 4, not 8, 1). A micro-batch of 1
    sample comes only when it cannot be helped (3 at 2, or ``size`` 1): a lone last sample would train
    BatchNorm on one value per channel, which it refuses."""
    count = -(-n // size)
    base, extra = divmod(n, count)
    edges = [0]
    for i in range(count):
        edges.append(edges[-1] + base + (1 if i < extra else 0))
    return list(pairwise(edges))


def split(batch: Any, size: int, n: int | None = None) -> Iterator[Any]:
    """The batch in micro-batches of at most ``size`` samples (:func:`bounds`: even, as few as fit): every tensor
    whose first dimension is the batch's (``n``, :func:`samples` when not given) is sliced, and so is every list of
    the samples' own items (:func:`per_sample`); other values are passed to every micro-batch unchanged."""
    n = samples(batch) if n is None else n
    for start, stop in bounds(n, size):
        yield _slice(batch, n, start, stop, whole=True)


def _slice(batch: Any, n: int, start: int, stop: int, whole: bool = False) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() > 0 and batch.shape[0] == n else batch
    if isinstance(batch, Mapping):
        return {key: _slice(value, n, start, stop) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_slice(value, n, start, stop) for value in batch))
    if per_sample(batch, n, whole=whole):
        return batch[start:stop]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice(value, n, start, stop) for value in batch)
    return batch


def per_sample(value: Any, n: int, *, whole: bool = False) -> bool:
    """True for a list or tuple of the samples' own items: as many as the batch's ``n`` samples, and either not all
    of them batched themselves (the default collate leaves strings, names and paths, and tensors of their own sizes
    so) or, inside the batch, tensors all of one kind (one dtype, one number of dimensions), as a collate lists
    each sample's tokens: those whose lengths all happen to be ``n`` are still one a sample. A container of
    batched values of different kinds, ``[ids, labels]``, is not one even when the batch has 2 samples, and
    neither is the batch itself (``whole``), ``(inputs, targets)``, when its values are all batched (the batch's
    own list of tensors of one kind counts as its samples only when their first dimensions differ, :func:`samples`:
    then they are not all batched)."""
    if not isinstance(value, (list, tuple)) or hasattr(value, "_fields") or len(value) != n:
        return False
    return not all(_batched(item, n) for item in value) or (not whole and _alike_tensors(value))


def _alike_tensors(values: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every value is a tensor of the first one's dtype and number of dimensions (one kind of thing)."""
    import torch

    first = values[0] if values else None
    if not isinstance(first, torch.Tensor):
        return False
    return all(
        isinstance(value, torch.Tensor) and value.dtype == first.dtype and value.dim() == first.dim()
        for value in values
    )


def _batched(value: Any, n: int) -> bool:
    """Whether ``value`` carries the batch's dimension: a tensor of ``n`` rows, a list of ``n`` items, or a
    container of one."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.dim() > 0 and value.shape[0] == n
    if isinstance(value, Mapping):
        return any(_batched(item, n) for item in value.values())
    if isinstance(value, (list, tuple)):
        return len(value) == n or any(_batched(item, n) for item in value)
    return False


__all__ = ["bounds", "per_sample", "samples", "shapes", "split"]
