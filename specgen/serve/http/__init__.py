"""The OpenAI-compatible HTTP face of the scheduler: the FastAPI app, the engine thread, the wire format, the metrics."""
