"""The modules of `benchmarks/suffix.py`: its specgen side (runs), llama.cpp's side (llama)
and the figures of repeated runs (stats). Not scripts: run the command."""
