"""The identity of a step handed over as an object (the API's callables, the Lightning callback's module): a
digest that is the same in every process that builds the same step, so that a kernel restarted or a script run
again keys the same cache entry and probe journal.

An object's pickle is not such a digest: cloudpickle gives each class it carries by value (one defined in a
notebook or in ``__main__``) a random id per process, torch pickles a tensor's storage under its memory address,
and a set of strings comes out in the order of their hashes (seeded per process). Here tensors are pickled as
their dtype, shape, strides and (unless left out) a digest of their bytes, sets sorted, the class ids as their
order of appearance, and an :class:`Identified` object as the identity it states.
"""

from __future__ import annotations

import hashlib
import io
import sys
from typing import Any


class Identified:
    """An object that states what identifies it (:attr:`identity`) in place of its pickle: a Lightning module
    shipped to the probes as a copy is its class, structure and settings, not the random weights it was
    initialised with (which change at every run, and never change its memory)."""

    identity: str


def step_identity(found: Any, *, values: bool = True) -> str:
    """The digest of ``found``; ``values=False`` leaves the tensors' contents out (a model's initial weights)."""
    import cloudpickle
    from cloudpickle import cloudpickle as internals

    torch = sys.modules.get("torch")  # a step that holds tensors imported it

    class Identifying(cloudpickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, Identified):
                return ("identified", obj.identity)
            if isinstance(
                obj, (set, frozenset)
            ):  # in the order of their items' hashes, which vary for strings
                return (type(obj).__name__, tuple(sorted(obj, key=repr)))
            if torch is None or not isinstance(obj, torch.Tensor):
                return None
            shape = (type(obj).__name__, str(obj.dtype), obj.shape, obj.stride(), obj.requires_grad)
            if not values:
                return shape
            try:
                data = obj.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
            except Exception:  # noqa: BLE001 - sparse, meta, quantized: pickled as they are
                return None
            return (*shape, hashlib.sha256(data.tobytes()).hexdigest())

    out = io.BytesIO()
    Identifying(out).dump(found)
    payload = out.getvalue()
    ids = [
        i.encode()
        for i in list(getattr(internals, "_DYNAMIC_CLASS_TRACKER_BY_ID", {}))
        if i.encode() in payload
    ]
    for n, class_id in enumerate(sorted(ids, key=payload.find)):
        payload = payload.replace(class_id, f"{n:032x}".encode())
    return hashlib.sha256(payload).hexdigest()
