# Loads the torchvision shim in every process of the sweep (PYTHONPATH=<sweep>/site).
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import tvshim  # noqa: F401
except Exception as e:  # never break interpreter start
    sys.stderr.write(f"tvshim: {e}\n")
