"""Redzoned shadow buffers and the kernel writes run inside them."""
