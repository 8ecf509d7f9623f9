"""Backends shipped with orchestra (installed as ``orchestra.backends``)."""
