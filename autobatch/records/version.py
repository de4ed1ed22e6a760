"""The package version, where every layer can read it (the package's ``__init__`` re-exports it)."""

__version__ = "0.1.0"
