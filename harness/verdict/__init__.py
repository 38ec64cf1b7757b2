"""6. The verdict: the checks between runs, and the diagnosis of every
failing check.
"""
