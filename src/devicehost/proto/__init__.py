"""The device plugin wire protocol: .proto sources and their committed generated code.

This is the only copy of the ``v1beta1`` generated code a process may import; backends never
import it (they speak in :mod:`devicehost.hookspecs` dataclasses).
"""
