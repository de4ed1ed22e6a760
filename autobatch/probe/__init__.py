"""Isolated probes: a long-lived probe server forks a fresh process for every probe.

``protocol`` holds the request and outcome records (JSON-able data, never pickled exceptions) and
``failures`` the one translation between exceptions and outcomes; ``ops`` is the registry of the
operations a probe process runs, ``worker`` the built-in ones (``probe``, ``inspect``); ``server`` is the
daemon, ``client`` the parent side. This layer knows no operation beyond its own: others register
themselves in modules the client names (``op_modules``).
"""
