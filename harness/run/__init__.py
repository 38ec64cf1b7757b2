"""3. The run: one spec through the adapters, job by job, each in a fresh process, timed
phase by phase, with finished jobs kept in a work folder.
"""
