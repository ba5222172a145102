"""pdjit's version: a leaf module (every layer may read it without importing the others)."""
__version__ = "0.1.0"
