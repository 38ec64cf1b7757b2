"""What every room uses: the harness's errors, its names (adapters, devices, precisions, run keys,
cells, verdicts), atomic file writes, and git.
"""
