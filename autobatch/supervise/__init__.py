"""A training job run as it is, supervised from outside (``autobatch run``).

:mod:`~autobatch.supervise.job` launches one job in a session of its own, streams its output through,
forwards SIGTERM and SIGINT to its process group, measures its peak and says how it ended (an exit, an
out-of-memory failure read from its own traceback, the OOM killer, a signal); nothing it started outlives it.
The relaunch story (the plan, the smaller micro-batch, the evidence) is the service's:
:mod:`autobatch.service.relaunch`.
"""
