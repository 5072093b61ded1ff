"""The advantage library: grouped whitening, advantages (GAE, group-relative), losses.

Depends on torch, numpy and (optionally) numba only: never on configuration, algorithms or
run tooling, so it can be used on its own.
"""
