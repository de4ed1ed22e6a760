"""Where the measurement scripts write: one page per script under ``docs/measurements/``.

Each script owns one or more marked blocks of its page (a block per kind of run: one example, one
workload, the busy or the quiet machine) and rewrites only those; the rest of the page (its
introduction, notes, earlier runs) is prose kept as written. A block starts with the run's command,
its date and the autobatch version that ran. Everything written is scrubbed of the machine it ran on:
paths under the repository become relative, the temporary folder becomes ``$TMPDIR`` and the home
folder ``~``, so that no page names a machine path; no page names a commit either (the version and the
date identify a run).

    from measurements import PAGES, run_header, update, command_line

    update(PAGES / "cache.md", "cache", [*run_header(command_line("cache_benchmark.py", argv)), "", *table],
           title="Re-runs from the cache")
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "measurements"
DATA = PAGES / "data"  # raw results a page is rendered from (JSON), scrubbed like the pages
EARLIER = "<!-- earlier runs -->"  # new blocks go above this line when a page has it

_MACHINE_PATH = re.compile(r"(?<![\w$~.\-])/(?:tmp|var/tmp|work|home|root)(?:/[^\s`'\"|)\],;]*)?")


def version(name: str = "autobatch-tuner") -> str:
    """An installed distribution's version ("not installed" when it is not), without importing it."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def autobatch_version() -> str:
    """autobatch's version, read from the source the scripts run (no torch import)."""
    text = (ROOT / "autobatch" / "records" / "version.py").read_text(encoding="utf-8")
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text)
    return found.group(1) if found else version()


def scrub(text: str) -> str:
    """``text`` without the paths of the machine it was made on."""
    roots = [(str(ROOT) + os.sep, ""), (str(ROOT), ".")]
    temp = os.path.realpath(tempfile.gettempdir())
    roots += [(temp + os.sep, "$TMPDIR/"), (tempfile.gettempdir() + os.sep, "$TMPDIR/")]
    home = str(Path.home())
    if home not in ("/", ""):
        roots.append((home + os.sep, "~/"))
    for prefix, replacement in roots:
        text = text.replace(prefix, replacement)
    return _MACHINE_PATH.sub(_other_path, text)


def _other_path(match: re.Match[str]) -> str:
    path = match.group(0)
    if path.startswith(("/tmp", "/var/tmp")):
        return "$TMPDIR" + path.split("tmp", 1)[1]
    # Another checkout of this repository (its tests/, examples/, scripts/): the path inside it.
    for top in ("tests", "examples", "scripts", "autobatch", "docs"):
        marker = f"/{top}/"
        if marker in path:
            return top + "/" + path.split(marker, 1)[1]
    return ".../" + path.rstrip("/").rsplit("/", 1)[-1]


def command_line(script: str, argv: Sequence[str]) -> str:
    """``python scripts/SCRIPT ARGS`` as it was run, scrubbed."""
    return scrub(shlex.join(["python", f"scripts/{script}", *argv]))


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def machine() -> str:
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
        f"{platform.platform()}, Python {platform.python_version()}"
    )


def run_header(command: str, *, date: str | None = None, extra: Iterable[str] = ()) -> list[str]:
    """The lines that head every run: its command, date, versions and machine."""
    return [
        f"- command: `{command}`",
        f"- date: {date or now()}",
        f"- autobatch {autobatch_version()}, torch {version('torch')}",
        f"- machine: {machine()}",
        *extra,
    ]


def _markers(key: str) -> tuple[str, str]:
    return f"<!-- measured: {key} -->", f"<!-- /measured: {key} -->"


def update(page: Path, key: str, lines: Sequence[str], *, title: str, intro: str = "") -> Path:
    """Write ``lines`` as the block ``key`` of ``page``: replaced where the page has it, else added (above
    the earlier runs when the page keeps any); a new page gets ``title`` and ``intro``."""
    start, end = _markers(key)
    block = "\n".join([start, *lines, end])
    block = scrub(block.rstrip("\n"))
    if page.is_file():
        text = page.read_text(encoding="utf-8")
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: block, text, count=1)
        elif EARLIER in text:
            text = text.replace(EARLIER, block + "\n\n" + EARLIER, 1)
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        head = [f"# {title}", ""] + ([intro, ""] if intro else [])
        text = "\n".join([*head, block]) + "\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    return page


def block(page: Path, key: str) -> str | None:
    """The text of block ``key`` of ``page`` (markers excluded), or None."""
    if not page.is_file():
        return None
    start, end = _markers(key)
    found = re.search(
        re.escape(start) + r"\n(.*?)\n?" + re.escape(end), page.read_text(encoding="utf-8"), re.S
    )
    return found.group(1) if found else None


def write_data(path: Path, text: str) -> None:
    """A raw result (JSON) beside the pages, scrubbed like them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scrub(text), encoding="utf-8")


def shown(path: Path) -> str:
    """A path as a page may name it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return scrub(str(path))


def run_autobatch(args: Sequence[str], env: dict[str, str], cwd: Path) -> tuple[float, float, dict[str, Any]]:
    """(wall seconds, CPU seconds of the command and every process it waited for, its JSON output) of
    ``python -m autobatch ARGS``; a failure ends the benchmark with the command's error."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "autobatch", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"autobatch {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return took, cpu, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {})
