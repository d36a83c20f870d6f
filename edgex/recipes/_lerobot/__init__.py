"""Shared by the LeRobot policy recipes (act, diffusion-policy, smolvla): importing LeRobot's own
policy code without its dataset / robot I/O dependencies, and reading its checkpoint layout.
Not a recipe itself (the leading underscore keeps the registry from looking for `facts.py`)."""
