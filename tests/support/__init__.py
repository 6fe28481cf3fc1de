"""Helpers shared by the test rooms (tests/sources, tests/kernels, ...): pytest.ini puts tests/ on
sys.path, so a test imports them as ``from support.protobuf import field``."""
