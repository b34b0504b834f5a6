"""The demo app of `sasflow demo`: an e-commerce order workflow on simulated remote services.

It ships in the wheel so `sasflow demo` works on a fresh install; `examples/orders` runs the
same definitions as separate processes.
"""
