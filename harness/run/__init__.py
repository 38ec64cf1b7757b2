"""3. The run: one spec through the adapters, cell by cell, each in a fresh process, timed
phase by phase, with finished cells kept in a work folder.
"""
