"""How much to draft: fixed and heuristic draft lengths (base), the cost policy (cost) over the run's cost estimates (estimates), and the shared-step gate of a server (stepgate)."""
