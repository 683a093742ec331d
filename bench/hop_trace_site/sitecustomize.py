"""Loads `bench/hop_trace.py` into every Python process started with this folder on PYTHONPATH, when
HOP_TRACE_DIR is set (`bench/proxy_extra.py --trace`); does nothing otherwise."""

import os

if os.environ.get("HOP_TRACE_DIR"):
    import importlib.util
    import sys

    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hop_trace.py")
    _spec = importlib.util.spec_from_file_location("hop_trace", _path)
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["hop_trace"] = _module
    _spec.loader.exec_module(_module)
    _module.install()
