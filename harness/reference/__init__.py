"""The harness's own math: the array-module code that is the float64 oracle on NumPy, and the
float32 calibration run (NumPy) and CuPy's run.
"""
