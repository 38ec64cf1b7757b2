"""3. The run: one spec through one adapter on one device, timed phase by phase
(runner.py), re-anchored from the oracle's states along the way (anchored.py), with its
progress shown (progress.py).
"""
