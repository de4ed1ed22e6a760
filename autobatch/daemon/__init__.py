"""``autobatch serve``: the tuner as a daemon, one per user per node, reached over HTTP on a Unix socket.

* :mod:`~autobatch.daemon.place`: where the daemon lives (socket, log, pid, locks) and what it is (versions).
* :mod:`~autobatch.daemon.zygote`: the warm process (torch and autobatch imported, no CUDA context, one
  thread) every request's command is forked from.
* :mod:`~autobatch.daemon.server`: the HTTP server: peer credentials, limits, the requests and their queue.
* :mod:`~autobatch.daemon.client`: the command's side: start, reach, run through, stop (no torch import).
* :mod:`~autobatch.records.daemon_events`: what a command forked by the daemon tells it (which device lock it waits
  for or holds), for ``autobatch daemon status``.

Design and decisions: docs/daemon.md.
"""
