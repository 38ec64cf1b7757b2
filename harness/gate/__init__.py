"""9. The gate: new records against a baseline."""
