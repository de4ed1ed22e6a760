"""Where the daemon of this user on this node lives, and what it is.

One daemon per user per node: its socket, log, pid file and locks sit in a folder only the user can enter
(0700): ``$XDG_RUNTIME_DIR/autobatch``, else ``autobatch-daemon-UID`` in the node's temporary folder (``/tmp``,
whatever a job's ``TMPDIR`` says). The variable
``AUTOBATCH_DAEMON_DIR`` names another folder (tests, several daemons side by side). :func:`identity` is what a
client compares with the daemon's before it trusts an answer: the versions of autobatch and torch (torch's read from
its ``version.py``, so the client never imports torch), the interpreter and where autobatch is imported from.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

#: The folder of the daemon, when set (else the runtime folder).
DIR_ENV = "AUTOBATCH_DAEMON_DIR"


class Place(NamedTuple):
    """The daemon's folder and the files in it (a named tuple: the client imports it on every command, and
    importing dataclasses cost it 13 ms, a tenth of a cached command's answer through the daemon)."""

    folder: Path

    @classmethod
    def default(cls) -> Place:
        given = os.environ.get(DIR_ENV)
        if given:
            return cls(Path(given))
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if runtime and Path(runtime).is_dir():
            return cls(Path(runtime) / "autobatch")
        # the node's, whatever a job's TMPDIR says: one daemon per node
        from autobatch.records.node import node_temp

        return cls(node_temp() / f"autobatch-daemon-{os.getuid()}")

    @property
    def socket(self) -> Path:
        return self.folder / "daemon.sock"

    @property
    def log(self) -> Path:
        return self.folder / "daemon.log"

    @property
    def pid_file(self) -> Path:
        return self.folder / "daemon.pid"

    @property
    def warm(self) -> Path:
        """What the warm process's probe servers measured once for all of them (:func:`autobatch.probe.forked.kept`)."""
        return self.folder / "warm.json"

    @property
    def lock(self) -> Path:
        """Held by the running daemon for its whole life: the one-daemon guarantee, and how a socket is known stale."""
        return self.folder / "daemon.lock"

    @property
    def start_lock(self) -> Path:
        """Held by a client while it checks for a daemon and starts one: two clients never start two."""
        return self.folder / "start.lock"

    def make(self) -> None:
        """Create the folder, 0700; refuse one that another user owns or others may enter."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self.folder.stat()
        if info.st_uid != os.getuid():
            from autobatch.errors import DaemonError

            raise DaemonError(
                f"the daemon folder {self.folder} belongs to another user (uid {info.st_uid})",
                hint=f"set {DIR_ENV} to a folder of your own",
            )
        if info.st_mode & 0o077:
            os.chmod(self.folder, 0o700)


def identity() -> dict[str, str]:
    """What makes a daemon's answers valid for this client: a daemon whose identity differs is replaced."""
    from autobatch.records.version import __version__, torch_version

    return {
        "autobatch": __version__,
        "torch": torch_version(),
        "python": sys.executable,
        "package": str(Path(__file__).resolve().parents[1]),
    }
