"""4. The verdict: the calibration, the checks between runs, and the diagnosis of every
failing check.
"""
