"""Shared by the LeRobot policy recipes (act, diffusion-policy, smolvla): importing LeRobot's own
policy code without its dataset / robot I/O dependencies, and reading its checkpoint layout.
Not a recipe itself (the leading underscore keeps the registry from looking for `facts.py`)."""

# What LeRobot's policy code imports and runs for every policy edgex builds from it (its modules,
# checkpoint configs through draccus, weights through safetensors, tensors reshaped by einops and
# accelerate's device utilities); each recipe adds its own (torchvision's ResNet, diffusers' DDIM ...).
LEROBOT_PACKAGES = ("lerobot", "draccus", "safetensors", "einops", "accelerate")
