"""The one layer over llama-cpp-python (engine.llama) and the machine's measured pass costs (engine.costs)."""
