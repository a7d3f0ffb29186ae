"""`specgen serve`: an OpenAI-compatible HTTP server in front of specgen.serving.

setup   opens the models and builds the continuous-batching Server
loop    the engine thread that owns the Server; futures for the HTTP side
schema  request validation → Job; OpenAI response, chunk and error shapes
metrics counters and histograms in Prometheus text format
app     the FastAPI application (endpoints, auth, body limit, streaming)
"""
