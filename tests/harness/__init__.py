"""An independent fresh-process harness that checks autobatch's answers from outside (no autobatch import)."""
