"""Policies shipped with orchestra (installed as ``orchestra.policies``)."""
