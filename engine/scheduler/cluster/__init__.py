"""The schedule cluster: scheduler registration, fencing, and who holds which schedule."""
