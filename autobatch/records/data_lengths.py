"""The lengths of a data set's sequences, in the order a loader reads them, from what a user has at hand.

A text file (one length per line), JSON Lines (a token-count field, or a list of token ids), one JSON array (of
lengths, token lists or such records: ``json.dump(lengths, f)``), or a Hugging Face data set saved with
``save_to_disk`` (a column, read through Arrow; ``datasets`` imported only then).
Every problem names the file, the line or the column, and the fix. The formats: docs/commands.md
(``lengths``). Nothing here imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autobatch.errors import UsageError

#: The fields of a JSON Lines record tried in order when no ``field`` is given.
FIELDS = ("length", "num_tokens", "n_tokens", "tokens", "seq_len", "input_ids")
#: The column of a saved data set read when no ``column`` is given.
COLUMN = "input_ids"
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
#: How many bad lines an error lists (it counts them all).
SHOWN = 5


@dataclass(frozen=True)
class DataLengths:
    """The lengths read, and where from: ``source`` has ``path``, ``format`` ("text" | "jsonl" | "json" |
    "datasets") and, by format, the ``field``, or the ``column`` and ``split``."""

    lengths: list[int]
    source: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        where = self.source.get("field") or self.source.get("column")
        split = f", split {self.source['split']}" if self.source.get("split") else ""
        return (
            f"{self.source['path']} ({self.source['format']}" + (f", {where}" if where else "") + f"{split})"
        )


def read_lengths(path: str | Path, *, field: str | None = None, column: str | None = None) -> DataLengths:
    """The lengths in ``path``: a saved data set when it is a folder, one JSON array, JSON Lines, or one length a
    line."""
    path = Path(path)
    if not path.exists():
        raise UsageError(
            f"no file or folder at {path}",
            hint="pass a file of one length a line, a JSON Lines file, or a data set saved with save_to_disk",
        )
    if path.is_dir():
        _refuse(field, "--field", "a JSON Lines file", "--column")
        return read_dataset(path, column or COLUMN)
    _refuse(column, "--column", "a data set saved with save_to_disk (a folder)", "--field")
    first = _first_line(path)
    if first.startswith("["):
        array = _json_array(path)
        if array is not None:
            return read_array(path, array, field)
    if path.suffix.lower() in JSONL_SUFFIXES or first.startswith("{"):
        return read_jsonl(path, field)
    _refuse(field, "--field", "a JSON Lines file", None)
    return read_text(path)


def _refuse(given: str | None, flag: str, applies_to: str, instead: str | None) -> None:
    if given is not None:
        raise UsageError(
            f"{flag} applies to {applies_to} only",
            hint=f"drop {flag}" + (f", or name the data's tokens with {instead}" if instead else ""),
        )


def _first_line(path: Path) -> str:
    return next((line.strip() for _, line in _lines(path) if line.strip()), "")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(number, line)`` from 1; a file that cannot be read or is not UTF-8 text is a usage error. A byte
    order mark, which Excel, pandas' ``encoding="utf-8-sig"`` and Windows editors put first, is not text."""
    try:
        with path.open(encoding="utf-8-sig") as lines:
            yield from enumerate(lines, 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", hint="check the path") from None
    except UnicodeDecodeError:
        raise UsageError(
            f"{path} is not UTF-8 text",
            hint="pass a text file of one length a line, JSON Lines, or a data set saved with save_to_disk",
        ) from None


class _Problems:
    """Bad lines (or items of an array), collected: the first few are shown, all are counted."""

    def __init__(self, path: Path, unit: str = "line") -> None:
        self.path = path
        self.unit = unit
        self.shown: list[str] = []
        self.count = 0

    def add(self, number: int, problem: str) -> None:
        self.count += 1
        if len(self.shown) < SHOWN:
            self.shown.append(f"{self.unit} {number}: {problem}")

    def raise_any(self, hint: str) -> None:
        if self.count:
            more = f"\n  ... and {self.count - len(self.shown)} more" if self.count > len(self.shown) else ""
            raise UsageError(
                f"{self.count} bad {self.unit}(s) in {self.path}:\n  " + "\n  ".join(self.shown) + more,
                hint=hint,
            )


def _empty(path: Path) -> UsageError:
    return UsageError(f"{path} holds no lengths", hint="pass the lengths of the data the job trains on")


def read_text(path: Path) -> DataLengths:
    """One length a line (blank lines skipped)."""
    lengths: list[int] = []
    problems = _Problems(path)
    for number, line in _lines(path):
        text = line.strip()
        if text.isdigit() and text.isascii():  # "12", never "-3", "1.5", "1e3" or other scripts' digits
            lengths.append(int(text))
        elif text:
            problems.add(number, f"expected a length (a whole number of tokens >= 0), found {text[:40]!r}")
    problems.raise_any("write one length a line, or pass JSON Lines (.jsonl) with a token-count field")
    if not lengths:
        raise _empty(path)
    return DataLengths(lengths, {"path": str(path), "format": "text"})


def read_jsonl(path: Path, field: str | None) -> DataLengths:
    """A token-count field of each JSON Lines record (``field``, or the first of :data:`FIELDS`)."""
    lengths: list[int] = []
    problems = _Problems(path)
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.add(number, f"not JSON ({exc.msg})")
            continue
        if not isinstance(record, dict):
            problems.add(number, f"expected a JSON object, found {type(record).__name__}")
            continue
        field = field or _default_field(path, number, record)
        found = _count(record.get(field), field in record)
        if isinstance(found, str):
            problems.add(number, f"{field}: {found}")
        else:
            lengths.append(found)
    problems.raise_any("each line is one object with the token count (or the token list) under --field NAME")
    if not lengths:
        raise _empty(path)
    return DataLengths(lengths, {"path": str(path), "format": "jsonl", "field": field})


def _json_array(path: Path) -> list[Any] | None:
    """The file as one JSON array, or None when it is JSON Lines (values on lines of their own: ``[1, 2]`` then
    ``[3]``), which :func:`read_jsonl` reads and names line by line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", hint="check the path") from None
    except UnicodeDecodeError:
        return None  # named by _lines, as for any file
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # a value and more after it: JSON Lines
            return None
        raise UsageError(
            f"{path} starts as a JSON array and is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            hint="write the lengths as one JSON array ([512, 1024, 300]), as JSON Lines, or one a line",
        ) from None
    return loaded if isinstance(loaded, list) else None


def read_array(path: Path, items: list[Any], field: str | None) -> DataLengths:
    """One JSON array: of lengths (``[512, 1024, 300]``), of token lists, or of records with a token-count field
    (``field``, or the first of :data:`FIELDS`), as ``json.dump`` writes a list."""
    if field is not None and not any(isinstance(item, dict) for item in items):
        _refuse(field, "--field", "records (JSON objects with a token-count field)", None)
    lengths: list[int] = []
    problems = _Problems(path, "item")
    for number, item in enumerate(items, 1):
        if isinstance(item, dict):
            field = field or _default_field(path, number, item, "item")
            found = _count(item.get(field), field in item)
            found = f"{field}: {found}" if isinstance(found, str) else found
        else:
            found = _count(item, True)
        if isinstance(found, str):
            problems.add(number, found)
        else:
            lengths.append(found)
    problems.raise_any(
        "each item is a length (a whole number of tokens >= 0), a list of tokens, or an object with the token count "
        "under --field NAME"
    )
    if not lengths:
        raise _empty(path)
    return DataLengths(lengths, {"path": str(path), "format": "json", **({"field": field} if field else {})})


def _default_field(path: Path, number: int, record: dict[str, Any], unit: str = "line") -> str:
    for name in FIELDS:
        if name in record:
            return name
    keys = ", ".join(list(record)[:10]) or "none"
    raise UsageError(
        f"{path} {unit} {number} has none of the fields {', '.join(FIELDS)} (its fields: {keys})",
        hint="name the field that holds the token count or the token list with --field NAME",
    )


def _count(value: Any, present: bool) -> int | str:
    """The length a field's value gives, or what is wrong with it."""
    if not present:
        return "missing"
    if isinstance(value, list):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return f"expected a whole number of tokens >= 0 or a list of tokens, found {json.dumps(value)[:40]}"


def read_dataset(folder: Path, column: str) -> DataLengths:
    """A column of a data set saved with ``save_to_disk``: integers, or token lists whose items are counted."""
    if not ((folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()):
        raise UsageError(
            f"{folder} is a folder, but not a data set saved with save_to_disk (no state.json or dataset_dict.json)",
            hint="pass the folder `dataset.save_to_disk(PATH)` wrote, a file of one length a line, or JSON Lines",
        )
    try:
        import datasets
    except ImportError:
        raise UsageError(
            f"{folder} is a Hugging Face data set, and reading it needs the `datasets` library, which is not "
            "installed",
            hint="pip install datasets",
        ) from None
    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as exc:  # noqa: BLE001 - a damaged folder raises anything; it is the user's file
        raise UsageError(
            f"cannot load the data set at {folder}: {type(exc).__name__}: {exc}",
            hint="pass the folder `save_to_disk` wrote, whole",
        ) from None
    split = None
    if isinstance(loaded, datasets.DatasetDict):
        split = _split(folder, list(loaded))
        loaded = loaded[split]
    if column not in loaded.column_names:
        raise UsageError(
            f"the data set at {folder} has no column {column!r} (its columns: {', '.join(loaded.column_names)})",
            hint="name the column of token lists or token counts with --column NAME",
        )
    lengths: list[int] = []
    for table in loaded.with_format("arrow").iter(batch_size=65536):
        lengths.extend(_arrow_lengths(table.column(column), folder, column))
    if not lengths:
        raise _empty(folder)
    return DataLengths(lengths, {"path": str(folder), "format": "datasets", "column": column, "split": split})


def _split(folder: Path, splits: list[str]) -> str:
    if "train" in splits or len(splits) == 1:
        return "train" if "train" in splits else splits[0]
    raise UsageError(
        f"the data set at {folder} has the splits {', '.join(splits)} and none is called train",
        hint=f"pass one split's folder: {folder / splits[0]}",
    )


def _arrow_lengths(values: Any, folder: Path, column: str) -> list[int]:
    """The lengths an Arrow column gives: its integers, or the length of each of its lists."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = values.type
    problem = None
    if values.null_count:
        problem = f"{values.null_count} empty (null) value(s)"
    elif pa.types.is_integer(kind):
        if len(values) and pc.min(values).as_py() < 0:
            problem = "a negative count"
        else:
            return list(values.to_pylist())
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return list(pc.list_value_length(values).to_pylist())
    else:
        problem = f"values of type {kind}, neither token counts nor token lists"
    raise UsageError(
        f"column {column!r} of the data set at {folder} holds {problem}",
        hint="tokenize the text first and pass the column of token ids (or of counts) with --column NAME",
    )
