"""Isolated probes: a long-lived probe server forks a fresh process for every probe.

``protocol`` holds the request and outcome records (JSON-able data, never pickled exceptions),
``worker`` runs inside the forked probe process, ``server`` is the daemon, ``client`` the parent side.
"""
