"""pd-twin: a digital twin of an LLM serving cluster."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pd-twin")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
