"""The hardware floor: the least work a training step needs (floor.py) and a device's
measured rates (rates.py), which give the lowest time per step that device allows.
"""
