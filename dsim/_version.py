"""The package version, in one place: pyproject reads it (dynamic), the package and manifests import it."""
__version__ = "0.1.0"
