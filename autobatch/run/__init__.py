"""A run as it happens: the probe session, the tuner, locks, step timing, and the tune of each device.

:class:`~autobatch.run.session.Session` owns a probe server on one device (journal, cache hits,
retries); :class:`~autobatch.run.tuner.Tuner` searches every combination through it and plans;
:mod:`~autobatch.run.calibrate` serves a stored result or tunes each device under its lock;
:mod:`~autobatch.run.check` is one probe at one batch size. Nothing here reads flags or prints: the
service (:mod:`autobatch.service`) resolves settings into a run, and the faces show it.
"""
