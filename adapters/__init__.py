"""Framework adapters: one module per framework (torch_adapter, jax_adapter, and xp_adapter
for NumPy and CuPy), each with the functions of adapters/protocol.py `Adapter` and the
optional capabilities it has (a Protocol each there), checked for every adapter in
tests/test_adapters.py."""
