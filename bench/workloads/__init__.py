"""The workloads of bench/run.py, one module each (W1 and W2 share their forms)."""
