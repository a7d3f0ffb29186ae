"""The math of verification, pure numpy: sampling transforms (sampling) and the acceptance rules (acceptance)."""
