"""5. The calibration: the runs that measure how far rounding alone carries a spec
(harness/calibrate/roles.py), put back together into the spreads that set every tolerance
(harness/calibrate/calibration.py, harness/calibrate/spread.py).
"""
