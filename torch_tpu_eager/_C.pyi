# Type stub of the compiled extension (csrc/python/module.cpp): its functions are
# untyped for mypy; the Python wrappers that call them carry the types.
from typing import Any

def __getattr__(name: str) -> Any: ...
