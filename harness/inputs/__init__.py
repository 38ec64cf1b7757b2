"""2. The inputs: the framework-neutral data, initial weights and batch order of a spec, made
once in NumPy and handed to every adapter, with the limits checked before they are built.
"""
