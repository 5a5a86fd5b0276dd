"""The node agent's rules (pure): the node's health from its ECC counts."""
