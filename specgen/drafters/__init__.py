"""Drafters behind one interface (base): prompt lookup, the suffix index, draft models (same vocabulary or through text), trees, and the one function that builds any of them (build)."""
