"""The pallas back end: tile programs (`codegen/tiles/`) lowered to Pallas kernels
(`lower.py`), run by `run.py`; every call into Pallas is in `api.py`."""
