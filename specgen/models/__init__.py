"""Where models come from: the catalog and resolution (registry), the hub, PyPI packages, and the vocabulary check."""
