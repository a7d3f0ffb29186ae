"""The draft-verify loop: one generation's state machine and step planning (generation), its counters (stats), draft trees (tree)."""
