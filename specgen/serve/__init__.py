"""`specgen serve`: the scheduler (continuous batching over slots), the prompt store, the models it serves (setup), and its HTTP face (http)."""
